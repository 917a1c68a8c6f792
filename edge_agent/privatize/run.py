"""`edge-agent privatize FILE` below the command line: stream lines -> privatized records
(JSONL), or post them; takes a :class:`~edge_agent.privatize.options.PrivatizeOptions`.

Streaming: lines are read in batches (16, 32, ... up to the batch size), each batch is
privatized in one mechanism call, charged to the device ledger (``edge_agent.privatize.charging``),
and written (and flushed) as whole lines before the next is read. A bad line stops the run
with one message naming it; every record before it has been written.
"""

from __future__ import annotations

import io
import sys
import time

import orjson

from edge_agent.errors import BudgetRefused, CliError, UsageError, info, warn
from edge_agent.privatize.batches import Prepared, privatized, tokenized
from edge_agent.privatize.charging import RunBudget
from edge_agent.privatize.files import Output, open_input, refuse_output_on_input
from edge_agent.privatize.lines import LineReader
from edge_agent.privatize.options import PrivatizeOptions
from edge_agent.privatize.pipeline import ahead
from edge_agent.privatize.run_setup import check_model, make_privatizer
from edge_agent.service.connect import make_client, resolve_bundle
from shared.accounting import summary
from shared.payload import parse_payload


def run(opts: PrivatizeOptions) -> int:
    t0 = time.perf_counter()
    opts.check()
    if opts.mechanism.seed is not None:
        warn("--seed makes the noise predictable: anyone who knows the seed can remove the "
             "protection; use it for experiments only")
    stream, size = open_input(opts.file)
    try:
        refuse_output_on_input(stream, opts.file, opts.output)
        out = None if opts.ledger.dry_run else Output(opts.output)
        return _run(opts, stream, size, out, t0)
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def _second_pass(opts: PrivatizeOptions, stream, size: int | None):
    """(stream to plan from, stream to privatize from, size): a regular file is opened
    again; other input (a pipe, stdin) is read whole into memory first."""
    if size is not None:
        return open_input(opts.file)[0], stream, size
    data = b"".join(stream)
    return io.BytesIO(data), io.BytesIO(data), len(data)


def _run(opts: PrivatizeOptions, stream, size, out: Output | None, t0: float) -> int:
    import numpy as np

    m = opts.mechanism
    client = make_client(opts.server, opts.post.batch) if opts.server.server else None
    early = (lambda model: check_model(model, m.name, m.params())) \
        if opts.post.mode == "predict" else None
    made = []  # the privatizer, made once the bundle is verified and before it is pinned
    bundle, model = resolve_bundle(opts.server, client, early,
                                   lambda b, mod: made.append(make_privatizer(opts, b, mod)))
    mech, priv = made[0]
    model_id = opts.server.model
    if opts.post.mode == "predict":
        if not model_id and model is not None:
            model_id = str(model.get("id"))
        check_model(model or {}, priv.name, priv.params)
    rng = np.random.default_rng(m.seed) if m.seed is not None else None
    if m.mixes and (m.num_labels or 2) < 2:
        raise UsageError(f"--num-labels must be an integer >= 2, got {m.num_labels}")
    minimum = m.mixed
    budget = RunBudget(opts, priv, bundle)
    try:
        if opts.ledger.dry_run or budget.capped:
            planned, stream, size = _second_pass(opts, stream, size)
            try:
                first = LineReader(planned, tsv=opts.input.tsv, header=opts.input.header)
                plan = budget.plan(tokenized(opts, priv, first, b)
                                   for b in first.batches(opts.input.batch_size, minimum))
            finally:
                planned.close()
            if opts.ledger.dry_run:
                print(budget.describe(plan))
                return 0
            budget.check(plan)  # refused (exit 3) before anything is written or sent
        assert out is not None
        counts = _stream(opts, priv, client, budget, model_id, stream, size, out, rng,
                         minimum)
        n_records, n_tokens, n_public, n_trunc, n_skipped, t_first, t_loop, cpu_streaming = counts
        t_end = time.perf_counter()
        elapsed, setup, streaming = t_end - t0, t_loop - t0, t_end - t_loop
        # the one-line summary needs eta and the table's worst case, not neighbour medians
        g = mech.guarantee(bundle, sample=100)
        info(f"{n_records} records, {n_tokens} tokens in {elapsed:.2f} s (setup {setup:.2f} s, "
             + (f"first record at {t_first:.2f} s, " if t_first is not None else "")
             + f"{n_tokens / max(streaming, 1e-9):,.0f} tokens/s streaming, "
             f"{n_tokens / max(cpu_streaming, 1e-9):,.0f} tokens per CPU second); "
             f"{n_skipped} empty line(s) skipped; {n_trunc} truncated; "
             # a sentence's worst case over the tokens it privatizes (a token policy's
             # public words are counted apart, as the ledger counts them)
             f"{summary(g, (n_tokens - n_public) / n_records if n_records else None)}; "
             f"{priv.trust.note()}; "
             + budget.summary()
             + ("; WEAK PRIVACY (--allow-weak-privacy): the output is close to the raw text"
                if priv.weak_privacy else ""))
        return 0
    finally:
        budget.close()


def _stream(opts, priv, client, budget, model_id, stream, size, out, rng, minimum):
    """Read, privatize, charge and write (or post) every batch; the counts for the summary."""

    t0 = time.perf_counter()
    bar = None
    if sys.stderr.isatty() and opts.input.progress:
        from tqdm import tqdm

        bar = tqdm(total=size, unit="B", unit_scale=True, file=sys.stderr, desc="privatize")
    reader = LineReader(stream, tsv=opts.input.tsv, header=opts.input.header)
    n_records = n_tokens = n_public = n_trunc = n_skipped = 0
    t_first = None
    ok = False
    t_loop, c_loop = time.perf_counter(), time.process_time()
    batches = reader.batches(opts.input.batch_size, minimum)
    prepared = ahead(ahead(batches, lambda b: tokenized(opts, priv, reader, b)),
                     lambda ready: privatized(opts, priv, ready, rng))
    post = opts.post.mode
    try:
        for ready in prepared:
            try:
                lines = _emit(opts, priv, client, budget, model_id, ready)
            except BudgetRefused as exc:  # a concurrent run spent meanwhile: stop here
                raise BudgetRefused(f"{exc}; {n_records} record(s) before it were "
                                    + ("uploaded and written" if post == "records"
                                       else "written")) from None
            except _PostFailed as exc:  # keep what the server answered before the failure
                out.write(exc.lines)
                n_records += len(exc.lines)
                # the server's ledger refused: exit 3, as the device's own cap does
                refused = getattr(exc.error, "type", None) == "urn:privbert:problem:" \
                    "budget-exhausted"
                raise (BudgetRefused if refused else CliError)(f"{exc}; {n_records} record(s) before it were "
                               + ("uploaded and written" if post == "records"
                                  else "written")) from None
            try:
                out.write(lines)
            except CliError as exc:
                if post == "records":  # the server has them; say which lines
                    first, last = ready.lines[0].number, ready.lines[-1].number
                    raise CliError(f"{exc}; the records of lines {first}-{last} were "
                                   "uploaded but their ids not written") from None
                raise
            if ready.items and t_first is None:
                t_first = time.perf_counter() - t0
            n_records += len(ready.items)
            n_tokens += sum(it.n_tokens for it in ready.items)
            n_public += sum(priv.public_count(it) for it in ready.items)
            n_trunc += sum(it.truncated for it in ready.items)
            n_skipped += ready.n_skipped
            if bar is not None:
                bar.update(ready.nbytes)
            if ready.error is not None:
                raise CliError(f"{ready.error}; {n_records} record(s) before it were written")
        ok = True
    finally:
        prepared.close()  # stops the worker: nothing is privatized past an error
        if bar is not None:
            bar.close()
        out.close(ok)
        for message in reader.label_warnings():
            warn(message)
    cpu_streaming = time.process_time() - c_loop
    return n_records, n_tokens, n_public, n_trunc, n_skipped, t_first, t_loop, cpu_streaming


def _payloads(opts: PrivatizeOptions, priv, ready: Prepared) -> tuple[list, list | None]:
    """The payloads of a privatized batch and their labels (None: unlabelled)."""
    if ready.data is None:  # TextHide k > 1: whole records with mixed labels
        return [r.payload for r in ready.objs], [r.label for r in ready.objs]
    labels = [ln.label for ln in ready.lines] if opts.input.tsv else None
    return priv.payloads(ready.items, ready.data), labels


def record_json(payload: bytes, label) -> bytes:
    """The JSON of ``shared.payload.Record`` around a payload's JSON, as orjson writes
    ``Record.model_dump(exclude_none=True)`` (tests/edge_agent check they agree)."""
    if label is None:
        return b'{"payload":' + payload + b"}"
    return b'{"payload":' + payload + b',"label":' + orjson.dumps(label) + b"}"


class _PostFailed(Exception):
    """A request of --post failed; ``lines`` are the output lines of what the server
    answered before it (predictions, or ids of stored records)."""

    def __init__(self, error: Exception, lines: list[bytes]):
        super().__init__(str(error))
        self.error = error
        self.lines = lines


def _emit(opts, priv, client, budget: RunBudget, model_id, ready: Prepared) -> list[bytes]:
    """The output lines of one privatized batch: charged first (memoized texts get their
    stored payload), then posted with --post."""
    if not ready.items:
        return []
    if (not opts.post.mode and opts.format == "jsonl" and ready.data is not None
            and priv.tokens):  # the same bytes, one validated template a batch
        rows = priv.token_rows(ready.items, ready.data,
                               [ln.label for ln in ready.lines] if opts.input.tsv else None)
        return rows.lines(budget.charge_rows(ready.lines, ready.items, rows))  # charged before written
    payloads, labels = _payloads(opts, priv, ready)
    # orjson on the model's plain-Python dump: the same JSON as model_dump_json, several
    # times faster on the large base64 strings of dchi-embedding (tests/edge_agent check they agree)
    fresh = [orjson.dumps(p.model_dump(exclude_none=True)) for p in payloads]
    sent = budget.charge(ready.lines, ready.items, payloads, fresh)  # committed before anything leaves
    labels = labels if labels is not None else [None] * len(sent)
    lines = ready.lines
    if opts.post.mode:
        # lazy: httpx, only when posting
        from edge_agent.service.client import ApiError

        def out(answers: list, key: str | None) -> list[bytes]:
            return [orjson.dumps({"line": ln.number, **({key: a} if key else a)}) + b"\n"
                    for ln, a in zip(lines, answers, strict=False)]

        records = opts.post.mode == "records"
        key = "id" if records else None
        try:
            answers = (client.post_records(opts.post.task, [
                record_json(p, lab) for p, lab in zip(sent, labels, strict=True)])
                if records else client.predict(model_id, sent))
        except ApiError as exc:
            raise _PostFailed(exc, out(exc.partial, key)) from None
        return out(answers, key)
    if opts.format == "text":

        return [_as_text(priv, p if j is f else parse_payload(j), ln).encode("utf-8")
                for p, f, j, ln in zip(payloads, fresh, sent, lines, strict=True)]
    return [record_json(p, lab) + b"\n" for p, lab in zip(sent, labels, strict=True)]


def _as_text(priv, payload, line) -> str:
    ids = payload.data_array().tolist()
    segs = payload.segments or [len(ids)]
    parts, start = [], 0
    for n in segs:
        parts.append(priv.tokenizer.decode(ids[start : start + n]))
        start += n
    if line.label is not None:
        parts.append(str(line.label))
    return "\t".join(parts) + "\n"
