"""What ``edge-agent privatize`` is asked to do, as typed objects: the command line parses its
flags once into these (``edge_agent.privatize.cli``; the bundle and server flags into
``edge_agent.service.connect.ServerOptions``), and the library code below it takes them,
never an argparse namespace. ``PrivatizeOptions.check()`` refuses contradictory or
incomplete options (``UsageError``) before any work is done.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any

from edge_agent import mechanism_spec as mspec
from edge_agent.errors import UsageError, warn
from edge_agent.privatize.texthide_key import resolve_key
from edge_agent.service.connect import ServerOptions
from shared.mechanisms import registry

DEFAULT_MECHANISM = "dchi-text"


# The mechanisms and their parameters come from the mechanism spec (``shared.spec``, read by
# ``edge_agent.mechanism_spec`` without numpy: ``edge-agent --help`` stays light).
@cache
def mechanisms() -> tuple[str, ...]:
    """The registered mechanisms, the private ones first (the order of --mechanism's
    choices)."""
    return tuple(e["name"] for e in sorted(mspec.entries(), key=lambda e: not e["private"]))


def params_of(name: str) -> list[str]:
    """The mechanism's parameters that are edge options (OME's bit layout is not)."""
    return [f["param"] for f in mspec.entry(name)["flags"]]


def param_names() -> tuple[str, ...]:
    """Every parameter some mechanism takes as a flag."""
    return tuple(f.param for f in mspec.param_flags())


@cache
def mechanism_flags() -> dict[str, frozenset[str]]:
    """The options that configure each mechanism; any other one given is a usage error."""
    return {n: frozenset(params_of(n)) | frozenset(mspec.entry(n)["edge_options"])
            for n in mechanisms()}


def _writes_text(e: dict) -> bool:
    """A private mechanism whose payloads are token ids of the vocabulary can be written
    back as text (``--format text``)."""
    return e["private"] and e["payload"]["kind"] == "tokens"


def text_mechanisms() -> tuple[str, ...]:
    return tuple(n for n in mechanisms() if _writes_text(mspec.entry(n)))


def flag(name: str) -> str:
    """The command-line spelling of an option: ``word_dropout`` -> ``--word-dropout``."""
    return "--" + name.replace("_", "-")


def _default(name: str, param: str):
    """The value of a parameter not given: the edge's default for it, else its Params
    default (None: it has none)."""
    f = next(f for f in mspec.entry(name)["flags"] if f["param"] == param)
    return f["edge_default"] if f["edge_default"] is not None else f["default"]


@dataclass(frozen=True)
class MechanismOptions:
    """The mechanism, its parameters as given (``values``: parameter name -> value, None or
    absent: not given) and the edge's settings for it."""

    name: str = DEFAULT_MECHANISM
    values: Mapping[str, Any] = field(default_factory=dict)
    texthide_key: str | None = None
    texthide_seed: str | None = None
    num_labels: int | None = None
    float16: bool = False
    allow_none: bool = False
    allow_weak_privacy: bool = False
    seed: int | None = None  # seeds the noise: reproducible, and no protection

    def given(self) -> set[str]:
        """Mechanism options that were given (``--eta 0`` is given: identity, not truth)."""
        params = {p for p, v in self.values.items() if v is not None and v is not False}
        edge = {f for f in set().union(*mechanism_flags().values()) - set(param_names())
                if getattr(self, f, None) is not None and getattr(self, f, None) is not False}
        return params | edge

    def params(self) -> dict:
        """The payload parameters these options name (before the mechanism is built)."""
        return {n: self.values.get(n) if self.values.get(n) is not None
                else _default(self.name, n) for n in params_of(self.name)}

    def texthide_seed_value(self, quiet: bool = False) -> int | None:
        """The mask-pool seed from --texthide-key (or its alias); UsageError for a weak key."""
        try:
            seed, note = resolve_key(self.texthide_key, self.texthide_seed)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if not quiet:
            if note:
                warn(note)
            if seed is None:
                warn("texthide without --texthide-key: a new secret mask pool for this run only")
        return seed

    @property
    def mixes(self) -> bool:
        """TextHide with k > 1: records mix k inputs and their labels."""
        return registry.get(self.name).mixes_inputs(self.params())

    @property
    def mixed(self) -> int:
        """How many inputs a record mixes (TextHide's k; 1 for every other mechanism)."""
        return int(self.params().get("k") or 1) if self.mixes else 1


@dataclass(frozen=True)
class InputOptions:
    """How input lines are read and cut."""

    tsv: bool = False
    header: str = "auto"  # auto | yes | no
    empty: str = "skip"  # skip | error
    truncate: str = "first"  # first | error
    max_length: int | None = None
    batch_size: int = 256
    progress: bool = True


@dataclass(frozen=True)
class PostOptions:
    """Posting to the service: ``mode`` predict | records | None (write only)."""

    mode: str | None = None
    task: str | None = None
    batch: int = 64


@dataclass(frozen=True)
class LedgerOptions:
    """The device's privacy budget ledger."""

    path: str | None = None  # default: $PRIVBERT_LEDGER, else the user's data directory
    memo: bool = True  # the same text returns the stored payload, at no new cost
    dry_run: bool = False  # print the cost of the input, spend nothing, write nothing


@dataclass(frozen=True)
class PrivatizeOptions:
    """``edge-agent privatize FILE``."""

    file: str
    output: str | None = None
    format: str = "jsonl"  # jsonl | text
    mechanism: MechanismOptions = field(default_factory=MechanismOptions)
    input: InputOptions = field(default_factory=InputOptions)
    post: PostOptions = field(default_factory=PostOptions)
    server: ServerOptions = field(default_factory=ServerOptions)
    ledger: LedgerOptions = field(default_factory=LedgerOptions)

    def check(self) -> None:
        """Usage errors before any work is done."""
        m, post = self.mechanism, self.post
        if m.name not in mechanisms():
            raise UsageError(f"--mechanism must be one of {', '.join(mechanisms())}")
        stray = sorted(m.given() - mechanism_flags()[m.name])
        if stray:
            raise UsageError(f"{', '.join(map(flag, stray))} do(es) not apply to --mechanism "
                             f"{m.name}")
        spec = mspec.entry(m.name)
        for f in spec["flags"]:
            if f["required"] and f["edge_default"] is None and m.values.get(f["param"]) is None:
                raise UsageError(f"--mechanism {m.name} needs {flag(f['param'])}")
        if not spec["private"] and not m.allow_none:
            raise UsageError(f"--mechanism {m.name} sends plain token ids the server can read; "
                             "add --allow-none for the Null-privacy baseline")
        if self.format == "text" and (not _writes_text(spec) or post.mode):
            raise UsageError(f"--format text is for --mechanism {' or '.join(text_mechanisms())} "
                             "without --post")
        if self.input.batch_size < 1 or post.batch < 1:
            raise UsageError("--batch-size and --post-batch must be integers >= 1")
        if m.mixes and (not self.input.tsv or post.mode == "predict"):
            raise UsageError("texthide with --k > 1 mixes inputs and labels: only for labelled "
                             "records (--tsv); predictions use --k 1")
        if post.mode and not self.server.server:
            raise UsageError(f"--post {post.mode} needs --server URL")
        if post.mode == "records" and (not post.task or not self.input.tsv):
            raise UsageError("--post records needs --task T and labelled input (--tsv)")
        if post.task and post.mode != "records":
            raise UsageError("--task goes with --post records")
        if self.ledger.dry_run and (post.mode or self.output):
            raise UsageError("--dry-run writes and sends nothing: drop -o and --post")
        if "texthide_key" in spec["edge_options"]:
            m.texthide_seed_value(quiet=True)


def options_of(cls, values: dict):
    """``cls(**values)`` keeping only ``cls``'s fields (the CLI's namespace has more)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})
