"""The wire contract: privatized payloads and labelled records (pydantic v2).

A payload names its mechanism, parameters and edge bundle, and carries one
array as base64 of little-endian bytes with an explicit dtype and shape
(bits packed with ``numpy.packbits``). There is no field that can hold raw
text: every string is a literal, a hex digest, a short class name, or base64
whose decoded length is checked against the shape. Extra fields are refused.

Size limits come from a :class:`Limits` in pydantic's validation context::

    Record.model_validate(obj, context={"limits": Limits(vocab_size=30522)})
"""

from __future__ import annotations

import binascii
import math
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationInfo,
    model_validator,
)

try:  # SIMD base64 (10x the standard library's speed); same bytes, same errors
    from pybase64 import b64decode, b64encode
except ImportError:  # pragma: no cover - the edge and cloud extras install it
    from base64 import b64decode, b64encode

MAX_JSON_BYTES = 8 * 1024 * 1024
DTYPES = {"float16": "<f2", "float32": "<f4", "int32": "<i4", "bits": "u1"}
FLOAT_DTYPES = ("float16", "float32")
_B64 = r"^[A-Za-z0-9+/]*={0,2}$"
_HEX64 = r"^[0-9a-f]{64}$"
_LABEL = r"^[A-Za-z0-9_.:-]{1,64}$"


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
    def for_bundle(cls, bundle, labels=None, **sizes) -> Limits:
        """Limits of payloads made with ``bundle`` (an EdgeBundle), optionally for a task
        whose class names are ``labels``."""
        enc = bundle.meta.get("encoder") or {}
        out_dim = enc.get("output_dim")
        return cls(vocab_size=bundle.vocab_size, dim=bundle.dim,
                   vector_dim=int(out_dim) if out_dim is not None else None,
                   labels=tuple(str(x) for x in labels) if labels is not None else None,
                   **sizes)


_DEFAULT_LIMITS = Limits()


def _limits(info: ValidationInfo) -> Limits:
    ctx = info.context if isinstance(info.context, dict) else {}
    lim = ctx.get("limits")
    if lim is not None and not isinstance(lim, Limits):
        raise TypeError(f"context['limits'] must be a Limits, got {type(lim).__name__}")
    return lim or _DEFAULT_LIMITS


PosFloat = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]
NonNegInt = Annotated[int, Field(strict=True, ge=0, le=2**31 - 1)]
PosInt = Annotated[int, Field(strict=True, ge=1, le=2**31 - 1)]
BundleId = Annotated[str, Field(pattern=_HEX64)]
_STRICT = ConfigDict(extra="forbid", frozen=True)


class Array(BaseModel):
    """An n-d array: dtype, shape and base64 (standard, padded) little-endian bytes."""

    model_config = _STRICT
    dtype: Literal["float16", "float32", "int32", "bits"]
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
            if self.nbytes() > _limits(info).max_array_bytes:
                raise ValueError(f"array of {self.nbytes()} bytes exceeds max_array_bytes="
                                 f"{_limits(info).max_array_bytes}")
            return self
        n = self.nbytes()
        limit = _limits(info).max_array_bytes
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


def encode_array(arr: np.ndarray, dtype: str, limits: Limits | None = None) -> Array:
    """Cast ``arr`` to ``dtype`` and wrap it as a validated :class:`Array`.

    Floats must stay finite after the cast, int32 takes integers in range, and
    "bits" takes an array of 0/1 values.
    """
    a = np.asarray(arr)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {dtype!r}")
    if a.dtype.kind not in "biuf":
        raise ValueError(f"arr must be a numeric array, got dtype {a.dtype}")
    if dtype == "bits":
        if a.size and not np.isin(a, (0, 1)).all():
            raise ValueError("bits must be 0 or 1")
        raw = np.packbits(a.astype(np.uint8).ravel()).tobytes()
    elif dtype == "int32":
        if a.dtype.kind not in "biu":
            raise ValueError(f"int32 arrays take integer input, got dtype {a.dtype}")
        if a.size and (a.min() < -(2**31) or a.max() > 2**31 - 1):
            raise ValueError("values out of int32 range")
        raw = a.astype("<i4").tobytes()
    else:
        target = np.dtype(DTYPES[dtype])
        if a.dtype == target:
            cast = a
        else:
            with np.errstate(over="ignore", invalid="ignore"):
                cast = a.astype(target)
        if not np.isfinite(cast).all():
            raise ValueError(f"arr contains NaN or Inf (after the cast to {dtype})")
        raw = cast.tobytes()
    lim = limits or _DEFAULT_LIMITS
    if len(raw) > lim.max_array_bytes:
        raise ValueError(f"array of {len(raw)} bytes exceeds max_array_bytes={lim.max_array_bytes}")
    if a.ndim > 8:
        raise ValueError(f"arrays have at most 8 dimensions, got {a.ndim}")
    # Built from checked numpy values: the base64 is canonical by construction, so the
    # decoded view is the array itself (no decode round trip on the device's hot path).
    out = Array.model_construct(dtype=dtype, shape=tuple(int(x) for x in a.shape),
                                data=b64encode(raw).decode("ascii"))
    values = np.frombuffer(raw, dtype=DTYPES[dtype])
    if dtype == "bits":
        values = np.unpackbits(values, count=a.size)
    values = values.astype(values.dtype.newbyteorder("="), copy=False).reshape(a.shape)
    values.flags.writeable = False
    out._values = values
    return out


def _in_range(name: str, value: int, hi: int) -> None:
    if not 1 <= value <= hi:
        raise ValueError(f"{name} must be in [1, {hi}], got {value}")


def _expect(name: str, value: int, want: int | None) -> None:
    if want is not None and value != want:
        raise ValueError(f"{name} must be {want} for this bundle, got {value}")


class DChiParams(BaseModel):
    """dχ-privacy: η > 0."""

    model_config = _STRICT
    eta: PosFloat


class LaplaceParams(BaseModel):
    """DPNR: ε > 0, calibration, word dropout μ in [0, 1)."""

    model_config = _STRICT
    epsilon: PosFloat
    calibration: Literal["vector", "coordinate"] = "vector"
    word_dropout: Annotated[float, Field(strict=True, ge=0, lt=1)] = 0.0


class OMEParams(BaseModel):
    """OME: ε > 0, λ > 0, fixed-point layout (1 sign + int_bits + frac_bits)."""

    model_config = _STRICT
    epsilon: PosFloat
    lam: PosFloat
    int_bits: Annotated[int, Field(strict=True, ge=0, le=29)] = 4
    frac_bits: Annotated[int, Field(strict=True, ge=0, le=29)] = 5

    @model_validator(mode="after")
    def _total(self) -> OMEParams:
        if not 1 <= self.int_bits + self.frac_bits <= 30:
            raise ValueError("int_bits + frac_bits must be between 1 and 30")
        return self

    @property
    def bits_per_value(self) -> int:
        """l = 1 + int_bits + frac_bits."""
        return 1 + self.int_bits + self.frac_bits


class TextHideParams(BaseModel):
    """TextHide: pool of m masks, k examples mixed."""

    model_config = _STRICT
    m: PosInt
    k: PosInt


class NoneParams(BaseModel):
    """No privatization (Null-privacy baseline): no parameters."""

    model_config = _STRICT


class _Base(BaseModel):
    model_config = _STRICT
    version: Literal[1] = 1
    bundle_id: BundleId
    array_field: ClassVar[str] = ""
    array_dtypes: ClassVar[tuple[str, ...]] = ("float32",)
    array_ndim: ClassVar[int] = 1

    def data_array(self) -> np.ndarray:
        """The payload's array as numpy (see :meth:`Array.to_numpy`)."""
        return getattr(self, self.array_field).to_numpy()

    @model_validator(mode="after")
    def _check_array(self, info: ValidationInfo) -> _Base:
        arr, name = getattr(self, self.array_field), self.array_field
        if arr.dtype not in self.array_dtypes:
            raise ValueError(f"{name} must have dtype in {self.array_dtypes}, got {arr.dtype!r}")
        if len(arr.shape) != self.array_ndim:
            raise ValueError(f"{name} must have {self.array_ndim} dimension(s), got {arr.shape}")
        self._check_shape(arr, _limits(info))
        return self

    def _check_shape(self, arr: Array, lim: Limits) -> None:
        _in_range("vector dimension r", arr.shape[0], lim.max_dim)
        _expect("vector dimension r", arr.shape[0], lim.vector_dim)


class _TokenBase(_Base):
    segments: Annotated[list[PosInt], Field(min_length=1, max_length=2)] | None = None
    array_field: ClassVar[str] = "token_ids"
    array_dtypes: ClassVar[tuple[str, ...]] = ("int32",)

    @property
    def n_tokens(self) -> int:
        """L, the number of tokens."""
        return getattr(self, self.array_field).shape[0]

    def _check_shape(self, arr: Array, lim: Limits) -> None:
        _in_range("number of tokens L", self.n_tokens, lim.max_tokens)
        if self.segments is not None and sum(self.segments) != self.n_tokens:
            raise ValueError(f"segments {self.segments} must sum to L={self.n_tokens}")
        if arr.dtype != "int32":
            return
        ids = arr._values
        if ids.min() < 0:
            raise ValueError("token ids must be >= 0")
        if lim.vocab_size is not None and ids.max() >= lim.vocab_size:
            raise ValueError(f"token ids must be < vocab_size={lim.vocab_size}, got {ids.max()}")


class DChiEmbeddingPayload(_TokenBase):
    """Perturbed token embeddings, shape (L, n)."""

    mechanism: Literal["dchi-embedding"]
    params: DChiParams
    embeddings: Array
    array_field: ClassVar[str] = "embeddings"
    array_dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES
    array_ndim: ClassVar[int] = 2

    def _check_shape(self, arr: Array, lim: Limits) -> None:
        super()._check_shape(arr, lim)
        _in_range("embedding dimension n", arr.shape[1], lim.max_dim)
        _expect("embedding dimension n", arr.shape[1], lim.dim)


class DChiTextPayload(_TokenBase):
    """Privatized token ids, int32 (L,)."""

    mechanism: Literal["dchi-text"]
    params: DChiParams
    token_ids: Array


class NonePayload(_TokenBase):
    """Plain token ids, int32 (L,); only for the Null-privacy baseline."""

    mechanism: Literal["none"]
    params: NoneParams = Field(default_factory=NoneParams)
    token_ids: Array


class LaplacePayload(_Base):
    """DPNR noisy sentence vector, float32 (r,)."""

    mechanism: Literal["laplace"]
    params: LaplaceParams
    vector: Array
    array_field: ClassVar[str] = "vector"


class TextHidePayload(_Base):
    """TextHide mixed and masked vector, float32 (r,)."""

    mechanism: Literal["texthide"]
    params: TextHideParams
    vector: Array
    array_field: ClassVar[str] = "vector"


class OMEPayload(_Base):
    """OME perturbed bits, r·l of them with l = 1 + int_bits + frac_bits."""

    mechanism: Literal["ome"]
    params: OMEParams
    bits: Array
    array_field: ClassVar[str] = "bits"
    array_dtypes: ClassVar[tuple[str, ...]] = ("bits",)

    def _check_shape(self, arr: Array, lim: Limits) -> None:
        n, per = arr.shape[0], self.params.bits_per_value
        if n == 0 or n % per:
            raise ValueError(f"number of bits must be a positive multiple of l={per}, got {n}")
        _in_range("number of bits", n, lim.max_bits)
        _in_range("vector dimension r", n // per, lim.max_dim)
        _expect("vector dimension r", n // per, lim.vector_dim)


Payload = Annotated[
    DChiEmbeddingPayload | DChiTextPayload | LaplacePayload | OMEPayload | TextHidePayload
    | NonePayload,
    Field(discriminator="mechanism"),
]
PAYLOAD_ADAPTER: TypeAdapter[Payload] = TypeAdapter(Payload)
SoftLabel = Annotated[
    list[Annotated[float, Field(strict=True, allow_inf_nan=False)]],
    Field(min_length=1, max_length=1000),
]


class Record(BaseModel):
    """One labelled privatized example (a JSONL line of the edge agent)."""

    model_config = _STRICT
    payload: Payload
    label: Annotated[int, Field(strict=True)] | SoftLabel | Annotated[
        str, Field(pattern=_LABEL)] | None = None

    @model_validator(mode="after")
    def _known_label(self, info: ValidationInfo) -> Record:
        """With ``Limits.labels``: a class name of the task, an index into it, or a soft
        label of its length (a free-form string cannot carry text to a server that checks)."""
        names = _limits(info).labels
        lab = self.label
        if names is None or lab is None:
            return self
        if isinstance(lab, str) and lab not in names:
            raise ValueError(f"label is not one of the task's {len(names)} class names")
        if isinstance(lab, int) and not 0 <= lab < len(names):
            raise ValueError(f"label index must be in [0, {len(names)}), got {lab}")
        if isinstance(lab, list) and len(lab) != len(names):
            raise ValueError(f"soft label must have {len(names)} values, got {len(lab)}")
        return self


_KINDS = {  # mechanism -> (array field, array dtype; None = float_dtype)
    "dchi-embedding": ("embeddings", None),
    "dchi-text": ("token_ids", "int32"),
    "none": ("token_ids", "int32"),
    "laplace": ("vector", "float32"),
    "texthide": ("vector", "float32"),
    "ome": ("bits", "bits"),
}


def make_payload(mechanism: str, params: dict, bundle_id: str, data: np.ndarray,
                 segments: list[int] | None = None, float_dtype: str = "float32",
                 limits: Limits | None = None) -> Payload:
    """Build and validate the payload of ``mechanism`` around ``data``."""
    if mechanism not in _KINDS:
        raise ValueError(f"mechanism must be one of {tuple(_KINDS)}, got {mechanism!r}")
    if float_dtype not in FLOAT_DTYPES:
        raise ValueError(f"float_dtype must be one of {FLOAT_DTYPES}, got {float_dtype!r}")
    field, dtype = _KINDS[mechanism]
    obj: dict[str, Any] = {"mechanism": mechanism, "params": params, "bundle_id": bundle_id,
                           field: encode_array(data, dtype or float_dtype, limits)}
    if segments is not None:
        obj["segments"] = [int(s) if isinstance(s, np.integer) else s for s in segments]
    return PAYLOAD_ADAPTER.validate_python(obj, context={"limits": limits or _DEFAULT_LIMITS})


def _parse(validator, obj: dict | str | bytes, limits: Limits | None):
    lim = limits or _DEFAULT_LIMITS
    ctx = {"limits": lim}
    if isinstance(obj, str | bytes | bytearray):
        n = len(obj) if not isinstance(obj, str) else len(obj.encode("utf-8", "surrogatepass"))
        if n > lim.max_json_bytes:
            raise ValueError(f"JSON of {n} bytes exceeds max_json_bytes={lim.max_json_bytes}")
        return validator.validate_json(obj, context=ctx)
    return validator.validate_python(obj, context=ctx)


_RECORD_ADAPTER = TypeAdapter(Record)


def parse_payload(obj: dict | str | bytes, limits: Limits | None = None) -> Payload:
    """Validate a payload given as a dict or JSON text."""
    return _parse(PAYLOAD_ADAPTER, obj, limits)


def parse_record(obj: dict | str | bytes, limits: Limits | None = None) -> Record:
    """Validate a record (payload + optional label) given as a dict or JSON text."""
    return _parse(_RECORD_ADAPTER, obj, limits)
