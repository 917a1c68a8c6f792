"""Arrays on the wire: dtype, shape and base64 of little-endian bytes (ARCHITECTURE.md
"Payloads"), and the size :class:`Limits` a payload must respect.

Arrays built here from checked numpy values keep that array as their decoded view,
so the device never decodes what it has just encoded; arrays read from JSON are
decoded, checked (canonical base64, length, finite floats, zero padding bits) and
kept the same way.
"""

from __future__ import annotations

import binascii
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, model_validator

try:  # SIMD base64 (10x the standard library's speed); same bytes, same errors
    from pybase64 import b64decode, b64encode
except ImportError:  # pragma: no cover - the edge and cloud extras install it
    from base64 import b64decode, b64encode  # type: ignore[assignment]

if TYPE_CHECKING:
    import numpy.typing as npt

    from shared.bundle import EdgeBundle

MAX_JSON_BYTES = 8 * 1024 * 1024
DTYPES = {"float16": "<f2", "float32": "<f4", "int32": "<i4", "bits": "u1"}
DType = Literal["float16", "float32", "int32", "bits"]  # the keys of DTYPES
FLOAT_DTYPES = ("float16", "float32")
_B64 = r"^[A-Za-z0-9+/]*={0,2}$"


@dataclass(frozen=True)
class Limits:
    """Bounds a payload must respect.

    The optional fields pin a payload to one bundle and task: ``vocab_size`` bounds
    token ids, ``dim`` is the embedding width n, ``vector_dim`` the sentence-vector
    width r (laplace, texthide; OME carries r·l bits), and ``labels`` the class names a
    record's label may take (integer labels index it, soft labels have its length).
    A server validates with :meth:`for_bundle`; the defaults only bound sizes.
    """

    max_tokens: int = 512
    max_dim: int = 4096
    max_array_bytes: int = 4 * 1024 * 1024
    max_bits: int = 4096 * 32
    vocab_size: int | None = None
    max_json_bytes: int = MAX_JSON_BYTES
    dim: int | None = None
    vector_dim: int | None = None
    labels: tuple[str, ...] | None = None

    @classmethod
    def for_bundle(cls, bundle: EdgeBundle, labels: Iterable[object] | None = None,
                   **sizes: int) -> Limits:
        """Limits of payloads made with ``bundle`` (an EdgeBundle), optionally for a task
        whose class names are ``labels``."""
        enc = bundle.meta.get("encoder") or {}
        out_dim = enc.get("output_dim")
        return cls(vocab_size=bundle.vocab_size, dim=bundle.dim,
                   vector_dim=int(out_dim) if out_dim is not None else None,
                   labels=tuple(str(x) for x in labels) if labels is not None else None,
                   **sizes)


DEFAULT_LIMITS = Limits()


def limits_of(info: ValidationInfo) -> Limits:
    ctx = info.context if isinstance(info.context, dict) else {}
    lim = ctx.get("limits")
    if lim is not None and not isinstance(lim, Limits):
        raise TypeError(f"context['limits'] must be a Limits, got {type(lim).__name__}")
    return lim or DEFAULT_LIMITS


NonNegInt = Annotated[int, Field(strict=True, ge=0, le=2**31 - 1)]
PosInt = Annotated[int, Field(strict=True, ge=1, le=2**31 - 1)]
PosFloat = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]
STRICT = ConfigDict(extra="forbid", frozen=True)


class Array(BaseModel):
    """An n-d array: dtype, shape and base64 (standard, padded) little-endian bytes."""

    model_config = STRICT
    dtype: DType
    shape: Annotated[tuple[NonNegInt, ...], Field(max_length=8)]
    data: Annotated[str, Field(pattern=_B64)]
    _values: np.ndarray = PrivateAttr()

    @property
    def size(self) -> int:
        """Number of values, prod(shape)."""
        return math.prod(self.shape)

    def nbytes(self) -> int:
        """Decoded byte length the shape and dtype call for."""
        if self.dtype == "bits":
            return (self.size + 7) // 8
        return self.size * np.dtype(DTYPES[self.dtype]).itemsize

    @model_validator(mode="after")
    def _decode(self, info: ValidationInfo) -> Array:
        private = getattr(self, "__pydantic_private__", None) or {}
        if "_values" in private:  # built by encode_array from checked values (never from JSON)
            if self.nbytes() > limits_of(info).max_array_bytes:
                raise ValueError(f"array of {self.nbytes()} bytes exceeds max_array_bytes="
                                 f"{limits_of(info).max_array_bytes}")
            return self
        n = self.nbytes()
        limit = limits_of(info).max_array_bytes
        if n > limit:
            raise ValueError(f"array of {n} bytes exceeds max_array_bytes={limit}")
        if len(self.data) != 4 * ((n + 2) // 3):
            raise ValueError(f"data must be base64 of {n} bytes for dtype "
                             f"{self.dtype} and shape {self.shape}")
        try:
            raw = b64decode(self.data, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"data is not valid base64: {exc}") from None
        if len(raw) != n or b64encode(raw).decode("ascii") != self.data:
            raise ValueError(f"data must be canonical base64 of {n} bytes")
        buf = np.frombuffer(raw, dtype=DTYPES[self.dtype])
        if self.dtype == "bits":
            pad = (-self.size) % 8
            if pad and buf[-1] & ((1 << pad) - 1):
                raise ValueError("padding bits after the last bit must be zero")
            values = np.unpackbits(buf, count=self.size)
        else:
            values = buf.astype(buf.dtype.newbyteorder("="), copy=False)
            if self.dtype in FLOAT_DTYPES and not np.isfinite(values).all():
                raise ValueError("float array contains NaN or Inf")
        values = values.reshape(self.shape)
        values.flags.writeable = False
        self._values = values
        return self

    def __eq__(self, other: object) -> bool:  # the cached numpy array has no plain ==
        return isinstance(other, Array) and self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash((self.dtype, self.shape, self.data))

    def to_numpy(self) -> np.ndarray:
        """A writable native-endian copy; bits come back as uint8 0/1 of ``shape``."""
        return self._values.copy()


def _checked(arr: npt.ArrayLike, dtype: str) -> np.ndarray:
    """``arr`` as a private C-ordered array of the wire dtype (bits: uint8 0/1), checked:
    finite floats after the cast, integers in int32 range, bits 0 or 1."""
    a = np.asarray(arr)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {dtype!r}")
    if a.dtype.kind not in "biuf":
        raise ValueError(f"arr must be a numeric array, got dtype {a.dtype}")
    if a.ndim > 8:
        raise ValueError(f"arrays have at most 8 dimensions, got {a.ndim}")
    if dtype == "bits":
        if a.size and not np.isin(a, (0, 1)).all():
            raise ValueError("bits must be 0 or 1")
        return a.astype(np.uint8, order="C")
    if dtype == "int32":
        if a.dtype.kind not in "biu":
            raise ValueError(f"int32 arrays take integer input, got dtype {a.dtype}")
        if a.size and (a.min() < -(2**31) or a.max() > 2**31 - 1):
            raise ValueError("values out of int32 range")
        return a.astype("<i4", order="C")
    with np.errstate(over="ignore", invalid="ignore"):
        cast = a.astype(DTYPES[dtype], order="C")  # always a copy: ours, not the caller's
    if not np.isfinite(cast).all():
        raise ValueError(f"arr contains NaN or Inf (after the cast to {dtype})")
    return cast


def wrap_array(dtype: str, values: np.ndarray, data: str) -> Array:
    """An Array of checked ``values`` (read-only, native order) and their base64 ``data``."""
    # dtype: one of DTYPES, checked by the caller (_checked or the payload's schema)
    out = Array.model_construct(dtype=cast(DType, dtype), shape=tuple(int(x) for x in values.shape),
                                data=data)
    values = values.astype(values.dtype.newbyteorder("="), copy=False)
    values.flags.writeable = False
    out._values = values
    return out


def _too_big(nbytes: int, limits: Limits | None) -> None:
    lim = limits or DEFAULT_LIMITS
    if nbytes > lim.max_array_bytes:
        raise ValueError(f"array of {nbytes} bytes exceeds max_array_bytes={lim.max_array_bytes}")


def encode_array(arr: np.ndarray, dtype: str, limits: Limits | None = None) -> Array:
    """Cast ``arr`` to ``dtype`` and wrap it as a validated :class:`Array`.

    Floats must stay finite after the cast, int32 takes integers in range, and
    "bits" takes an array of 0/1 values. The base64 is canonical by construction, so
    the Array keeps the checked values as its decoded view (no decode round trip).
    """
    values = _checked(arr, dtype)
    raw = np.packbits(values.ravel()).tobytes() if dtype == "bits" else values.tobytes()
    _too_big(len(raw), limits)
    return wrap_array(dtype, values, b64encode(raw).decode("ascii"))


def encode_rows(arr: np.ndarray, lengths: Sequence[int] | np.ndarray, dtype: str,
                limits: Limits | None = None) -> list[Array]:
    """``encode_array`` of consecutive slices of ``arr`` along its first axis, of the
    given ``lengths`` (summing to ``len(arr)``): one cast, one check and, when a row is a
    whole number of base64 groups (3 bytes; 384 float32 or float16 values are), one base64
    encoding for all of them. Not for "bits" (each array is packed on its own)."""
    values, starts, ends, datas = encoded_rows(arr, lengths, dtype, limits)
    return [wrap_array(dtype, values[a:b], d) for a, b, d in zip(starts, ends, datas, strict=True)]


def encoded_rows(arr: np.ndarray, lengths: Sequence[int] | np.ndarray, dtype: str,
                 limits: Limits | None = None
                 ) -> tuple[np.ndarray, list[int], list[int], list[str]]:
    """What :func:`encode_rows` wraps: (checked values, row starts, row ends, base64 of
    each slice), without building an Array per slice."""
    if dtype == "bits":
        raise ValueError("encode_rows does not pack bits: use encode_array per array")
    values = _checked(arr, dtype)
    if values.ndim == 0:
        raise ValueError("encode_rows needs an array with a first axis")
    ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
    if ends.size and (ends[-1] != values.shape[0] or (np.diff(ends, prepend=0) < 0).any()):
        raise ValueError(f"lengths must be >= 0 and sum to {values.shape[0]}")
    row = values.dtype.itemsize * math.prod(values.shape[1:])
    if ends.size:
        _too_big(int(np.diff(ends, prepend=0).max()) * row, limits)
    starts = (ends - np.diff(ends, prepend=0)).tolist()
    ends = ends.tolist()
    if row % 3 == 0:
        text = b64encode(values.data.cast("B")).decode("ascii")  # no padding inside
        chars = row // 3 * 4
        datas = [text[a * chars: b * chars] for a, b in zip(starts, ends, strict=True)]
    else:
        raw = values.data.cast("B")
        datas = [b64encode(raw[a * row: b * row]).decode("ascii")
                 for a, b in zip(starts, ends, strict=True)]
    return values, starts, ends, datas
