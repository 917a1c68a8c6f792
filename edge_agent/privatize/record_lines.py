"""JSONL lines of token-mechanism records, one validated record per batch as the template.

``edge-agent privatize`` writes ``orjson.dumps(Record(payload=p, label=l).model_dump(
exclude_none=True))`` per line. For a token mechanism (dchi-embedding, dchi-text, none) the
records of a batch differ only in their array, segments and label: the first record goes
through the pydantic models in full, every label through ``Record`` (once per distinct
label), and the rest is checked here with the models' per-record rules (token count,
segment sums, token-id range). A batch where a check fails takes the models' path, which
raises their error; otherwise the bytes are the same as the models' (tests check it), at a
fraction of the cost (dchi-embedding's large base64 arrays made the per-record model work
the CLI's bottleneck: ``bench/edge.py`` measures it). :func:`token_rows` keeps the payloads'
JSON apart from the labels, so that the device ledger can charge them (and swap in the
stored payload of a memoized text) before the lines are made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from shared.arrays import DEFAULT_LIMITS, Limits, encoded_rows, wrap_array
from shared.payload import PAYLOAD_ADAPTER, PAYLOAD_FIELDS, Record, make_payloads


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


@dataclass
class TokenRows:
    """The records of one batch of a token mechanism, as JSON: ``payload`` the first one's
    payload validated by the models (its mechanism, params and bundle id are every row's),
    ``jsons`` each payload's JSON, ``labels`` each label as ``Record`` dumps it (None: no
    label), ``n_tokens`` each payload's token count (its array's first dimension)."""

    payload: Any
    jsons: list[bytes]
    labels: list
    n_tokens: list[int]

    def lines(self, jsons: list[bytes] | None = None) -> list[bytes]:
        """The JSONL lines (each ending in a newline) around ``jsons`` (default: the rows'
        own; the device ledger passes stored payloads for memoized texts): the bytes of
        ``orjson.dumps(Record(...).model_dump(exclude_none=True))``."""
        out = []
        for p, lab in zip(self.jsons if jsons is None else jsons, self.labels, strict=True):
            if lab is None:
                out.append(b'{"payload":' + p + b"}\n")
            else:
                out.append(b'{"payload":' + p + b',"label":' + orjson.dumps(lab) + b"}\n")
        return out


def token_record_lines(mechanism: str, params: dict, bundle_id: str, data: np.ndarray,
                       lengths: list[int], segments: list[list[int] | None],
                       labels: list | None, float_dtype: str = "float32",
                       limits: Limits | None = None) -> list[bytes]:
    """The JSONL lines (each ending in a newline) of the records of consecutive rows of
    ``data`` (``lengths[i]`` rows each), labelled by ``labels`` (None: no label)."""
    if not lengths:
        return []
    return token_rows(mechanism, params, bundle_id, data, lengths, segments, labels,
                      float_dtype, limits).lines()


def token_rows(mechanism: str, params: dict, bundle_id: str, data: np.ndarray,
               lengths: list[int], segments: list[list[int] | None], labels: list | None,
               float_dtype: str = "float32", limits: Limits | None = None) -> TokenRows:
    """:class:`TokenRows` of consecutive rows of ``data`` (``lengths[i]`` rows each),
    labelled by ``labels`` (None: no label); ValueError for no rows."""
    n = len(lengths)
    if n == 0:
        raise ValueError("no records")
    segments = [None if s is None else [int(x) for x in s] for s in segments]
    labels = [None] * n if labels is None else list(labels)
    lim = limits or DEFAULT_LIMITS
    field, dtype = PAYLOAD_FIELDS[mechanism]
    dtype = dtype or float_dtype
    values, starts, ends, datas = encoded_rows(data, lengths, dtype, limits)  # cast, check
    ids = values if dtype == "int32" else None
    if not _rows_pass(np.asarray(lengths, dtype=np.int64), segments, ids, lim):
        payloads = make_payloads(mechanism, params, bundle_id, data, lengths, segments,
                                 float_dtype, limits)  # raises the models' error
        dumps = [Record(payload=p, label=lab).model_dump(exclude_none=True)
                 for p, lab in zip(payloads, labels, strict=True)]
        return TokenRows(payloads[0], [orjson.dumps(d["payload"]) for d in dumps],
                         [d.get("label") for d in dumps], [p.n_tokens for p in payloads])
    obj: dict[str, Any] = {"mechanism": mechanism, "params": params, "bundle_id": bundle_id,
                           field: wrap_array(dtype, values[starts[0]:ends[0]], datas[0])}
    if segments[0] is not None:
        obj["segments"] = segments[0]
    first = PAYLOAD_ADAPTER.validate_python(obj, context={"limits": lim})
    common = first.model_dump(exclude_none=True)
    order = list(type(first).model_fields)
    label_dump: dict[tuple, Any] = {}
    jsons, label_values, n_tokens = [], [], []
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
        jsons.append(orjson.dumps(payload))
        label_values.append(lab_value)
        n_tokens.append(int(b - a))
    return TokenRows(first, jsons, label_values, n_tokens)
