"""Helpers of the utility benches: cache keys, JSON files written atomically, logging, a
seeded subset of a TSV."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from bench.common import read_tsv


def key_of(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def log(msg: str) -> None:
    print(f"[{dt.datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


def fmt_s(s: float | None) -> str:
    if s is None:
        return "—"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def subset(src: Path, n: int, seed: int, stream: int, tmp: Path) -> tuple[Path, str, int]:
    """A seeded subset of ``n`` rows of a ``sentence<TAB>label`` TSV (all if n <= 0 or more
    than there are), written to ``tmp`` (outside the repository); (path, sha256, rows)."""
    rows = read_tsv(src)
    if 0 < n < len(rows):
        idx = np.sort(np.random.default_rng([seed, stream]).choice(len(rows), n, replace=False))
        rows = [rows[i] for i in idx]
    text = "sentence\tlabel\n" + "".join("\t".join(r) + "\n" for r in rows)
    path = tmp / f"{src.stem}-{n}-{seed}.tsv"
    path.write_text(text, encoding="utf-8")
    return path, hashlib.sha256(text.encode()).hexdigest(), len(rows)
