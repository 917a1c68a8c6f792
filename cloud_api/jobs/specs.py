"""The checks made when a job is submitted (422 at POST, not a failed job later): the task
exists (404), it has enough records of every label, the model id serves the same payloads as
the task, the base was made for the task's bundle and mechanism, and what the job will read
is whole (the promoted version, the base: ``models.versions.manifest``); epochs and learning rate
are in range already (the bodies, ``cloud_api.jobs.requests``).

    spec = check_retrain(db, home, bundles, settings, RetrainRequest(task="sst2", ...))
    job_id = queue.enqueue(db, JobKind.RETRAIN, spec)

FastAPI-free: the admin routes and tests call these directly.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from sqlalchemy import func, select

from cloud_api.errors import Conflict, InvalidRequest, NotFound, Unavailable
from cloud_api.home import ModelHome, is_id
from cloud_api.jobs import queue
from cloud_api.jobs.pretrain import corpus_paths
from cloud_api.jobs.requests import PretrainRequest, RecipeRequest, RetrainRequest
from cloud_api.jobs.states import JobKind
from cloud_api.settings import Settings
from cloud_api.store.db import Database
from cloud_api.store.snapshot import label_counts
from cloud_api.store.tables import records
from cloud_api.store.tasks import (
    Task,
    canonical_params,
    compared_params,
    get_task,
    privacy_floor_refusal,
)
from models.training.posterior import (
    POSTERIOR_FILE,  # numpy only
    ChannelPosterior,
)
from models.training.recipe import RAW_TEXT_LEVERS
from models.versions.manifest import IntegrityError, verify_folder
from models.versions.version_folder import DENOISER_FILE, check_denoiser_meta, denoiser_header
from shared.bundle import EdgeBundle
from shared.mechanisms.registry import dchi_names, differing_params, mechanisms, substituting_names

VECTOR_MECHANISMS = tuple(c.name for c in mechanisms() if not c.payload_kind.reads_tokens)


# -- retraining -----------------------------------------------------------------------------
def check_retrain(db: Database, home: ModelHome, bundles, settings: Settings,
                  req: RetrainRequest) -> dict:
    """The job spec of a valid request; NotFound / InvalidRequest otherwise."""
    task = get_task(db, req.task)  # NotFound (404)
    current = home.promoted(req.model_id)
    if current is not None:  # the job reads it (posterior, denoiser) and compares with it
        home.verify(req.model_id, current, seal_missing=False)
    _check_counts(db, task, settings.min_records_per_label)
    cfg = home.read_config(req.model_id, current) if current is not None else None
    if current is not None and cfg is not None:
        _check_model_fits(task, req.model_id, current, cfg)
    try:
        bundles.get(task.bundle_id)
    except NotFound:
        raise InvalidRequest(f"the bundle {task.bundle_id[:12]}… of task {task.name} is not "
                             "in this service's home") from None
    base_path = _retrain_base(home, bundles, task, req, cfg)
    posterior_path = _retrain_posterior(home, task, req, current)
    denoiser_path = _retrain_denoiser(home, task, req, current)
    return {**req.model_dump(), "base_path": base_path, "posterior_path": posterior_path,
            "denoiser_path": denoiser_path}


def _retrain_denoiser(home: ModelHome, task: Task, req: RetrainRequest,
                      current: str | None) -> str | None:
    """The denoiser the job reads (the promoted version's ``denoiser.safetensors``), or None;
    InvalidRequest when one is asked for and none fits (training one needs public text)."""

    asked = (req.recipe or RecipeRequest()).denoiser
    if asked is False:
        return None
    if task.mechanism not in substituting_names():
        if asked:
            raise InvalidRequest(f"recipe.denoiser makes no sense for {task.mechanism}: a "
                                 "contextual denoiser exists for dchi-text only")
        return None
    path = (home.version_dir(req.model_id, current) / DENOISER_FILE
            if current is not None else None)
    if path is None or not path.is_file():
        if asked:
            raise InvalidRequest(f"recipe.denoiser: model {req.model_id} has no promoted "
                                 "version with a denoiser (denoiser.safetensors) to read; "
                                 "training one needs the raw public text, which a retraining "
                                 "job from device records does not have (cloud-api train "
                                 "--denoiser)")
        return None
    try:
        check_denoiser_meta(denoiser_header(path.read_bytes(), str(path))["meta"],
                            task.mechanism, task.params, task.bundle_id)
    except (ValueError, KeyError, OSError) as exc:
        if asked:
            raise InvalidRequest(f"recipe.denoiser: {exc}") from None
        return None
    return str(path)


def _retrain_posterior(home: ModelHome, task: Task, req: RetrainRequest,
                       current: str | None) -> str | None:
    """The posterior table the job reads (the promoted version's ``posterior.npz``), or None;
    InvalidRequest for a lever that needs raw text, or a posterior asked for but absent."""

    r = req.recipe or RecipeRequest()
    asked = [name for name in RAW_TEXT_LEVERS if getattr(r, name)]
    if asked:
        raise InvalidRequest(f"{', '.join(asked)} need the raw public text; a retraining job "
                             "reads device records, which have none (only recipe.posterior "
                             "applies)")
    if r.posterior is False:
        return None
    if task.mechanism not in dchi_names():
        if r.posterior:
            raise InvalidRequest(f"recipe.posterior makes no sense for {task.mechanism}: a "
                                 "channel posterior exists for dchi-text and dchi-embedding "
                                 "only")
        return None
    path = (home.version_dir(req.model_id, current) / POSTERIOR_FILE
            if current is not None else None)
    if path is None or not path.is_file():
        if r.posterior:
            raise InvalidRequest(f"recipe.posterior: model {req.model_id} has no promoted "
                                 "version with a posterior table (posterior.npz) to read")
        return None

    try:
        ChannelPosterior.load(path).check_for(task.mechanism, task.params, task.bundle_id)
    except ValueError as exc:
        if r.posterior:
            raise InvalidRequest(f"recipe.posterior: {exc}") from None
        return None
    return str(path)


def _soft_records(db: Database, task: Task) -> int:
    with db.begin() as conn:
        return int(conn.execute(select(func.count()).where(
            records.c.task_id == task.id, records.c.soft_label.is_not(None))).scalar_one())


def _check_counts(db: Database, task: Task, need: int) -> None:
    counts = label_counts(db, task)
    if all(n >= need for n in counts.values()):
        return
    soft = _soft_records(db, task)  # TextHide's mixed labels count towards every class
    if soft and sum(counts.values()) + soft >= need * len(counts):
        return
    shown = ", ".join(f"{k} {v}" for k, v in counts.items())
    extra = f", {soft} with mixed labels" if soft else ""
    raise InvalidRequest(f"task {task.name} has too few records to retrain: {shown}{extra}; "
                         f"every label needs at least {need} (PRIVBERT_MIN_RECORDS_PER_LABEL)")


def _check_model_fits(task: Task, model_id: str, version: str, cfg: dict) -> None:
    """The model's promoted version must read the task's payloads and labels."""
    where = f"model {model_id} ({version})"
    if cfg.get("mechanism") != task.mechanism:
        raise InvalidRequest(f"{where} serves {cfg.get('mechanism')}, task {task.name} holds "
                             f"{task.mechanism} records: use another model id")
    if cfg.get("bundle_id") != task.bundle_id:
        raise InvalidRequest(f"{where} uses bundle {str(cfg.get('bundle_id'))[:12]}…, task "
                             f"{task.name} bundle {task.bundle_id[:12]}…")
    want = compared_params(task.mechanism, task.params)
    got: object
    try:
        got = compared_params(task.mechanism,
                              canonical_params(task.mechanism, cfg.get("params") or {}))
    except InvalidRequest:
        got = cfg.get("params")
    if not isinstance(got, dict) or differing_params(got, want):
        raise InvalidRequest(f"{where} serves parameters {got}, task {task.name} holds "
                             f"records with {want}")
    if list(cfg.get("labels") or []) != list(task.labels):
        raise InvalidRequest(f"{where} has labels {cfg.get('labels')}, task {task.name} "
                             f"{list(task.labels)}")


def _retrain_base(home: ModelHome, bundles, task: Task, req: RetrainRequest,
                  current_cfg: dict | None) -> str | None:
    """The BERT folder to start from (None = the default MiniLM); ``current_cfg``: the
    config of the model's promoted version, if any."""
    vector = task.mechanism in VECTOR_MECHANISMS
    if req.base is not None:
        if vector:
            raise InvalidRequest(f"base does not apply to {task.mechanism}: its classifier "
                                 "is an MLP over the sentence vector, not a BERT")
        path = _existing_base(home, req.base)
        try:
            verify_folder(path, digest_unsealed=False)
        except IntegrityError as exc:
            raise InvalidRequest(f"base {req.base} is not whole: {exc}") from None
        info = base_info(path)
        if info["bundle_id"] != task.bundle_id:
            raise InvalidRequest(f"base {req.base} was made for bundle "
                                 f"{info['bundle_id'][:12]}…, task {task.name} uses "
                                 f"{task.bundle_id[:12]}…")
        if info.get("mechanism") not in (None, task.mechanism):
            raise InvalidRequest(f"base {req.base} was pretrained with {info['mechanism']}, "
                                 f"task {task.name} uses {task.mechanism}")
        return str(path)
    if vector or task.bundle_id == bundles.default_bundle_id:
        return None
    if current_cfg is not None:  # the BERT the promoted version was trained from
        base = current_cfg.get("base_model")
        trained = Path(base) if base else None
        if trained is not None and not trained.is_dir() and trained.parent.name == "bases" and \
                is_id(trained.name):  # trained on another host: the base of that name here
            trained = home.base_dir(trained.name)  # (a shared model store fetches it)
        if trained is not None and trained.is_dir() and (trained / "config.json").is_file():
            return str(trained)
    raise InvalidRequest(f"task {task.name} uses bundle {task.bundle_id[:12]}…, not the "
                         "default MiniLM one: name a base of that bundle (a BERT folder in "
                         "$PRIVBERT_HOME/bases/, or POST /admin/pretrain)")


def _existing_base(home: ModelHome, name: str) -> Path:
    path = home.base_dir(name)
    if not (path / "config.json").is_file():
        raise InvalidRequest(f"no base named {name!r} in $PRIVBERT_HOME/bases "
                             "(POST /admin/pretrain makes one)")
    return path


_BASE_IDS: dict[tuple[str, float], str] = {}
_BASE_LOCK = threading.Lock()


def base_info(path: Path) -> dict:
    """``{"bundle_id", "mechanism"}`` of a base: from its ``pretrain.json``, else (a plain
    BERT folder) the bundle id computed from its tokenizer and embeddings (cached)."""
    info_file = path / "pretrain.json"
    if info_file.is_file():
        try:
            info = json.loads(info_file.read_text())
            return {"bundle_id": str(info["bundle_id"]), "mechanism": info.get("mechanism")}
        except (OSError, ValueError, KeyError):
            raise InvalidRequest(f"base {path.name}: unreadable pretrain.json") from None
    key = (str(path), (path / "config.json").stat().st_mtime)
    with _BASE_LOCK:
        if key not in _BASE_IDS:

            try:
                _BASE_IDS[key] = EdgeBundle.from_model(path).bundle_id
            except (OSError, ValueError) as exc:
                raise InvalidRequest(f"base {path.name} is not a BERT folder with a "
                                     f"tokenizer ({' '.join(str(exc).split())[:200]})") from None
    return {"bundle_id": _BASE_IDS[key], "mechanism": None}


# -- pretraining ----------------------------------------------------------------------------
def check_pretrain(db: Database, home: ModelHome, settings: Settings,
                   req: PretrainRequest) -> dict:
    """The job spec of a valid request: the name is free (409 otherwise), the base exists,
    the parameters are valid for the mechanism, the corpus is there."""
    params = canonical_params(req.mechanism, req.params)
    if home.base_dir(req.name).exists():
        raise Conflict(f"a base named {req.name!r} exists already; choose another name")
    holder = queue.live_holder(db, JobKind.PRETRAIN, req.name)  # the early, friendly answer; the
    if holder is not None:                                # insert decides (submit_pretrain)
        raise Conflict(f"job {holder.id} ({holder.state}) already pretrains a base named "
                       f"{req.name!r}")
    base_path = str(_existing_base(home, req.base)) if req.base else None

    # the same floor as a task declaration's: a base adapted to an η no task may use
    # serves nothing (422 weak-privacy unless PRIVBERT_ALLOW_WEAK_PRIVACY)
    privacy_floor_refusal(req.mechanism, params, EdgeBundle.from_model(base_path),
                          settings.allow_weak_privacy)

    missing = [str(p) for p in corpus_paths(settings) if not Path(p).is_file()]
    if missing:
        raise Unavailable(f"the pretraining corpus is missing on this server: "
                          f"{', '.join(missing)} (PRIVBERT_PRETRAIN_CORPUS)")
    return {**req.model_dump(), "params": params, "base_path": base_path,
            "allow_weak_privacy": settings.allow_weak_privacy}


def submit_pretrain(db: Database, home: ModelHome, settings: Settings, req: PretrainRequest,
                    *, created_by: str | None = None) -> int:
    """Check and queue a pretraining job; returns its id. The base name is reserved by the
    insert itself (a unique index over live jobs, ``jobs.queue.enqueue``), so of two
    concurrent requests for one name exactly one is queued and the other gets 409."""
    spec = check_pretrain(db, home, settings, req)
    return queue.enqueue(db, JobKind.PRETRAIN, spec, max_attempts=settings.max_attempts,
                         created_by=created_by, reserve=req.name)
