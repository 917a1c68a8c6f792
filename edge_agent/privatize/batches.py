"""The stages of one input batch of ``edge-agent privatize``: its lines checked and tokenized
(:func:`tokenized`), then privatized (:func:`privatized`). No I/O besides reading."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edge_agent.privatize.lines import InputError
from edge_agent.privatize.options import PrivatizeOptions
from edge_agent.privatize.privatizer import TextError


@dataclass
class Prepared:
    """One batch: its kept lines and their tokens (``items``, from :func:`tokenized`), then
    the mechanism's output (``data``, see Privatizer.privatize_data) or whole records
    (``objs``, TextHide k > 1, from :func:`privatized`), what was skipped, and the error
    that ends the input after it."""

    lines: list = field(default_factory=list)
    items: list = field(default_factory=list)
    objs: list = field(default_factory=list)
    n_skipped: int = 0
    nbytes: int = 0
    error: Exception | None = None
    data: Any = None


def tokenized(opts: PrivatizeOptions, priv, reader, batch) -> Prepared:
    """Check a batch's lines and tokenize them (the input policies of ``opts.input``)."""

    m, policy = opts.mechanism, opts.input
    num_labels = m.num_labels or 2
    lines, error = batch.lines, batch.error
    n_skipped = 0
    if batch.empty and policy.empty == "error":
        first = batch.empty[0]
        lines = [ln for ln in lines if ln.number < first]
        error = InputError(f"line {first}: empty line (--empty skip skips them)")
    else:
        n_skipped += len(batch.empty)
    if m.mixes:
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
        elif policy.empty == "error":
            error = InputError(f"line {ln.number}: no tokens in the text "
                               "(--empty skip skips it)")
            break
        else:
            n_skipped += 1
    k = m.mixed
    if k > 1 and 0 < len(keep) < k:  # the last lines, or too many skipped
        first, last = keep[0][0].number, keep[-1][0].number
        where = f"line {first}" if first == last else f"lines {first}-{last}"
        short = (f"texthide --k {k} mixes {k} labelled lines; only {len(keep)} remain "
                 f"({where}) and were not privatized: add lines or lower --k")
        error = InputError(short if error is None else f"{error}; {short}")
        keep = []
    return Prepared([ln for ln, _ in keep], [it for _, it in keep], [], n_skipped,
                    batch.nbytes, error)


def privatized(opts: PrivatizeOptions, priv, ready: Prepared, rng) -> Prepared:
    """The mechanism on a tokenized batch (the only stage that draws randomness)."""
    if not ready.items:
        return ready
    if opts.mechanism.mixes:  # mixing needs the labels: whole records here
        ready.objs = priv.records_tokenized(ready.items, [ln.label for ln in ready.lines],
                                            opts.mechanism.num_labels or 2, rng)
    else:  # the mechanism only; payloads are built by the main thread
        ready.data = priv.privatize_data(ready.items, rng)
    return ready
