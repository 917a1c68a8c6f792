"""Tasks: what a task's records must be (labels, mechanism, parameters, bundle).

    task, created = ensure_task(db, "sst2", ["negative", "positive"], "dchi-text",
                                {"eta": 65}, bundle_id)
    get_task(db, "sst2").public()   # what GET /v1/tasks/{task} answers
    list_tasks(db)                  # with record counts per label (GET /admin/tasks)

A declaration is immutable: declaring the same task again is a no-op (``created`` is
False), a different declaration for an existing name is a :class:`Conflict` that names
the difference. Parameters are kept canonical (validated by the mechanism's own params
model, defaults filled in), so ``{"eta": 65}`` and ``{"eta": 65.0}`` are the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError

from cloud_api.errors import Conflict, InvalidRequest, NotFound, WeakPrivacy
from cloud_api.home import ID_PATTERN, check_id
from cloud_api.store.db import Database
from cloud_api.store.tables import as_utc, records, tasks
from shared import payload as wire
from shared.bundle import BundleError
from shared.floor import THRESHOLD
from shared.mechanisms import registry

Mechanism = Literal[wire.MECHANISMS]  # type: ignore[valid-type]
LabelName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")]
TaskName = Annotated[str, Field(pattern=ID_PATTERN,
                                description="1-64 letters, digits, '_', '.', '-'")]

# mechanism -> its payload class (params model, array field)
PAYLOAD_CLASSES = wire.PAYLOAD_CLASSES


def canonical_params(mechanism: str, params: dict) -> dict:
    """``params`` validated by the mechanism's params model, every field present."""
    try:
        return registry.get(mechanism).canonical_params(params)
    except ValidationError as exc:
        raise InvalidRequest(f"params are not valid for {mechanism}",
                             errors=[{**e, "loc": ["params", *e["loc"]]} for e in
                                     exc.errors(include_input=False, include_url=False)]
                             ) from None


def privacy_floor_refusal(mechanism: str, params: dict, bundle, allow_weak: bool) -> None:
    """:class:`WeakPrivacy` (422) when a task would accept payloads weaker than the
    privacy floor (``shared.floor``: a dχ η at which tokens mostly come back unchanged, a
    Laplace or OME noise that rounds away), unless ``allow_weak``; the edge refuses to
    make such payloads without ``--allow-weak-privacy``, and the server does not invite
    them. Uncomputable parameters (an η whose noise overflows) are refused too."""
    if not registry.get(mechanism).has_epsilon:  # none: PRIVBERT_ALLOW_NONE; TextHide: no ε
        return
    p = canonical_params(mechanism, params)
    # r, the sentence-vector size: the encoder's output, else BERT's hidden size (= the
    # word-embedding size), which a bundle without encoder.onnx is declared for
    dim = int((bundle.meta.get("encoder") or {}).get("output_dim") or bundle.dim)
    try:
        mech = registry.create(mechanism, p, bundle, dim=dim)
        mech.check_computable(bundle, dim=dim)
        reason = mech.weak_privacy_reason(bundle, threshold=THRESHOLD, dim=dim)
    except ValueError as exc:
        raise InvalidRequest(f"params cannot be used: {exc}") from None
    except BundleError as exc:  # e.g. dchi-embedding on a bundle with a designed table only
        raise InvalidRequest(f"the task's bundle cannot serve {mechanism}: {exc}") from None
    if reason is not None and not allow_weak:
        raise WeakPrivacy(f"{reason}; such payloads are close to the raw text, so the task "
                          "is refused (PRIVBERT_ALLOW_WEAK_PRIVACY=1 accepts it, for "
                          "experiments only)")


def compared_params(mechanism: str, params: dict) -> dict:
    """The parameters a record must share with its task (TextHide: only the mask pool m;
    k is how many inputs each record mixes, as ``ModelVersion.check_payload`` allows)."""
    return registry.get(mechanism).compared_params(params)


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def params_difference(sent: dict, accepted: dict, who: str = "task accepts") -> str | None:
    """``"eta 60 sent, task accepts eta 65"``, or None when the parameters are the same
    (``registry.same_param``: the tolerance predictions are checked with, so records and
    predictions give one verdict)."""
    diffs = [f"{k} {a} sent, {who} {k} {b}" for k in registry.differing_params(sent, accepted)
             for a, b in [registry.param_texts(sent.get(k, "(none)"), accepted.get(k, "(none)"),
                                               _show)]]
    return "; ".join(diffs) or None


class TaskDeclaration(BaseModel):
    """Body of ``POST /admin/tasks``: what records of the task must be."""

    model_config = ConfigDict(extra="forbid")
    task: TaskName
    labels: list[LabelName] = Field(min_length=2, max_length=1000,
                                    description="class names; an integer label is an index "
                                    "into this list")
    mechanism: Mechanism
    params: dict[str, Any] = Field(default_factory=dict, description="the mechanism's "
                                   "parameters, e.g. {\"eta\": 65}")
    bundle_id: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    pairs: bool | None = Field(None, description="token tasks: records are sentence pairs "
                               "(segments [a, b]); false (the default for a new task): single "
                               "sentences")

    @field_validator("labels")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("labels must be distinct")
        return v


@dataclass(frozen=True)
class Task:
    """A declared task as stored."""

    id: int
    name: str
    labels: tuple[str, ...]
    mechanism: str
    params: dict
    bundle_id: str
    created_at: datetime | None = None
    pairs: bool = False  # token tasks: sentence pairs, else single sentences

    def public(self) -> dict:
        """What the edge needs: ``GET /v1/tasks/{task}``."""
        return {"task": self.name, "labels": list(self.labels), "mechanism": self.mechanism,
                "params": dict(self.params), "bundle_id": self.bundle_id,
                "pairs": self.pairs}

    def difference(self, other: Task) -> str | None:
        """What differs between two declarations of one task, or None."""
        if self.labels != other.labels:
            return f"labels {list(other.labels)} sent, task has {list(self.labels)}"
        if self.mechanism != other.mechanism:
            return f"mechanism {other.mechanism} sent, task has {self.mechanism}"
        if self.bundle_id != other.bundle_id:
            return (f"bundle {other.bundle_id[:12]}… sent, task has "
                    f"{self.bundle_id[:12]}…")
        diff = params_difference(other.params, self.params, "task has")
        if diff is None and self.pairs != other.pairs:
            return (f"pairs {str(other.pairs).lower()} sent, task has "
                    f"{str(self.pairs).lower()}")
        return diff


def _task(row) -> Task:
    return Task(row.id, row.name, tuple(row.labels), row.mechanism, dict(row.params),
                row.bundle_id, as_utc(row.created_at), bool(row.pairs))


def _find(conn, name: str) -> Task | None:
    row = conn.execute(select(tasks).where(tasks.c.name == name)).first()
    return _task(row) if row is not None else None


def get_task(db: Database, name: str) -> Task:
    """The task ``name``; :class:`NotFound` if none is declared."""
    check_id("task", name)
    with db.begin() as conn:
        task = _find(conn, name)
    if task is None:
        raise NotFound(f"no task {name!r}: an admin declares it with POST /admin/tasks")
    return task


def ensure_task(db: Database, name: str, labels, mechanism: str, params: dict,
                bundle_id: str, pairs: bool | None = None) -> tuple[Task, bool]:
    """Declare the task (``True``: created now) or find the same declaration (``False``);
    :class:`Conflict` if the task exists with another declaration. ``pairs`` None: not
    said (false for a new task, whatever an existing one has)."""
    try:
        decl = TaskDeclaration(task=name, labels=list(labels), mechanism=mechanism,
                               params=dict(params), bundle_id=bundle_id, pairs=pairs)
    except ValidationError as exc:
        raise InvalidRequest("invalid task declaration",
                             errors=exc.errors(include_input=False, include_url=False)) from None
    want = Task(0, decl.task, tuple(decl.labels), decl.mechanism,
                canonical_params(decl.mechanism, decl.params), decl.bundle_id,
                pairs=bool(decl.pairs))
    for _ in range(2):
        try:
            with db.begin(write=True) as conn:
                have = _find(conn, name)
                if have is None:
                    now = datetime.now(UTC)
                    new_id = conn.execute(insert(tasks).values(
                        name=want.name, labels=list(want.labels), mechanism=want.mechanism,
                        params=want.params, bundle_id=want.bundle_id, created_at=now,
                        pairs=want.pairs).returning(tasks.c.id)).scalar_one()
                    return Task(new_id, want.name, want.labels, want.mechanism, want.params,
                                want.bundle_id, now, want.pairs), True
        except IntegrityError:
            continue  # declared concurrently by another request: compare with it
        if decl.pairs is None:  # not said: whatever the task has
            want = Task(0, want.name, want.labels, want.mechanism, want.params,
                        want.bundle_id, pairs=have.pairs)
        diff = have.difference(want)
        if diff:
            raise Conflict(f"task {name!r} is declared differently: {diff}")
        return have, False
    raise Conflict(f"task {name!r} is being declared concurrently; try again")


def list_tasks(db: Database) -> list[dict]:
    """Every task (public fields, created_at) with its record counts per label
    (``soft``: records with a mixed TextHide label)."""
    with db.begin() as conn:
        all_tasks = [_task(r) for r in conn.execute(select(tasks).order_by(tasks.c.name))]
        counts = conn.execute(select(records.c.task_id, records.c.label, func.count())
                              .group_by(records.c.task_id, records.c.label)).all()
    per: dict[int, dict[str | None, int]] = {}
    for task_id, label, n in counts:
        per.setdefault(task_id, {})[label] = int(n)
    out = []
    for t in all_tasks:
        c = per.get(t.id, {})
        out.append({**t.public(),
                    "created_at": t.created_at.isoformat() if t.created_at else None,
                    "records": sum(c.values()),
                    "counts": {name: c.get(name, 0) for name in t.labels},
                    "soft": c.get(None, 0)})
    return out
