"""`edge-agent privatize FILE`: stream lines -> privatized records (JSONL), or post them.

Streaming: lines are read in batches (16, 32, ... up to --batch-size), each
batch is privatized in one mechanism call and written (and flushed) as whole
lines before the next is read. A bad line stops the run with one message
naming it; every record before it has been written.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from edge_agent.cli import (
    MECHANISMS,
    CliError,
    UsageError,
    add_bundle_args,
    info,
    make_client,
    resolve_bundle,
    warn,
)
from edge_agent.files import Output, open_input, refuse_output_on_input
from edge_agent.texthide_key import KEY_ENV, MAKE_ONE, resolve_key

# flags that configure each mechanism; any other mechanism flag given is a usage error
_FLAGS = {
    "dchi-text": {"eta"},
    "dchi-embedding": {"eta", "float16"},
    "laplace": {"epsilon", "calibration", "word_dropout"},
    "ome": {"epsilon", "lam"},
    "texthide": {"m", "k", "texthide_key", "texthide_seed", "num_labels"},
    "none": {"allow_none"},
}
_ALL_FLAGS = set().union(*_FLAGS.values())

EPILOG = """\
input: one record per line (UTF-8). With --tsv: text<TAB>label or text_a<TAB>text_b<TAB>label
  (a first line whose last column is "label" is a header and skipped, see --header).
output: one JSON record per line, {"payload": {...}, "label": ...} (shared.payload.Record);
  no label field without labels. --format text prints privatized text (dchi-text only).
policies: empty lines are skipped and counted (--empty error refuses them); a text longer
  than the model's limit (max_length - 2 word pieces, - 3 for a pair) keeps its first
  word pieces, a pair trims its longer segment first (--truncate error refuses it).
  A bad line stops the run with one message naming it; records before it are kept.
randomness: fresh OS entropy for every batch. --seed makes runs reproducible and the
  noise predictable: anyone who knows the seed can remove the protection.
texthide key: the secret mask pool comes from --texthide-key (or $PRIVBERT_TEXTHIDE_KEY),
  at least 32 hex digits (128 bits); without one, each run draws a new pool. Make one with:
    """ + MAKE_ONE + "\n"


def register(sub) -> None:
    p = sub.add_parser("privatize", help="privatize text, one record per line",
                       description="Privatize text on this device; only payloads leave it.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE", help="input file, one record per line; - for stdin")
    p.add_argument("--tsv", action="store_true",
                   help="text<TAB>label or text_a<TAB>text_b<TAB>label")
    p.add_argument("--header", choices=("auto", "yes", "no"), default="auto",
                   help="TSV header line: auto = skipped when its last column is 'label'")
    p.add_argument("-o", "--output", metavar="OUT.jsonl", help="output file (default stdout)")
    p.add_argument("--format", choices=("jsonl", "text"), default="jsonl",
                   help="jsonl records (default) or, for dchi-text, the privatized text")
    m = p.add_argument_group("mechanism")
    m.add_argument("--mechanism", choices=MECHANISMS, default="dchi-text",
                   help="default dchi-text; none sends plain token ids (needs --allow-none)")
    m.add_argument("--eta", type=float, help="dχ-privacy eta > 0 (dchi-text, dchi-embedding)")
    m.add_argument("--epsilon", type=float, help="epsilon > 0 (laplace, ome)")
    m.add_argument("--calibration", choices=("vector", "coordinate"),
                   help="laplace noise scale r/eps (vector, default: the whole vector is "
                        "eps-DP) or 1/eps (coordinate, as published: r*eps for the vector)")
    m.add_argument("--word-dropout", type=float, metavar="MU",
                   help="laplace: DPNR word dropout rate in [0, 1) before encoding")
    m.add_argument("--lam", type=float, help="ome: randomized-response factor lambda > 0")
    m.add_argument("--m", type=int, help="texthide: size of the secret mask pool")
    m.add_argument("--k", type=int, help="texthide: inputs mixed per record (default 1; "
                   "predictions use 1, k > 1 needs --tsv labels)")
    m.add_argument("--texthide-key", metavar="HEX",
                   help=f"texthide: the client's secret mask-pool key, >= 32 hex digits "
                        f"(or ${KEY_ENV})")
    m.add_argument("--texthide-seed", metavar="HEX",
                   help="deprecated alias of --texthide-key (the same check)")
    m.add_argument("--num-labels", type=int, help="texthide k > 1: classes of the soft "
                   "labels (default 2)")
    m.add_argument("--float16", action="store_true", help="dchi-embedding: send float16")
    m.add_argument("--allow-none", action="store_true",
                   help="allow --mechanism none (plain ids: the server can read the text)")
    m.add_argument("--allow-weak-privacy", action="store_true",
                   help="privatize even with parameters weaker than the privacy floor "
                        "(shared.floor: output close to the raw text); refused otherwise")
    m.add_argument("--seed", type=int, help="seed the noise (reproducible; removes protection)")
    i = p.add_argument_group("input policies")
    i.add_argument("--empty", choices=("skip", "error"), default="skip",
                   help="empty lines: skip and count (default) or stop with an error")
    i.add_argument("--truncate", choices=("first", "error"), default="first",
                   help="over-long text: keep the first word pieces (default) or stop")
    i.add_argument("--max-length", type=int, metavar="N",
                   help="model length limit incl. [CLS]/[SEP] (default: the bundle's)")
    i.add_argument("--batch-size", type=int, default=256, help="lines per batch (256)")
    i.add_argument("--no-progress", action="store_true", help="no progress bar")
    s = p.add_argument_group("posting")
    s.add_argument("--post", choices=("predict", "records"),
                   help="predict: one JSON prediction per line (needs --server, --model); "
                        "records: upload labelled records (needs --server, --task, --tsv)")
    s.add_argument("--task", help="task name for --post records")
    s.add_argument("--post-batch", type=int, default=64, help="payloads per request (64)")
    add_bundle_args(p)
    p.set_defaults(func=run)


def check_flags(args) -> None:
    """Usage errors before any work is done."""
    mech = args.mechanism
    # identity, not equality: --eta 0 or --word-dropout 0 is given (0.0 == False)
    given = {f for f in _ALL_FLAGS
             if getattr(args, f) is not None and getattr(args, f) is not False}
    stray = sorted(given - _FLAGS[mech])
    if stray:
        flags = ", ".join("--" + f.replace("_", "-") for f in stray)
        raise UsageError(f"{flags} do(es) not apply to --mechanism {mech}")
    need = {"dchi-text": ["eta"], "dchi-embedding": ["eta"], "laplace": ["epsilon"],
            "ome": ["epsilon", "lam"], "texthide": ["m"], "none": []}[mech]
    for f in need:
        if getattr(args, f) is None:
            raise UsageError(f"--mechanism {mech} needs --{f.replace('_', '-')}")
    if mech == "none" and not args.allow_none:
        raise UsageError("--mechanism none sends plain token ids the server can read; "
                         "add --allow-none for the Null-privacy baseline")
    if args.format == "text" and (mech != "dchi-text" or args.post):
        raise UsageError("--format text is for --mechanism dchi-text without --post")
    if args.batch_size < 1 or args.post_batch < 1:
        raise UsageError("--batch-size and --post-batch must be integers >= 1")
    k = args.k or 1
    if mech == "texthide" and k > 1 and (not args.tsv or args.post == "predict"):
        raise UsageError("texthide with --k > 1 mixes inputs and labels: only for labelled "
                         "records (--tsv); predictions use --k 1")
    if args.post and not args.server:
        raise UsageError(f"--post {args.post} needs --server URL")
    if args.post == "records" and (not args.task or not args.tsv):
        raise UsageError("--post records needs --task T and labelled input (--tsv)")
    if args.task and args.post != "records":
        raise UsageError("--task goes with --post records")
    if mech == "texthide":
        texthide_seed(args, quiet=True)


def texthide_seed(args, quiet: bool = False) -> int | None:
    """The mask-pool seed from --texthide-key (or its aliases); UsageError for a weak key."""
    try:
        seed, note = resolve_key(args.texthide_key, args.texthide_seed)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not quiet:
        if note:
            warn(note)
        if seed is None:
            warn("texthide without --texthide-key: a new secret mask pool for this run only")
    return seed


def build_mechanism(args, bundle):
    """The shared.mechanisms object for the flags (ValueError names a bad parameter)."""
    from shared import mechanisms as M

    mech = args.mechanism
    if mech == "none":
        return "none"
    if mech == "dchi-text":
        return M.DChiText(bundle, args.eta)
    if mech == "dchi-embedding":
        return M.DChiEmbedding(args.eta)
    if mech == "laplace":
        return M.Laplace(args.epsilon, args.calibration or "vector", args.word_dropout or 0.0)
    enc = bundle.meta.get("encoder") or {}
    if bundle.encoder_onnx is None or "output_dim" not in enc:
        raise UsageError(f"--mechanism {mech} needs a bundle with the frozen sentence encoder "
                         "(encoder.onnx); this one has none: use --server or a bundle made "
                         "by `cloud-api export-bundle`")
    dim = int(enc["output_dim"])
    if mech == "ome":
        return M.OME(args.epsilon, args.lam, dim)
    return M.TextHide(args.m, args.k if args.k is not None else 1, dim,
                      seed=texthide_seed(args))


def flag_params(args) -> dict:
    """The payload parameters the flags name (before the mechanism is built)."""
    names = {"dchi-text": ["eta"], "dchi-embedding": ["eta"],
             "laplace": ["epsilon", "calibration", "word_dropout"], "ome": ["epsilon", "lam"],
             "texthide": ["m", "k"], "none": []}[args.mechanism]
    defaults = {"calibration": "vector", "word_dropout": 0.0, "k": 1}
    return {n: getattr(args, n) if getattr(args, n) is not None else defaults.get(n)
            for n in names}


def check_model(model: dict, name: str, mine: dict) -> None:
    """Refuse, before sending, a mechanism or parameters the served model does not read."""
    want, params = model.get("mechanism"), model.get("params")
    mismatch = want is not None and want != name
    if not mismatch and isinstance(params, dict):
        keys = params.keys() & mine.keys()
        if name == "texthide":  # predictions use k = 1 whatever k the model was trained with
            keys &= {"m"}
        for key in keys:
            a, b = params[key], mine[key]
            if isinstance(a, (int, float)) and isinstance(b, (int, float)):
                mismatch |= not math.isclose(a, b, rel_tol=1e-9)
            else:
                mismatch |= a != b
    if mismatch:
        raise CliError(f"model {model.get('id')} reads {want} {json.dumps(params)}; this run "
                       f"would send {name} {json.dumps(mine)}: set the same mechanism and "
                       "parameters")


def _max_length(args, bundle, model: dict | None) -> int | None:
    """--max-length, else for --post predict the served model's own limit (a model trained
    at 128 refuses longer token payloads; the bundle allows up to 512), else the bundle's.
    Vector payloads have one size whatever the text's length: the encoder's limit applies."""
    if args.max_length is not None or model is None or args.post != "predict" \
            or args.mechanism not in ("dchi-text", "dchi-embedding", "none"):
        return args.max_length
    limit = model.get("max_length")
    if isinstance(limit, int) and not isinstance(limit, bool) and 4 <= limit:
        return min(limit, bundle.max_length)
    return None


def run(args) -> int:
    t0 = time.perf_counter()
    check_flags(args)
    if args.seed is not None:
        warn("--seed makes the noise predictable: anyone who knows the seed can remove the "
             "protection; use it for experiments only")
    stream, size = open_input(args.file)
    try:
        refuse_output_on_input(stream, args.file, args.output)
        out = Output(args.output)
        return _run(args, stream, size, out, t0)
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def _run(args, stream, size, out: Output, t0: float) -> int:
    import numpy as np

    from edge_agent.lines import LineReader
    from edge_agent.pipeline import ahead
    from edge_agent.privatizer import Privatizer
    from shared.accounting import guarantee, summary

    client = make_client(args, args.post_batch) if args.server else None
    early = (lambda m: check_model(m, args.mechanism, flag_params(args))) \
        if args.post == "predict" else None
    bundle, model = resolve_bundle(args, client, early)
    from shared.floor import WeakPrivacyError

    try:
        mech = build_mechanism(args, bundle)
        priv = Privatizer(bundle, mech, max_length=_max_length(args, bundle, model),
                          truncate=args.truncate,
                          float_dtype="float16" if args.float16 else "float32",
                          allow_weak_privacy=args.allow_weak_privacy)
    except WeakPrivacyError as exc:
        raise UsageError(f"{exc}; --allow-weak-privacy privatizes anyway") from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if priv.weak_privacy:
        warn(f"{priv.weak_privacy}: the output is close to the raw text "
             "(--allow-weak-privacy)")
    if args.post == "predict":
        if not args.model and model is not None:
            args.model = str(model.get("id"))
        check_model(model or {}, priv.name, priv.params)
    rng = np.random.default_rng(args.seed) if args.seed is not None else None
    k = args.k or 1
    texthide_mix = args.mechanism == "texthide" and k > 1
    num_labels = args.num_labels or 2
    if texthide_mix and num_labels < 2:
        raise UsageError(f"--num-labels must be an integer >= 2, got {num_labels}")
    bar = None
    if sys.stderr.isatty() and not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=size, unit="B", unit_scale=True, file=sys.stderr, desc="privatize")
    reader = LineReader(stream, tsv=args.tsv, header=args.header)
    n_records = n_tokens = n_trunc = n_skipped = 0
    t_first = None
    ok = False
    t_loop, c_loop = time.perf_counter(), time.process_time()

    def tokenize(batch) -> _Prepared:  # first worker: read, check, tokenize
        return _tokenized(args, priv, reader, batch, texthide_mix, num_labels)

    def privatize(ready: _Prepared) -> _Prepared:  # second worker: the mechanism
        return _privatized(priv, ready, texthide_mix, num_labels, rng)

    batches = reader.batches(args.batch_size, minimum=k if texthide_mix else 1)
    prepared = ahead(ahead(batches, tokenize), privatize)
    try:
        for ready in prepared:
            try:
                lines = _emit(args, priv, client, ready)
            except _PostFailed as exc:  # keep what the server answered before the failure
                out.write(exc.lines)
                n_records += len(exc.lines)
                raise CliError(f"{exc}; {n_records} record(s) before it were "
                               + ("uploaded and written" if args.post == "records"
                                  else "written")) from None
            try:
                out.write(lines)
            except CliError as exc:
                if args.post == "records":  # the server has them; say which lines
                    first, last = ready.lines[0].number, ready.lines[-1].number
                    raise CliError(f"{exc}; the records of lines {first}-{last} were "
                                   "uploaded but their ids not written") from None
                raise
            if ready.items and t_first is None:
                t_first = time.perf_counter() - t0
            n_records += len(ready.items)
            n_tokens += sum(it.n_tokens for it in ready.items)
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
    t_end, cpu_streaming = time.perf_counter(), time.process_time() - c_loop
    elapsed, setup, streaming = t_end - t0, t_loop - t0, t_end - t_loop
    # the one-line summary needs eta and the table's worst case, not neighbour medians
    g = guarantee(mech, bundle, sample=100) if mech != "none" else guarantee("none")
    info(f"{n_records} records, {n_tokens} tokens in {elapsed:.2f} s (setup {setup:.2f} s, "
         + (f"first record at {t_first:.2f} s, " if t_first is not None else "")
         + f"{n_tokens / max(streaming, 1e-9):,.0f} tokens/s streaming, "
         f"{n_tokens / max(cpu_streaming, 1e-9):,.0f} tokens per CPU second); "
         f"{n_skipped} empty line(s) skipped; {n_trunc} truncated; "
         f"{summary(g, n_tokens / n_records if n_records else None)}"
         + ("; WEAK PRIVACY (--allow-weak-privacy): the output is close to the raw text"
            if priv.weak_privacy else ""))
    return 0


@dataclass
class _Prepared:
    """One batch: its kept lines and their tokens (``items``, from _tokenized), then the
    mechanism's output (``data``, see Privatizer.privatize_data) or whole records
    (``objs``, TextHide k > 1, from _privatized), what was skipped, and the error that
    ends the input after it."""

    lines: list = field(default_factory=list)
    items: list = field(default_factory=list)
    objs: list = field(default_factory=list)
    n_skipped: int = 0
    nbytes: int = 0
    error: Exception | None = None
    data: Any = None


def _tokenized(args, priv, reader, batch, texthide_mix, num_labels) -> _Prepared:
    """Check a batch's lines and tokenize them (no I/O besides reading)."""
    from edge_agent.lines import InputError
    from edge_agent.privatizer import TextError

    lines, error = batch.lines, batch.error
    n_skipped = 0
    if batch.empty and args.empty == "error":
        first = batch.empty[0]
        lines = [ln for ln in lines if ln.number < first]
        error = InputError(f"line {first}: empty line (--empty skip skips them)")
    else:
        n_skipped += len(batch.empty)
    if texthide_mix:
        for j, ln in enumerate(lines):
            if isinstance(ln.label, str) or not 0 <= ln.label < num_labels:
                error = InputError(f"line {ln.number}: texthide mixes labels: need an "
                                   f"integer label in [0, {num_labels}) (--num-labels)")
                lines = lines[:j]
                break
    texts = [ln.text for ln in lines]
    pairs = [ln.text_b for ln in lines] if reader.columns == 3 else None
    try:
        items = priv.tokenize(texts, pairs, allow_empty=True)
    except TextError as exc:
        bad = lines[exc.index]
        error = InputError(f"line {bad.number} {exc.detail.split(' (')[0]} "
                           "(--truncate first keeps the first ones)")
        lines = lines[: exc.index]
        items = priv.tokenize(texts[: exc.index],
                              None if pairs is None else pairs[: exc.index], allow_empty=True)
    keep = []
    for ln, it in zip(lines, items, strict=True):
        if it is not None:
            keep.append((ln, it))
        elif args.empty == "error":
            error = InputError(f"line {ln.number}: no tokens in the text "
                               "(--empty skip skips it)")
            break
        else:
            n_skipped += 1
    k = args.k or 1
    if texthide_mix and 0 < len(keep) < k:  # the last lines, or too many skipped
        first, last = keep[0][0].number, keep[-1][0].number
        where = f"line {first}" if first == last else f"lines {first}-{last}"
        short = (f"texthide --k {k} mixes {k} labelled lines; only {len(keep)} remain "
                 f"({where}) and were not privatized: add lines or lower --k")
        error = InputError(short if error is None else f"{error}; {short}")
        keep = []
    return _Prepared([ln for ln, _ in keep], [it for _, it in keep], [], n_skipped,
                     batch.nbytes, error)


def _privatized(priv, ready: _Prepared, texthide_mix: bool, num_labels: int,
                rng) -> _Prepared:
    """The mechanism on a tokenized batch (the only stage that draws randomness)."""
    if not ready.items:
        return ready
    if texthide_mix:  # mixing needs the labels: whole records here
        ready.objs = priv.records_tokenized(ready.items, [ln.label for ln in ready.lines],
                                            num_labels, rng)
    else:  # the mechanism only; payloads are built by the main thread (_emit)
        ready.data = priv.privatize_data(ready.items, rng)
    return ready


def _objects(args, priv, ready: _Prepared) -> list:
    """Payloads (--post predict) or records of a privatized batch."""
    from edge_agent.privatizer import labelled

    if ready.data is None:
        return ready.objs
    payloads = priv.payloads(ready.items, ready.data)
    if args.post == "predict":
        return payloads
    return labelled(payloads, [ln.label for ln in ready.lines] if args.tsv else None)


class _PostFailed(Exception):
    """A request of --post failed; ``lines`` are the output lines of what the server
    answered before it (predictions, or ids of stored records)."""

    def __init__(self, error: Exception, lines: list[bytes]):
        super().__init__(str(error))
        self.lines = lines


def _emit(args, priv, client, ready: _Prepared) -> list[bytes]:
    """The output lines of one privatized batch (posting it first with --post)."""
    from edge_agent.privatizer import TOKEN_KINDS

    if not ready.items:
        return []
    if (not args.post and args.format == "jsonl" and ready.data is not None
            and priv.name in TOKEN_KINDS):  # the same bytes, one validated template a batch
        return priv.record_lines(ready.items, ready.data,
                                 [ln.label for ln in ready.lines] if args.tsv else None)
    objs = _objects(args, priv, ready)
    lines = ready.lines
    if args.post:
        from edge_agent.client import ApiError

        def out(answers: list, key: str | None) -> list[bytes]:
            return [orjson.dumps({"line": ln.number, **({key: a} if key else a)}) + b"\n"
                    for ln, a in zip(lines, answers, strict=False)]

        key = "id" if args.post == "records" else None
        try:
            answers = (client.post_records(args.task, objs) if args.post == "records"
                       else client.predict(args.model, objs))
        except ApiError as exc:
            raise _PostFailed(exc, out(exc.partial, key)) from None
        return out(answers, key)
    if args.format == "text":
        return [_as_text(priv, r.payload, ln).encode("utf-8")
                for r, ln in zip(objs, lines, strict=True)]
    # orjson on the model's plain-Python dump: the same JSON as model_dump_json, 5x faster
    # on the large base64 strings of dchi-embedding (tests/edge_agent check they agree)
    return [orjson.dumps(r.model_dump(exclude_none=True)) + b"\n" for r in objs]


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
