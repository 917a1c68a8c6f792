"""A retraining job's training throughput (worker + child process) against calling the
trainer directly on the same records, in the same run.

    python -m bench.job_overhead [--records 3000] [--epochs 2] [--rounds 2] [--threads N]

Data: the first ``--records`` SST-2 training sentences privatized on the edge path
(``edge_agent.Privatizer``, ``dchi-text`` η = 65, default MiniLM bundle), stored as the
records of a task in a SQLite database in a temporary ``$PRIVBERT_HOME``.

- job: ``POST /admin/retrain``'s job row (``jobs.queue.enqueue`` of the checked spec),
  run by ``cloud_api.jobs.supervisor.Worker.run(once=True)`` in this process, which claims it and
  runs the child ``python -m cloud_api.jobs.run``: snapshot from the database, the split by
  record-id hash, ``train_from_records``, test accuracy, registration of the version.
- direct: ``models.training.experiment.train_from_records`` called on the same train/dev records
  (the job's split), same ``TrainConfig`` (seed 0: the same batches), in a fresh Python
  process each round (``python -m bench.job_overhead --direct``), as cold as the job's child
  (a warm process reuses oneDNN kernels made for earlier batch shapes and trains faster).

Two figures per variant, examples/s = train examples x epochs / seconds:
- training phase: the trainer's own ``train_seconds`` (epoch loop with its dev evaluations),
  reported by the child for the job; the target (within 10%) is on this figure;
- end to end: job from claim to registered version (``claimed_at`` -> ``finished_at`` of
  the row: child start, imports, snapshot, training, test evaluation, registration);
  direct, from spawning its process to its exit (imports, snapshot, the
  ``train_from_records`` call: model built, trained, version written).
Variants alternate ``--rounds`` times (other processes share the cores); best of each.
``--threads N`` sets ``OMP_NUM_THREADS`` before torch is imported, so this process and the
job's child train with the same number of threads.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.common import DATA, machine, module_cmd, read_tsv, repo_env, table


def setup(root: Path, n: int, eta: float):
    """A home with a task of ``n`` privatized SST-2 records; returns (settings, db, home,
    task, bundle)."""
    import numpy as np

    from cloud_api.home import ModelHome
    from cloud_api.settings import Settings
    from cloud_api.store import records as store
    from cloud_api.store import tasks
    from cloud_api.store.db import Database
    from edge_agent import Privatizer
    from shared.arrays import Limits
    from shared.bundle import EdgeBundle
    from shared.mechanisms import DChiText
    from shared.payload import Record

    home = ModelHome(root / "home").ensure()
    settings = Settings(home=home.root, heartbeat_s=1.0, min_records_per_label=8,
                        device="cpu", log_json=False)
    db = Database.from_settings(settings)
    db.upgrade()
    bundle = EdgeBundle.from_model()
    rows = read_tsv(DATA / "sst2" / "train.tsv", limit=n)
    texts, labels = [r[0] for r in rows], [r[1] for r in rows]
    task, _ = tasks.ensure_task(db, "sst2", ["0", "1"], "dchi-text", {"eta": eta},
                                bundle.bundle_id)
    t = time.perf_counter()
    payloads = Privatizer(bundle, DChiText(bundle, eta)).privatize(
        texts, rng=np.random.default_rng(0))
    limits = Limits.for_bundle(bundle, labels=task.labels)
    for s in range(0, n, 512):
        recs = [Record(payload=p, label=y).model_dump(mode="json", exclude_none=True)
                for p, y in zip(payloads[s:s + 512], labels[s:s + 512], strict=True)]
        store.add_records(db, task, store.validate_records(task, recs, limits), "bench")
    print(f"setup: {n} records privatized and stored in {time.perf_counter() - t:.1f} s",
          flush=True)
    return settings, db, home, task, bundle


def run_job(settings, db, home, spec: dict) -> dict:
    from cloud_api.jobs import queue
    from cloud_api.jobs.supervisor import Worker

    job_id = queue.enqueue(db, "retrain", spec)
    t = time.perf_counter()
    state = Worker(settings, db, home).run(once=True)
    wall = time.perf_counter() - t
    job = queue.get(db, job_id)
    if state != "succeeded":
        raise SystemExit(f"job {job_id} {state}: {job.error}\n{job.log_tail}")
    m = job.result["metrics"]
    return {"train_s": m["train_seconds"], "n_train": m["train_examples"],
            "e2e_s": (job.finished_at - job.claimed_at).total_seconds(), "wall_s": wall,
            "test_acc": m["test_accuracy"], "dev_acc": m["dev_accuracy"],
            "log": job.log_tail}


def run_direct(settings, out: Path, epochs: int) -> dict:
    """The direct variant in a fresh process; returns its figures and its wall time."""
    import json
    import subprocess

    t = time.perf_counter()
    proc = subprocess.run(module_cmd("bench.job_overhead", "--direct", str(settings.home),
                                     str(out), str(epochs)),
                          capture_output=True, text=True, env=repo_env())
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"direct run failed:\n{proc.stderr[-3000:]}")
    shutil.rmtree(out, ignore_errors=True)
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "e2e_s": wall}


def direct_main(home: str, out: str, epochs: int) -> None:
    """``--direct``: snapshot, split, ``train_from_records``; one JSON line on stdout."""
    import json

    from cloud_api.jobs.retrain import load_snapshot, split_rows
    from cloud_api.serving.bundles import BundleStore
    from cloud_api.settings import Settings
    from models.training.experiment import train_from_records
    from models.training.finetune import TrainConfig

    settings = Settings(home=home)
    task, rows, _ = load_snapshot(settings, "sst2", None)  # what the job's child reads
    parts = split_rows(rows)
    bundle = BundleStore(settings.home).get(task.bundle_id)
    t = time.perf_counter()
    res = train_from_records(parts["train"], out, bundle=bundle, dev_records=parts["dev"],
                             cfg=TrainConfig(progress=False, epochs=epochs, seed=0,
                                             device="cpu"), label_names=list(task.labels))
    print(json.dumps({"train_s": res.metrics["train_seconds"], "n_train": res.n_train,
                      "call_s": time.perf_counter() - t,
                      "dev_acc": res.metrics["dev"]["accuracy"]}))


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--direct":
        return direct_main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=3000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--eta", type=float, default=65.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="torch threads in both "
                    "variants (default: torch's own choice)")
    args = ap.parse_args()
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # inherited by the job's child
    import torch

    load = os.getloadavg()[0]
    print(f"machine: {machine()}, torch {torch.__version__} ({torch.get_num_threads()} "
          f"threads), 1-minute load average {load:.2f} at the start", flush=True)
    root = Path(tempfile.mkdtemp(prefix="bench-jobs-"))
    try:
        settings, db, home, task, _bundle = setup(root, args.records, args.eta)
        from cloud_api.jobs.requests import RetrainRequest
        from cloud_api.jobs.specs import check_retrain
        from cloud_api.serving.bundles import BundleStore

        req = RetrainRequest(task="sst2", model_id="bench", epochs=args.epochs, seed=0)
        spec = check_retrain(db, home, BundleStore(home), settings, req)
        runs: dict[str, list[dict]] = {"direct": [], "job": []}
        for r in range(args.rounds):
            runs["direct"].append(run_direct(settings, root / f"direct-{r}", args.epochs))
            print(f"round {r + 1} direct: {runs['direct'][-1]}", flush=True)
            runs["job"].append(run_job(settings, db, home, spec))
            print(f"round {r + 1} job: " + str({k: v for k, v in runs["job"][-1].items()
                                                if k != "log"}), flush=True)
        print(runs["job"][-1]["log"])
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def best(name: str, key: str) -> float:
        return min(x[key] for x in runs[name])

    def median(name: str, key: str) -> float:
        import statistics

        return statistics.median(x[key] for x in runs[name])

    n = runs["job"][0]["n_train"] * args.epochs
    assert n == runs["direct"][0]["n_train"] * args.epochs
    rows = []
    for stat, fn in (("best", best), ("median", median)):
        for name in ("direct", "job"):
            tr, e2e = fn(name, "train_s"), fn(name, "e2e_s")
            rows.append([f"{name} ({stat})", f"{tr:.1f} s", f"{n / tr:,.1f}",
                         f"{fn('direct', 'train_s') / tr:.3f}", f"{e2e:.1f} s",
                         f"{n / e2e:,.1f}", f"{fn('direct', 'e2e_s') / e2e:.3f}",
                         ", ".join(f"{x['train_s']:.1f}/{x['e2e_s']:.1f}"
                                   for x in runs[name])])
    print()
    print(f"{runs['job'][0]['n_train']} train examples x {args.epochs} epochs = {n} examples; "
          f"dev accuracy direct {runs['direct'][0]['dev_acc']:.4f}, job "
          f"{runs['job'][0]['dev_acc']:.4f}; job test accuracy {runs['job'][0]['test_acc']:.4f}")
    print(table(["variant", "training phase", "examples/s", "vs direct", "end to end",
                 "examples/s", "vs direct", "all rounds (train/e2e s)"], rows))


if __name__ == "__main__":
    main()
