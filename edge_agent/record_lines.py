"""JSONL lines of token-mechanism records, one validated record per batch as the template.

``edge-agent privatize`` writes ``orjson.dumps(Record(payload=p, label=l).model_dump(
exclude_none=True))`` per line. For a token mechanism (dchi-embedding, dchi-text, none) the
records of a batch differ only in their array, segments and label: the first record goes
through the pydantic models in full, every label through ``Record`` (once per distinct
label), and the rest is checked here with the models' per-record rules (token count,
segment sums, token-id range). A batch where a check fails takes the models' path, which
raises their error; otherwise the bytes are the same as the models' (tests check it), at a
fraction of the cost (dchi-embedding's 22 KB of base64 per record made the per-record
model work the CLI's bottleneck: bench/edge.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from shared.arrays import _DEFAULT_LIMITS, Limits, _wrap, encoded_rows
from shared.payload import _KINDS, PAYLOAD_ADAPTER, Record, make_payloads


def _rows_pass(lengths: np.ndarray, segments: list, ids: np.ndarray | None,
               lim: Limits) -> bool:
    """Whether every record would pass the token payloads' per-record rules."""
    if lengths.size and (lengths.min() < 1 or lengths.max() > lim.max_tokens):
        return False
    for seg, n in zip(segments, lengths.tolist(), strict=True):
        if seg is not None and (not 1 <= len(seg) <= 2 or sum(seg) != n
                                or any(type(s) is not int or not 1 <= s <= 2**31 - 1
                                       for s in seg)):
            return False
    if ids is not None and ids.size and (ids.min() < 0 or (
            lim.vocab_size is not None and ids.max() >= lim.vocab_size)):
        return False
    return True


def token_record_lines(mechanism: str, params: dict, bundle_id: str, data: np.ndarray,
                       lengths: list[int], segments: list[list[int] | None],
                       labels: list | None, float_dtype: str = "float32",
                       limits: Limits | None = None) -> list[bytes]:
    """The JSONL lines (each ending in a newline) of the records of consecutive rows of
    ``data`` (``lengths[i]`` rows each), labelled by ``labels`` (None: no label)."""
    n = len(lengths)
    if n == 0:
        return []
    segments = [None if s is None else [int(x) for x in s] for s in segments]
    labels = [None] * n if labels is None else list(labels)
    lim = limits or _DEFAULT_LIMITS
    field, dtype = _KINDS[mechanism]
    dtype = dtype or float_dtype
    values, starts, ends, datas = encoded_rows(data, lengths, dtype, limits)  # cast, check
    ids = values if dtype == "int32" else None
    if not _rows_pass(np.asarray(lengths, dtype=np.int64), segments, ids, lim):
        payloads = make_payloads(mechanism, params, bundle_id, data, lengths, segments,
                                 float_dtype, limits)  # raises the models' error
        return [orjson.dumps(Record(payload=p, label=lab).model_dump(exclude_none=True))
                + b"\n" for p, lab in zip(payloads, labels, strict=True)]
    obj: dict[str, Any] = {"mechanism": mechanism, "params": params, "bundle_id": bundle_id,
                           field: _wrap(dtype, values[starts[0]:ends[0]], datas[0])}
    if segments[0] is not None:
        obj["segments"] = segments[0]
    first = PAYLOAD_ADAPTER.validate_python(obj, context={"limits": lim})
    common = first.model_dump(exclude_none=True)
    order = list(type(first).model_fields)
    label_dump: dict[tuple, Any] = {}
    out = []
    tail = tuple(int(x) for x in values.shape[1:])
    for a, b, text, seg, lab in zip(starts, ends, datas, segments, labels, strict=True):
        key = (type(lab), lab) if isinstance(lab, str | int | None) else None
        if key is None or key not in label_dump:
            dumped = Record(payload=first, label=lab).model_dump(exclude_none=True).get(
                "label", None)
            if key is None:
                lab_value = dumped
            else:
                lab_value = label_dump[key] = dumped
        else:
            lab_value = label_dump[key]
        payload: dict[str, Any] = {}
        for name in order:
            if name == field:
                payload[name] = {"dtype": dtype, "shape": (b - a, *tail), "data": text}
            elif name == "segments":
                if seg is not None:
                    payload[name] = seg
            elif name in common:
                payload[name] = common[name]
        rec = {"payload": payload} if lab_value is None else {"payload": payload,
                                                              "label": lab_value}
        out.append(orjson.dumps(rec) + b"\n")
    return out
