"""Parameters the float arithmetic of the dχ mechanisms cannot carry (pure numpy, no I/O).

Part of the mechanisms package so that ``DChiText`` checks its own η without importing the
privacy floor or the accounting (both sit above the mechanisms; ``shared.floor`` re-exports
these names and applies them to every mechanism in ``check_computable``).
"""

from __future__ import annotations

import math

import numpy as np

from shared import messages as msg
from shared.mechanisms.nearest import scores_overflow

TAIL = 40.0  # noise tails are bounded with probability 1 - e^-40 (about 4e-18)
F32_MAX = float(np.finfo(np.float32).max)
F16_MAX = float(np.finfo(np.float16).max)


def gamma_tail(n: int, tail: float = TAIL) -> float:
    """x with Pr[Gamma(n, 1) >= x] <= e^-tail: n + sqrt(2 n tail) + tail (a Gamma(n, 1)
    variable is sub-gamma with variance n and scale 1; Boucheron, Lugosi, Massart §2.4)."""
    return n + math.sqrt(2.0 * n * tail) + tail


def dchi_noise_limit(eta: float, dim: int) -> float:
    """A bound on the dχ noise norm that holds with probability 1 - e^-40 (inf if 1/η
    overflows)."""
    return gamma_tail(dim) / float(eta)  # Python floats: inf, never a warning


def check_dchi_eta(eta: float, dim: int, t_max: float, float_dtype: str = "float32",
                   search: bool = True) -> None:
    """ValueError if η's noise (norm up to :func:`dchi_noise_limit`) added to embeddings of
    norm up to ``t_max`` is not finite in ``float_dtype``; ``search``: also the float32
    scores ||t||² - 2 y·t of the exact nearest-token search (with room for its bound)."""
    if not math.isfinite(t_max):  # not "eta too small": no eta helps
        raise ValueError(msg.DCHI_TABLE_NOT_FINITE)
    r = dchi_noise_limit(eta, dim)
    # a coordinate is at most the norm: float16 payloads hold up to its maximum, float32
    # keeps a factor 4 of room for the arithmetic that follows
    top = F16_MAX if float_dtype == "float16" else F32_MAX / 4.0
    bad = not math.isfinite(r) or r + t_max > top
    if search and not bad:  # the rule ExactNearest.search applies to the noisy queries
        bad = scores_overflow(r + t_max, t_max)
    if bad:
        where = msg.WHERE_FLOAT16 if float_dtype == "float16" else msg.WHERE_FLOAT32
        raise ValueError(msg.DCHI_TOO_SMALL.format(eta=eta, norm=r, where=where))
