"""What a retraining job does (in the child process, rank 0 reading the database).

1. Snapshot the task's records up to the job's watermark (``store.snapshot.snapshot``);
   verify whole every folder it reads (the base, the promoted version's posterior or
   denoiser: ``models.versions.manifest``).
2. Split them by a hash of the record id: train / dev / test, 80/10/10 (the same record
   always lands in the same part, in every job).
3. Fine-tune with ``models.training.experiment.train_from_records`` (from the job's base, else the
   bundle's own BERT); the trainer keeps the epoch that is best on dev.
4. With ``PRIVBERT_BACKEND=onnx``, export ``classifier.onnx`` into the version (what the
   onnx backend serves: the serve image runs no torch).
5. Accuracy on test of the new model, and of the promoted version on the same rows.
6. Write the version folder (its ``data.json`` names the watermark and the counts) into
   the attempt's ``output/``; the worker registers it and promotes it when asked and
   :func:`promotion_decision` allows it.

Only privatized payloads and class names are read; nothing here logs a payload.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from cloud_api.home import ModelHome
from cloud_api.jobs.files import AttemptFiles, ProgressWriter, write_json_atomically
from cloud_api.serving.bundles import BundleStore
from cloud_api.settings import Settings
from cloud_api.store.db import Database
from cloud_api.store.snapshot import snapshot
from cloud_api.store.tasks import get_task
from models.training.posterior import ChannelPosterior
from models.training.recipe import Recipe
from models.versions.manifest import update_manifest, verify_folder

log = logging.getLogger("cloud_api.jobs.retrain")

SPLIT = (0.8, 0.1, 0.1)  # train, dev, test
PARTS = ("train", "dev", "test")


def split_of(record_id: int, fractions: Sequence[float] = SPLIT) -> str:
    """"train", "dev" or "test" for a record id, from a hash of the id (deterministic,
    independent of the other records, so a later snapshot keeps every earlier assignment)."""
    digest = hashlib.sha256(f"privbert-split:{int(record_id)}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    if u < fractions[0]:
        return "train"
    return "dev" if u < fractions[0] + fractions[1] else "test"


def split_rows(rows: Iterable[tuple[int, object]], fractions: Sequence[float] = SPLIT
               ) -> dict[str, list]:
    """``{"train": [record, ...], "dev": [...], "test": [...]}`` from ``(id, record)`` rows."""
    parts: dict[str, list] = {p: [] for p in PARTS}
    for record_id, record in rows:
        parts[split_of(record_id, fractions)].append(record)
    return parts


def promotion_decision(requested: bool, new_acc: float | None, current_version: str | None,
                       current_acc: float | None, n_test: int,
                       current_error: str | None = None) -> tuple[bool, str]:
    """Promote the new version? Only when asked, and when its test accuracy is not worse
    than the promoted version's on the same rows by more than one binomial standard error
    of the latter, sqrt(p(1-p)/n). Returns (promote, why)."""
    if not requested:
        return False, "promotion was not requested"
    if current_version is None:
        return True, "no version was promoted before"
    if current_error is not None:
        return False, f"the promoted {current_version} could not be evaluated ({current_error})"
    if n_test == 0 or new_acc is None or current_acc is None:
        return False, (f"no test records to compare with the promoted {current_version}; "
                       "promote by hand if wanted")
    se = math.sqrt(current_acc * (1.0 - current_acc) / n_test)
    figures = (f"test accuracy {new_acc:.4f} against {current_acc:.4f} of {current_version} "
               f"on the same {n_test} records (one binomial standard error {se:.4f})")
    if new_acc >= current_acc - se - 1e-12:
        return True, figures
    return False, f"{figures}: worse by more than one standard error"


def load_snapshot(settings, task_name: str, watermark: int | None):
    """(task, [(id, record)], watermark) from the database (rank 0 only; also the worker's
    comparison child, ``jobs/compare.py``)."""

    db = Database.from_settings(settings)
    try:
        task = get_task(db, task_name)
        watermark, rows = snapshot(db, task, watermark)
        return task, list(rows), watermark
    finally:
        db.dispose()


def run(job: dict, files: AttemptFiles, dist_ctx=None) -> dict | None:
    """Train the new version into ``files.output``; returns the result (None off rank 0)."""

    settings = Settings()
    home = ModelHome(settings.home)
    spec = job["spec"]
    main = dist_ctx is None or dist_ctx.is_main
    progress = ProgressWriter(files, enabled=main)
    progress.update(force=True, phase="loading records")
    loaded = load_snapshot(settings, spec["task"], job.get("watermark")) if main else None
    if dist_ctx is not None:
        # lazy: torch, in the job's child process only (the worker has none)
        from models.training import distributed

        loaded = distributed.broadcast_object(loaded, dist_ctx)
    assert loaded is not None  # read on the main rank, broadcast to the others
    task, rows, watermark = loaded
    read_whole(spec)
    parts = split_rows(rows)
    counts = {p: len(v) for p, v in parts.items()}
    log.info("job %s: %d records up to id %s: train %d, dev %d, test %d", job["job_id"],
             len(rows), watermark, counts["train"], counts["dev"], counts["test"])
    if not parts["train"]:
        raise ValueError(f"task {task.name} has no training records up to id {watermark} "
                         "(erased since the job was submitted?)")
    # torch from here on (a job that fails above never pays for importing it)
    # lazy: torch, in the job's child process only (the worker has none)
    from models.training.experiment import evaluate_records, train_from_records
    from models.training.finetune import TrainConfig, TrainingCancelled

    bundle = _bundle(home, task.bundle_id)
    cfg = TrainConfig(epochs=int(spec["epochs"]), lr=spec.get("lr"),
                      batch_size=int(spec.get("batch_size") or 32), seed=spec.get("seed"),
                      device=settings.device, precision=settings.precision, progress=False)
    world = dist_ctx.world_size if dist_ctx is not None else 1
    total = math.ceil(counts["train"] / cfg.batch_size) // world * cfg.epochs
    progress.update(force=True, phase="training", step=0, total=total, epoch=0)

    def should_stop() -> bool:
        progress.update(step=progress.state.get("step", 0) + 1)
        return files.cancelled()

    def on_progress(_fraction: float, info: dict) -> None:
        progress.update(force=True, epoch=info["epoch"], loss=info["train_loss"],
                        dev_accuracy=info.get("dev_accuracy"))

    table = (ChannelPosterior.load(spec["posterior_path"]) if spec.get("posterior_path")
             else None)
    denoiser = None
    if spec.get("denoiser_path"):
        # lazy: torch, in the job's child process only (the worker has none)
        from models.attacks.denoiser import Denoiser
        from models.nets.backbone import model_embeddings

        denoiser = Denoiser.load(spec["denoiser_path"], model_embeddings(bundle))
    res = train_from_records(parts["train"], files.output, bundle=bundle,
                             dev_records=parts["dev"] or None, base=spec.get("base_path"),
                             cfg=cfg, label_names=list(task.labels),
                             extra_config={"task": task.name, "job_id": job["job_id"]},
                             should_stop=should_stop, on_progress=on_progress,
                             dist_ctx=dist_ctx, recipe=Recipe(posterior=table is not None,
                                                              denoiser=denoiser is not None),
                             posterior=table, denoiser=denoiser)
    if not main:
        return None
    if files.cancelled():
        raise TrainingCancelled("cancelled after training")
    if settings.backend in ("onnx", "onnx-int8"):  # what the serve image serves
        # lazy: torch, in the job's child process only (the worker has none)
        from models.export.writers import export_classifier_onnx

        progress.update(force=True, phase="exporting classifier.onnx and its int8 version")
        export_classifier_onnx(files.output)
    progress.update(force=True, phase="evaluating on test", step=total)
    new_acc = cur_acc = cur_error = None
    current = home.promoted(spec["model_id"])
    if parts["test"]:
        new_acc = evaluate_records(files.output, parts["test"])["accuracy"]
        if current is not None:
            try:
                cur_acc = evaluate_records(home.version_dir(spec["model_id"], current),
                                           parts["test"])["accuracy"]
            except (ValueError, OSError) as exc:
                cur_error = " ".join(str(exc).split())[:300]
    promote, why = promotion_decision(bool(spec.get("promote")), new_acc, current, cur_acc,
                                      counts["test"], cur_error)
    _note_data(files.output / "data.json", task.name, watermark, counts, job["job_id"])
    update_manifest(files.output, ["data.json"])  # the version was sealed when it was made
    train_s = float(res.metrics.get("train_seconds") or 0.0)
    result = {
        "model_id": spec["model_id"], "watermark": watermark, "records": counts,
        "metrics": {"test_accuracy": new_acc, "dev_accuracy": (res.metrics.get("dev") or {})
                    .get("accuracy"), "best_epoch": res.metrics.get("best_epoch"),
                    "train_seconds": train_s, "train_examples": res.n_train,
                    "train_examples_per_s": (res.n_train * cfg.epochs / train_s
                                             if train_s > 0 else None),
                    "world_size": world},
        "compared_with": {"version": current, "test_accuracy": cur_acc, "error": cur_error},
        "promote": {"requested": bool(spec.get("promote")), "decision": promote,
                    "reason": why},
    }
    progress.update(force=True, phase="done")
    return result


def read_whole(spec: dict) -> None:
    """Every folder the job reads (its base, the promoted version whose posterior or
    denoiser it reads) verified whole before it is read (``models.versions.manifest``), as when it
    was submitted: a file changed since is refused in one line, never copied forward."""
    folders = {Path(p).parent for p in (spec.get("posterior_path"), spec.get("denoiser_path"))
               if p}
    if spec.get("base_path"):
        folders.add(Path(spec["base_path"]))
    for folder in sorted(folders):
        verify_folder(folder, digest_unsealed=False)


def _bundle(home, bundle_id: str):
    return BundleStore(home).get(bundle_id)


def _note_data(path: Path, task: str, watermark: int, counts: dict, job_id) -> None:
    """Add where the data came from to the version's data.json (counts, never records)."""
    info = json.loads(path.read_text())
    info.update({"task": task, "watermark": watermark, "records": counts, "job_id": job_id,
                 "split": "sha256 of the record id: 80% train, 10% dev, 10% test"})
    write_json_atomically(path, info)
    path.chmod(0o644)
