"""``web_edge/src/random/ziggurat_tables.ts``: numpy's ziggurat tables, read from numpy itself.

The web edge draws what ``numpy.random.Generator(PCG64)`` draws, so its ziggurat samplers
(Marsaglia & Tsang 2000, "The ziggurat method"; numpy's ``random_standard_normal`` with 256
strips and 52-bit mantissas, ``random_standard_exponential`` with 53) need numpy's tables
bit for bit. numpy builds them into its compiled generator from
``numpy/random/src/distributions/ziggurat_constants.h``; its wheels do not ship the header.
So the tables are read from the compiled module: the algorithm gives each table to about
1e-13 (:func:`approximate`: the strips' recursion x_i = f⁻¹(v/x_{i+1} + f(x_{i+1})) from
the tail x_255 = r, in float64), which locates the one 256-entry array of the binary within
1e-9 of it (:func:`from_numpy`); every entry is then numpy's own. The header printed the
doubles with 21 (normal) and 19 (exponential) significant digits and the integers in hex;
the TypeScript keeps those digits (``%.20e``, ``%.18e``) and the integers in decimal.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

# the defining constants of numpy's ziggurats, as its header writes them
NOR_R = "3.6541528853610087963519472518"
NOR_INV_R = "0.27366123732975827203338247596"
EXP_R = "7.6971174701310497140446280481"
STRIPS = 256
TABLES = ("KI_DOUBLE", "KE_DOUBLE", "WI_DOUBLE", "FI_DOUBLE", "WE_DOUBLE", "FE_DOUBLE")
FORMATS = {"WI_DOUBLE": "%.20e", "FI_DOUBLE": "%.20e", "WE_DOUBLE": "%.18e",
           "FE_DOUBLE": "%.18e"}
HEADER = """\
// Ziggurat tables of numpy's random_standard_normal and random_standard_exponential
// (numpy/random/src/distributions/ziggurat_constants.h, BSD-3-Clause, numpy developers),
// copied so that a seeded run draws what numpy.random.Generator(PCG64) draws, and so that the
// OS-entropy source uses the same proven sampler (Marsaglia & Tsang 2000, "The ziggurat method").
// Generated from that header by a script; do not edit by hand.

"""
RTOL = 1e-9


def _strips(r: float, f: Callable[[float], float], f_inv: Callable[[float], float],
            tail_area: float, mantissa: float
            ) -> tuple[list[float], list[float], list[float]]:
    """(k, w, f) of a 256-strip ziggurat with tail at ``r`` for the density ``f``; the
    strips' common area v = r f(r) + the tail's area (Marsaglia & Tsang §2)."""
    v = r * f(r) + tail_area
    x = [0.0] * STRIPS
    x[STRIPS - 1] = r
    for i in range(STRIPS - 2, 0, -1):
        x[i] = f_inv(v / x[i + 1] + f(x[i + 1]))
    k = [math.floor(r * f(r) / v * mantissa), 0.0]
    k += [math.floor(x[i - 1] / x[i] * mantissa) for i in range(2, STRIPS)]
    w = [v / f(r) / mantissa] + [x[i] / mantissa for i in range(1, STRIPS)]
    fv = [1.0] + [f(x[i]) for i in range(1, STRIPS)]
    return k, w, fv


def approximate() -> dict[str, list[float]]:
    """The six tables by the algorithm in float64 (to about 1e-13 relative)."""
    rn, re_ = float(NOR_R), float(EXP_R)
    kn, wn, fn = _strips(rn, lambda x: math.exp(-0.5 * x * x),
                         lambda y: math.sqrt(-2.0 * math.log(y)),
                         math.sqrt(math.pi / 2) * math.erfc(rn / math.sqrt(2)), 2.0**52)
    ke, we, fe = _strips(re_, lambda x: math.exp(-x), lambda y: -math.log(y),
                         math.exp(-re_), 2.0**53)
    return {"KI_DOUBLE": kn, "WI_DOUBLE": wn, "FI_DOUBLE": fn,
            "KE_DOUBLE": ke, "WE_DOUBLE": we, "FE_DOUBLE": fe}


def numpy_binary() -> Path:
    """numpy's compiled generator module, which holds the tables."""
    import numpy.random._generator as gen

    return Path(gen.__file__)


def _locate(data: bytes, approx: list[float], integers: bool) -> np.ndarray:
    """The one 256-entry little-endian array of ``data`` within :data:`RTOL` of ``approx``
    (at any 8-byte alignment of the file)."""
    want = np.asarray(approx, dtype=np.float64)
    tol = RTOL * np.abs(want) + (0.5 if integers else 0.0)
    found: list[np.ndarray] = []
    for start in range(8):
        n = (len(data) - start) // 8
        raw = np.frombuffer(data, dtype="<u8" if integers else "<f8", offset=start, count=n)
        vals = raw.astype(np.float64) if integers else raw
        with np.errstate(invalid="ignore", over="ignore"):
            hits = np.flatnonzero(np.abs(vals[: n - STRIPS + 1] - want[0]) <= tol[0])
            for i in hits:
                window = vals[i : i + STRIPS]
                if np.all(np.abs(window - want) <= tol):
                    found.append(raw[i : i + STRIPS].copy())
    if not found or any(not np.array_equal(f, found[0]) for f in found):
        raise RuntimeError(f"numpy's ziggurat table near {approx[:2]} is not in "
                           f"{numpy_binary()} ({len(found)} candidates)")
    return found[0]


def from_numpy(path: Path | None = None) -> dict[str, np.ndarray]:
    """The six tables as numpy's compiled generator holds them."""
    data = (path or numpy_binary()).read_bytes()
    approx = approximate()
    return {name: _locate(data, approx[name], name.startswith("K")) for name in TABLES}


def render(tables: dict[str, np.ndarray]) -> str:
    """The TypeScript module's text."""
    out = [HEADER]
    for name in TABLES:
        vals = tables[name]
        items = ([str(int(v)) for v in vals] if name.startswith("K")
                 else [FORMATS[name] % float(v) for v in vals])
        out.append(f"export const {name}: readonly number[] = [{', '.join(items)}];\n")
    out.append(f"export const ZIGGURAT_NOR_R = {NOR_R};\n")
    out.append(f"export const ZIGGURAT_NOR_INV_R = {NOR_INV_R};\n")
    out.append(f"export const ZIGGURAT_EXP_R = {EXP_R};\n")
    return "".join(out)


def generate() -> str:
    return render(from_numpy())
