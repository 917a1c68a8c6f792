"""Mechanisms by name: the ``Mechanism`` protocol, the registry, and the one factory the
edge, the models and the server build mechanisms with.

One class per mechanism, one line registers it (``shared/mechanisms/__init__.py``, as Opacus
registers its accountants)::

    class Laplace(BaseMechanism): name = "laplace"; Params = LaplaceParams; ...

    create("laplace", {"epsilon": 8.0}, bundle)   # the object, from a name and parameters
    get("laplace").payload_kind                   # what the class says about itself

A class says what it is -- its ``name``, typed ``Params`` (the pydantic model of the wire),
``payload_kind``, budget ``family``, whether it is ``private`` at all -- and builds itself
with ``from_params(params, bundle)``. Code elsewhere asks these, never the name.

Cost, floor and guarantee: each object answers :meth:`Mechanism.cost`,
:meth:`Mechanism.weak_privacy_reason`, :meth:`Mechanism.check_computable` and
:meth:`Mechanism.guarantee` through the :class:`Aspect` tables here. Each mechanism's module
registers its own functions in them (``@COST.register(Laplace)``), beside its sampler, as a
plugin does; the generic math they use (``shared.ledger``'s ``Cost``, ``shared.floor``'s
measurements, ``shared.accounting``'s formulas) imports no mechanism module, only this
registry, so the dependency points one way (``tests/test_import_layers.py``). The
``shared`` package imports the mechanisms when it is imported, so the tables are full
before any mechanism object exists.

Plugins: an installed distribution may add mechanisms through the entry-point group
``privbert.mechanisms`` (each entry point names a mechanism class; loading it registers
it). Entry points are read from the distributions on ``sys.path`` -- what is installed, or
what ``PYTHONPATH`` adds, which decides what code runs anyway -- never from a request, a
model folder or any file the service reads, so a plugin is exactly as trusted as the
installed code. The tests use it to add a toy mechanism to the real edge CLI and server. A
plugin must not import ``shared.payload`` (the payload union is built from the registry,
after the plugins are loaded).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel

if TYPE_CHECKING:
    import numpy as np

    from shared.bundle import EdgeBundle

PLUGIN_GROUP = "privbert.mechanisms"
R = TypeVar("R")  # what an Aspect's functions return
F = TypeVar("F", bound=Callable[..., Any])


class PayloadKind(StrEnum):
    """What a mechanism's payload carries (``shared.payload``), and so which classifier
    reads it."""

    TOKENS = "tokens"  # int32 token ids (L,)
    EMBEDDINGS = "embeddings"  # float token embeddings (L, n)
    VECTOR = "vector"  # one float32 sentence vector (r,)
    BITS = "bits"  # r·l bits of a fixed-point sentence vector

    @property
    def reads_tokens(self) -> bool:
        """Tokens or embeddings: one row per word piece (the edge tokenizes, no encoder)."""
        return self in (PayloadKind.TOKENS, PayloadKind.EMBEDDINGS)

    @property
    def classifier(self) -> str:
        """"tokens", "embeddings" or "vector": the classifier that reads this payload."""
        return "vector" if self is PayloadKind.BITS else self.value


class UnknownMechanism(ValueError):
    """A name no registered mechanism has."""


class MissingParameter(ValueError):
    """``from_params`` lacks a parameter; ``param`` names it (each surface words it)."""

    def __init__(self, mechanism: str, param: str):
        super().__init__(f"{mechanism} needs {param}")
        self.mechanism, self.param = mechanism, param


class NoEncoder(ValueError):
    """The mechanism works on sentence vectors and the bundle has no frozen encoder."""

    def __init__(self, mechanism: str, bundle_id: str | None):
        where = f"bundle {bundle_id[:12]}… has none" if bundle_id else "no bundle was given"
        super().__init__(f"{mechanism} needs a bundle with the frozen sentence encoder "
                         f"(encoder.onnx) or the sentence-vector size; {where}")
        self.mechanism, self.bundle_id = mechanism, bundle_id


# -- the per-class functions: each mechanism's cost, floor and guarantee ---------------------
class Aspect(Generic[R]):
    """A function per mechanism class, registered by the mechanism's module (or a
    plugin's); looked up along the class's MRO (a subclass inherits its parent's). ``R``:
    what each function returns."""

    def __init__(self, what: str, default: Callable[..., R] | None = None):
        self.what = what
        self.default = default  # for a class nothing registered for; None: TypeError
        self._impl: dict[type, Callable[..., R]] = {}

    def register(self, *classes: type) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            for cls in classes:
                self._impl[cls] = fn
            return fn
        return deco

    def of(self, cls: type) -> Callable[..., R]:
        for c in cls.__mro__:
            if c in self._impl:
                return self._impl[c]
        if self.default is not None:
            return self.default
        raise TypeError(f"no {self.what} for {cls.__name__}")


# COST's functions return shared.ledger's Cost, which imports this module: Any here
COST: Aspect[Any] = Aspect("budget cost")  # (cls, params, *, tokens, dim, diameter[, public])
FLOOR: Aspect[str | None] = Aspect("privacy floor")  # (mech, bundle, *, threshold, dim, rng)
COMPUTABLE: Aspect[None] = Aspect("computability check",  # (mech, bundle, *, dim, float_dtype)
                                  default=lambda *args, **kwargs: None)  # nothing can overflow
GUARANTEE: Aspect[dict[str, Any]] = Aspect("accounting")  # (mech, bundle, *, dim, sample)


# -- the protocol ---------------------------------------------------------------------------------
@runtime_checkable
class Mechanism(Protocol):
    """What every mechanism object offers (:class:`BaseMechanism` implements the plumbing)."""

    name: ClassVar[str]
    payload_kind: ClassVar[PayloadKind]
    family: ClassVar[str]
    private: ClassVar[bool]
    has_epsilon: ClassVar[bool]

    @property
    def Params(self) -> type[BaseModel]:  # read-only: a class narrows it to its own model
        ...

    @property
    def params(self) -> dict[str, Any]: ...

    def cost(self, *, tokens: int | None = None, dim: int | None = None,
             diameter: float | None = None) -> Any: ...

    def weak_privacy_reason(self, bundle: EdgeBundle | None = None, *, threshold: float,
                            dim: int | None = None, rng: Any = None) -> str | None: ...

    def check_computable(self, bundle: EdgeBundle | None = None, *, dim: int | None = None,
                         float_dtype: str = "float32") -> None: ...

    def guarantee(self, bundle: EdgeBundle | None = None, *, dim: int | None = None,
                  sample: int = 2000) -> dict[str, Any]: ...


class BaseMechanism:
    """The base of the registered mechanisms: class-level facts, the factory hook, and the
    methods that reach the ledger, the floor and the accounting through :class:`Aspect`.

    Class attributes: ``name`` (the wire's ``mechanism``), ``Params`` (the wire's params
    model), ``payload_kind``, ``family`` (the ledger's budget family), ``private`` (False
    only for the named Null-privacy baseline), ``has_epsilon`` (False where there is no
    differential-privacy ε to count or to judge: TextHide, none), ``edge_options`` (edge
    settings besides the parameters that apply to it, e.g. TextHide's key). For the command
    lines, which make a flag of each parameter (``shared.spec``): ``param_help`` (one
    phrase per parameter), ``fixed_params`` (parameters no command line offers: their
    default always, e.g. OME's bit layout), ``edge_defaults`` (the edge's value for a
    required parameter not given, e.g. TextHide's k = 1) and ``param_metavar``.
    """

    name: ClassVar[str] = ""
    Params: ClassVar[type[BaseModel]]
    payload_kind: ClassVar[PayloadKind]
    family: ClassVar[str]
    private: ClassVar[bool] = True
    has_epsilon: ClassVar[bool] = True
    edge_options: ClassVar[frozenset[str]] = frozenset()
    param_help: ClassVar[Mapping[str, str]] = {}
    fixed_params: ClassVar[frozenset[str]] = frozenset()
    edge_defaults: ClassVar[Mapping[str, Any]] = {}
    param_metavar: ClassVar[Mapping[str, str]] = {}

    @property
    def params(self) -> dict[str, Any]:
        raise NotImplementedError

    # -- building ---------------------------------------------------------------------------
    @classmethod
    def from_params(cls, params: Mapping[str, Any], bundle: EdgeBundle | None = None, *,
                    dim: int | None = None, secret: int | None = None) -> BaseMechanism:
        """The object for ``params`` (a model's or task's stored parameters) on ``bundle``.
        ``dim``: the sentence-vector size r where the bundle's encoder does not give it;
        ``secret``: the client's secret (TextHide's mask-pool seed). ValueError for a
        missing or invalid parameter."""
        raise NotImplementedError

    @classmethod
    def param_names(cls) -> tuple[str, ...]:
        return tuple(cls.Params.model_fields)

    @classmethod
    def required_params(cls) -> tuple[str, ...]:
        """Parameters without a default on the wire."""
        return tuple(n for n, f in cls.Params.model_fields.items() if f.is_required())

    @classmethod
    def canonical_params(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` validated by :attr:`Params`, defaults filled in (pydantic's
        ValidationError for bad ones)."""
        return cls.Params.model_validate(dict(params)).model_dump()

    @classmethod
    def compared_params(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters a payload must share with the model or task it is sent to."""
        return dict(params)

    @classmethod
    def prediction_params(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters predictions are made with, for a model trained with ``params``."""
        return dict(params)

    @classmethod
    def mixes_inputs(cls, params: Mapping[str, Any]) -> bool:
        """Whether payloads with these parameters mix several inputs and their labels."""
        return False

    @classmethod
    def values_per_dim(cls, params: Mapping[str, Any]) -> int:
        """Payload values per sentence-vector coordinate (bits per value for bit kinds)."""
        return 1

    @property
    def mixes(self) -> bool:
        return type(self).mixes_inputs(self.params)

    @property
    def needs_encoder(self) -> bool:
        return not self.payload_kind.reads_tokens

    # -- what the analysis says, through the registered functions ---------------------------
    @classmethod
    def cost_of(cls, params: Mapping[str, Any], *, tokens: int | None = None,
                dim: int | None = None, diameter: float | None = None,
                **extra: Any) -> Any:
        """``shared.ledger.Cost`` of one payload with ``params`` (no object needed);
        ``extra``: what only some costs read (dχ's ``public``, the token policy's count)."""
        return COST.of(cls)(cls, params, tokens=tokens, dim=dim, diameter=diameter, **extra)

    def cost(self, *, tokens: int | None = None, dim: int | None = None,
             diameter: float | None = None) -> Any:
        """``shared.ledger.Cost`` of one payload of this object."""
        return self.cost_of(self.params, tokens=tokens,
                            dim=dim if dim is not None else getattr(self, "dim", None),
                            diameter=diameter)

    def weak_privacy_reason(self, bundle: EdgeBundle | None = None, *, threshold: float,
                            dim: int | None = None, rng: Any = None) -> str | None:
        """``shared.floor``: None, or why these parameters are weaker than the floor
        (``rng``: what a measured floor draws from; OS entropy by default)."""
        extra = {"rng": rng} if rng is not None else {}  # a plugin's floor may not take one
        return FLOOR.of(type(self))(self, bundle, threshold=threshold, dim=dim, **extra)

    def check_computable(self, bundle: EdgeBundle | None = None, *, dim: int | None = None,
                         float_dtype: str = "float32") -> None:
        """``shared.floor``: ValueError if the float arithmetic cannot carry the noise."""
        COMPUTABLE.of(type(self))(self, bundle, dim=dim, float_dtype=float_dtype)

    def guarantee(self, bundle: EdgeBundle | None = None, *, dim: int | None = None,
                  sample: int = 2000) -> dict[str, Any]:
        """``shared.accounting``: the published and the worst-case guarantee."""
        g = GUARANTEE.of(type(self))(self, bundle, dim=dim, sample=sample)
        return {"mechanism": self.name, "params": dict(self.params), **g}

    # -- privatizing (the edge's ``Privatizer`` calls one of these by payload kind) ----------
    def privatize_tokens(self, ids: np.ndarray, bundle: EdgeBundle,
                         rng: np.random.Generator | None) -> np.ndarray:
        """Token kinds: the payload array for the word-piece ids of a batch."""
        raise TypeError(f"{self.name} does not privatize token ids")

    def privatize_vectors(self, vectors: np.ndarray, onehot: np.ndarray | None,
                          rng: np.random.Generator | None
                          ) -> tuple[np.ndarray, np.ndarray | None]:
        """Vector kinds: (payload arrays, mixed labels or None) for (b, r) sentence
        vectors; ``onehot`` are the labels when :attr:`mixes`."""
        raise TypeError(f"{self.name} does not privatize sentence vectors")


# -- the registry -----------------------------------------------------------------------------
_REGISTRY: dict[str, type[BaseMechanism]] = {}
_plugins_loaded = False


def register(cls: type[BaseMechanism]) -> type[BaseMechanism]:
    """Add ``cls`` under ``cls.name`` (a decorator; one line per mechanism)."""
    name = cls.name
    if not name or _REGISTRY.get(name, cls) is not cls:
        raise ValueError(f"cannot register {cls.__name__} as mechanism {name!r}: "
                         + ("it has no name" if not name else "the name is taken"))
    for attr in ("Params", "payload_kind", "family"):
        if not hasattr(cls, attr):
            raise ValueError(f"mechanism {name} must define {attr}")
    _REGISTRY[name] = cls
    return cls


def load_plugins() -> None:
    """Register the mechanisms of installed distributions (entry-point group
    ``privbert.mechanisms``), once."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=PLUGIN_GROUP):
        try:
            cls = ep.load()
        except Exception as exc:  # a broken install: say which one
            raise RuntimeError(f"mechanism plugin {ep.name} ({ep.value}) failed to load: "
                               f"{exc}") from exc
        if not (isinstance(cls, type) and issubclass(cls, BaseMechanism)):
            raise RuntimeError(f"mechanism plugin {ep.name} ({ep.value}) is not a "
                               "BaseMechanism subclass")
        if _REGISTRY.get(cls.name) is not cls:
            register(cls)


def mechanisms() -> tuple[type[BaseMechanism], ...]:
    """Every registered mechanism class, in registration order (built-ins first)."""
    load_plugins()
    return tuple(_REGISTRY.values())


def substitutes_tokens(cls: type[BaseMechanism]) -> bool:
    """A dχ mechanism whose payload is another regular token's id (Feyisetan et al. 2020
    §3): what a channel posterior over tokens and a contextual denoiser can read."""
    return cls.family == "dchi" and cls.payload_kind is PayloadKind.TOKENS


def names() -> tuple[str, ...]:
    """Every registered mechanism name."""
    return tuple(c.name for c in mechanisms())


def dchi_names() -> tuple[str, ...]:
    """The dχ mechanisms (budget family ``dchi``): they privatize token by token with one η,
    which is what the privacy report, the channel posterior and pretraining are about."""
    return tuple(c.name for c in mechanisms() if c.family == "dchi")


def substituting_names() -> tuple[str, ...]:
    """The mechanisms of :func:`substitutes_tokens` (a contextual denoiser reads them)."""
    return tuple(c.name for c in mechanisms() if substitutes_tokens(c))


def get(name: str) -> type[BaseMechanism]:
    """The class registered as ``name``; :class:`UnknownMechanism` otherwise."""
    load_plugins()
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownMechanism(f"unknown mechanism {name!r}; one of "
                               f"{', '.join(_REGISTRY)}") from None


def create(name: str, params: Mapping[str, Any], bundle: EdgeBundle | None = None, *,
           dim: int | None = None, secret: int | None = None) -> BaseMechanism:
    """The one factory: ``get(name).from_params(params, bundle, dim=dim, secret=secret)``."""
    return get(name).from_params(params, bundle, dim=dim, secret=secret)


def as_mechanism(mechanism: Any) -> Mechanism:
    """A mechanism object as is; a name builds the mechanism without parameters (only
    ``"none"`` has none)."""
    if isinstance(mechanism, Mechanism):
        return mechanism
    return create(mechanism, {})


# -- helpers for from_params --------------------------------------------------------------------
PARAM_RTOL = 1e-9  # parameters this close are the same (JSON and float rounding)


def same_param(a: Any, b: Any) -> bool:
    """Whether two parameter values are the same: numbers within :data:`PARAM_RTOL` of each
    other, anything else equal. The one comparison of a payload's parameters with its
    model's or its task's (predictions and records alike)."""
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return math.isclose(float(a), float(b), rel_tol=PARAM_RTOL, abs_tol=0.0)
    return bool(a == b)


def differing_params(sent: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """The names (sorted) whose values are not :func:`same_param` (missing on one side
    included)."""
    if sent == wanted:
        return []
    missing = object()
    return [k for k in sorted(set(sent) | set(wanted))
            if not same_param(sent.get(k, missing), wanted.get(k, missing))]


def param_texts(sent: Any, wanted: Any, show: Callable[[Any], str]) -> tuple[str, str]:
    """Two differing parameter values as a refusal writes them: ``show(value)`` (e.g. %g),
    or every digit (``repr``) when ``show`` writes them alike ("eta 65.000000065 sent, model
    serves eta 65.0", never "eta 65 sent, model serves eta 65")."""
    a, b = show(sent), show(wanted)
    if a == b and isinstance(sent, int | float) and isinstance(wanted, int | float):
        return repr(float(sent)), repr(float(wanted))
    return a, b


def need(mechanism: str, params: Mapping[str, Any], key: str) -> Any:
    """``params[key]``; :class:`MissingParameter` when absent or None."""
    value = params.get(key)
    if value is None:
        raise MissingParameter(mechanism, key)
    return value


def encoder_dim(mechanism: str, bundle: EdgeBundle | None, dim: int | None = None) -> int:
    """r, the sentence-vector size: ``dim`` if given, else the bundle's encoder output;
    :class:`NoEncoder` when the bundle has no encoder."""
    if dim is not None:
        return int(dim)
    enc = (bundle.meta.get("encoder") or {}) if bundle is not None else {}
    if bundle is None or bundle.encoder_onnx is None or "output_dim" not in enc:
        raise NoEncoder(mechanism, bundle.bundle_id if bundle is not None else None)
    return int(enc["output_dim"])


