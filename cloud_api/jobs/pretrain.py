"""What a pretraining job does (in the child process): privacy-adaptive pretraining
(``models.pretraining.pretrain.pretrain``, Qu et al. §3.4) on a PUBLIC corpus — the configured
``PRIVBERT_PRETRAIN_CORPUS`` files, by default AG News from ``../shared/data`` — never on
user records. The output folder (a BERT folder with ``pretrain.json``) is moved by the
worker to ``$PRIVBERT_HOME/bases/<name>/``, where retraining requests name it as ``base``.
"""

from __future__ import annotations

import logging

from cloud_api.jobs.files import AttemptFiles, ProgressWriter
from cloud_api.settings import Settings

log = logging.getLogger("cloud_api.jobs.pretrain")


def corpus_paths(settings) -> list:
    """The public corpus files of pretraining jobs."""
    if settings.pretrain_corpus is not None:
        return [settings.pretrain_corpus]
    # lazy: torch, in the job's child process only (the worker has none)
    from models.pretraining.pretrain_data import DATA

    return [DATA / "corpus" / "agnews.txt"]


def run(job: dict, files: AttemptFiles, dist_ctx=None) -> dict | None:
    """Pretrain into ``files.output``; returns the result (None off rank 0)."""
    # lazy: torch, in the job's child process only (the worker has none)
    from models.pretraining.pretrain import pretrain

    settings = Settings()
    spec = job["spec"]
    main = dist_ctx is None or dist_ctx.is_main
    progress = ProgressWriter(files, enabled=main)
    progress.update(force=True, phase="reading corpus")
    options = {k: spec[k] for k in ("lr", "max_length", "seed", "head_warmup_steps")
               if spec.get(k) is not None}

    def on_progress(_fraction: float, info: dict) -> None:
        progress.update(phase="pretraining", step=info["step"], total=info["total"],
                        loss=info["loss"])

    out = pretrain(spec.get("base_path"), files.output, spec["objective"], spec["mechanism"],
                   float(spec["params"]["eta"]), steps=int(spec["steps"]),
                   batch_size=int(spec.get("batch_size") or 32),
                   corpus_paths=corpus_paths(settings), device=settings.device,
                   precision=settings.precision, progress=False, should_stop=files.cancelled,
                   on_progress=on_progress, dist_ctx=dist_ctx,
                   allow_weak_privacy=bool(spec.get("allow_weak_privacy")), **options)
    if not main:
        return None
    import json
    import shutil

    shutil.rmtree(out / "checkpoints", ignore_errors=True)  # the base is the final weights
    info = json.loads((out / "pretrain.json").read_text())
    progress.update(force=True, phase="done")
    losses = info.get("loss_curve") or []
    return {"name": spec["name"], "bundle_id": info["bundle_id"],
            "metrics": {"steps": info["steps"], "final_loss": losses[-1][1] if losses else None,
                        "train_seconds": info.get("train_seconds"),
                        "tokens_seen": info.get("tokens_seen"),
                        "world_size": info.get("world_size", 1)}}
