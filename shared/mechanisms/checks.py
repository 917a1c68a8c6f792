"""Argument checks shared by the mechanisms: one message format for bad input."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt


def positive(name: str, value: float) -> float:
    """``value`` as a float, or ValueError if it is not a finite number > 0."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return v


def in_unit_interval(name: str, value: float) -> float:
    """``value`` in [0, 1), or ValueError."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be in [0, 1), got {value!r}") from None
    if not (0.0 <= v < 1.0):
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    return v


def positive_int(name: str, value: int, minimum: int = 1) -> int:
    """``value`` as an int >= minimum, or ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def finite_array(name: str, arr: npt.ArrayLike, ndim: int, dim: int | None = None) -> np.ndarray:
    """``arr`` as a float array of ``ndim`` dimensions with only finite values."""
    a = np.asarray(arr)
    if a.dtype.kind not in "fiu":
        raise ValueError(f"{name} must be a numeric array, got dtype {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {a.shape}")
    if dim is not None and a.shape[-1] != dim:
        raise ValueError(f"{name} must have {dim} values in its last axis, got shape {a.shape}")
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        raise ValueError(f"{name} contains NaN or Inf")
    return a
