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

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeAlias, TypeVar, Union

import numpy as np
from pydantic import (
    BaseModel,
    Field,
    TypeAdapter,
    ValidationInfo,
    create_model,
    model_validator,
)

from shared.arrays import (
    DEFAULT_LIMITS,
    FLOAT_DTYPES,
    STRICT,
    Array,
    Limits,
    PosInt,
    encode_array,
    encode_rows,
    limits_of,
)
from shared.mechanisms import registry
from shared.mechanisms.binary import OMEParams
from shared.mechanisms.dchi import DChiParams
from shared.mechanisms.laplace import LaplaceParams
from shared.mechanisms.plain import NoneParams
from shared.mechanisms.texthide import TextHideParams

_HEX64 = r"^[0-9a-f]{64}$"
_LABEL = r"^[A-Za-z0-9_.:-]{1,64}$"
BundleId = Annotated[str, Field(pattern=_HEX64)]


def _in_range(name: str, value: int, hi: int) -> None:
    if not 1 <= value <= hi:
        raise ValueError(f"{name} must be in [1, {hi}], got {value}")


def _expect(name: str, value: int, want: int | None) -> None:
    if want is not None and value != want:
        raise ValueError(f"{name} must be {want} for this bundle, got {value}")


class _Base(BaseModel):
    model_config = STRICT
    version: Literal[1] = 1
    bundle_id: BundleId
    array_field: ClassVar[str] = ""
    array_dtypes: ClassVar[tuple[str, ...]] = ("float32",)
    array_ndim: ClassVar[int] = 1

    def data_array(self) -> np.ndarray:
        """The payload's array as numpy (see :meth:`Array.to_numpy`)."""
        arr: Array = getattr(self, self.array_field)
        return arr.to_numpy()

    @model_validator(mode="after")
    def _check_array(self, info: ValidationInfo) -> _Base:
        arr, name = getattr(self, self.array_field), self.array_field
        if arr.dtype not in self.array_dtypes:
            raise ValueError(f"{name} must have dtype in {self.array_dtypes}, got {arr.dtype!r}")
        if len(arr.shape) != self.array_ndim:
            raise ValueError(f"{name} must have {self.array_ndim} dimension(s), got {arr.shape}")
        self._check_shape(arr, limits_of(info))
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
        arr: Array = getattr(self, self.array_field)
        return arr.shape[0]

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
            # the offending id is payload data: not repeated in the message (it goes back
            # to the sender in a 422 and may be logged by a caller)
            raise ValueError(f"token ids must be < vocab_size={lim.vocab_size} (another "
                             "bundle's vocabulary, or not little-endian int32?)")


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


def _plugin_payload(mech: Any) -> type[_Base]:
    """The payload class of a mechanism added by a plugin (``shared.mechanisms.registry``):
    token ids or one float32 vector, with the mechanism's own params model."""
    kind = mech.payload_kind
    base: type[_Base]
    if kind is registry.PayloadKind.TOKENS:
        base, field = _TokenBase, "token_ids"
    elif kind is registry.PayloadKind.VECTOR:
        base, field = _Base, "vector"
    else:
        raise ValueError(f"mechanism {mech.name}: a plugin's payload carries tokens or a "
                         f"vector, not {kind}")
    cls: type[_Base] = create_model(  # type: ignore[call-overload]
        f"{mech.__name__}Payload", __base__=base, __module__=__name__,
        mechanism=(Literal[mech.name], ...), params=(mech.Params, ...), **{field: (Array, ...)})
    cls.array_field = field
    return cls


# the built-in mechanisms' payloads (their order is the order of the discriminator's tags in
# error messages), then those of plugins
_BUILT_IN = (DChiEmbeddingPayload, DChiTextPayload, LaplacePayload, OMEPayload,
             TextHidePayload, NonePayload)
PAYLOAD_CLASSES: dict[str, type[_Base]] = {
    cls.model_fields["mechanism"].annotation.__args__[0]: cls  # type: ignore[union-attr]
    for cls in _BUILT_IN}
PAYLOAD_CLASSES.update({m.name: _plugin_payload(m) for m in registry.mechanisms()
                        if m.name not in PAYLOAD_CLASSES})
if TYPE_CHECKING:  # the union is built at run time from the registry (plugins included)
    Payload: TypeAlias = Any
else:
    Payload = Annotated[Union[tuple(PAYLOAD_CLASSES.values())],  # noqa: UP007 (a tuple)
                        Field(discriminator="mechanism")]
PAYLOAD_ADAPTER: TypeAdapter[Payload] = TypeAdapter(Payload)
SoftLabel = Annotated[
    list[Annotated[float, Field(strict=True, allow_inf_nan=False)]],
    Field(min_length=1, max_length=1000),
]


class Record(BaseModel):
    """One labelled privatized example (a JSONL line of the edge agent)."""

    model_config = STRICT
    payload: Payload
    label: Annotated[int, Field(strict=True)] | SoftLabel | Annotated[
        str, Field(pattern=_LABEL)] | None = None

    @model_validator(mode="after")
    def _known_label(self, info: ValidationInfo) -> Record:
        """With ``Limits.labels``: a class name of the task, an index into it, or a soft
        label of its length (a free-form string cannot carry text to a server that checks)."""
        names = limits_of(info).labels
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


# every mechanism name a payload may carry, in the order the CLIs list them
MECHANISMS = registry.names()
PAYLOAD_FIELDS = {  # mechanism -> (array field, array dtype; None = float_dtype)
    name: (cls.array_field, cls.array_dtypes[0] if len(cls.array_dtypes) == 1 else None)
    for name, cls in PAYLOAD_CLASSES.items()}


def make_payload(mechanism: str, params: dict[str, Any], bundle_id: str, data: np.ndarray,
                 segments: list[int] | None = None, float_dtype: str = "float32",
                 limits: Limits | None = None) -> Payload:
    """Build and validate the payload of ``mechanism`` around ``data``."""
    if mechanism not in PAYLOAD_FIELDS:
        raise ValueError(f"mechanism must be one of {tuple(PAYLOAD_FIELDS)}, got {mechanism!r}")
    if float_dtype not in FLOAT_DTYPES:
        raise ValueError(f"float_dtype must be one of {FLOAT_DTYPES}, got {float_dtype!r}")
    field, dtype = PAYLOAD_FIELDS[mechanism]
    obj: dict[str, Any] = {"mechanism": mechanism, "params": params, "bundle_id": bundle_id,
                           field: encode_array(data, dtype or float_dtype, limits)}
    if segments is not None:
        obj["segments"] = [int(s) if isinstance(s, np.integer) else s for s in segments]
    return PAYLOAD_ADAPTER.validate_python(obj, context={"limits": limits or DEFAULT_LIMITS})


def make_payloads(mechanism: str, params: dict[str, Any], bundle_id: str, data: np.ndarray,
                  lengths: Sequence[int] | np.ndarray,
                  segments: list[list[int] | None] | None = None,
                  float_dtype: str = "float32", limits: Limits | None = None) -> list[Payload]:
    """Payloads of a token mechanism around consecutive rows of ``data`` (``lengths[i]``
    rows each): :func:`make_payload` with one cast, check and base64 pass for the batch
    (:func:`shared.arrays.encode_rows`)."""
    if mechanism not in PAYLOAD_FIELDS or not registry.get(mechanism).payload_kind.reads_tokens:
        raise ValueError(f"make_payloads is for token mechanisms, got {mechanism!r}")
    if float_dtype not in FLOAT_DTYPES:
        raise ValueError(f"float_dtype must be one of {FLOAT_DTYPES}, got {float_dtype!r}")
    field, dtype = PAYLOAD_FIELDS[mechanism]
    arrays = encode_rows(data, lengths, dtype or float_dtype, limits)
    segments = segments if segments is not None else [None] * len(arrays)
    ctx = {"limits": limits or DEFAULT_LIMITS}
    out = []
    for arr, seg in zip(arrays, segments, strict=True):
        obj: dict[str, Any] = {"mechanism": mechanism, "params": params, "bundle_id": bundle_id,
                               field: arr}
        if seg is not None:
            obj["segments"] = [int(x) for x in seg]
        out.append(PAYLOAD_ADAPTER.validate_python(obj, context=ctx))
    return out


_T = TypeVar("_T")


def _parse(validator: TypeAdapter[_T], obj: dict[str, Any] | str | bytes,
           limits: Limits | None) -> _T:
    lim = limits or DEFAULT_LIMITS
    ctx = {"limits": lim}
    if isinstance(obj, str | bytes | bytearray):
        n = len(obj) if not isinstance(obj, str) else len(obj.encode("utf-8", "surrogatepass"))
        if n > lim.max_json_bytes:
            raise ValueError(f"JSON of {n} bytes exceeds max_json_bytes={lim.max_json_bytes}")
        return validator.validate_json(obj, context=ctx)
    return validator.validate_python(obj, context=ctx)


_RECORD_ADAPTER = TypeAdapter(Record)


def parse_payload(obj: dict[str, Any] | str | bytes, limits: Limits | None = None) -> Payload:
    """Validate a payload given as a dict or JSON text."""
    return _parse(PAYLOAD_ADAPTER, obj, limits)


def parse_record(obj: dict[str, Any] | str | bytes, limits: Limits | None = None) -> Record:
    """Validate a record (payload + optional label) given as a dict or JSON text."""
    return _parse(_RECORD_ADAPTER, obj, limits)
