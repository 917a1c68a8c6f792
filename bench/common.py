"""Helpers for the benchmarks: where the data is, what machine this is, a table printer."""

from __future__ import annotations

import csv
import os
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "data"


def read_tsv(path: Path, limit: int | None = None) -> list[list[str]]:
    """Rows of a GLUE-style TSV (header skipped)."""
    csv.field_size_limit(sys.maxsize)
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        next(reader)
        rows = []
        for row in reader:
            rows.append(row)
            if limit is not None and len(rows) >= limit:
                break
    return rows


def machine() -> str:
    """One line: CPU count, processor, Python, numpy."""
    import numpy as np

    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{os.cpu_count()} cores ({cpu}), {platform.system()} {platform.machine()}, "
            f"Python {platform.python_version()}, numpy {np.__version__}")


def table(headers: list[str], rows: list[list]) -> str:
    """A Markdown table."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    sep = "| " + " | ".join("-" * w for w in widths) + " |"
    body = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
            for r in cells]
    return "\n".join([line, sep, *body])
