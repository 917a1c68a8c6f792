"""Fixtures of the job tests: a migrated database on SQLite and on a real PostgreSQL
(``db``: every test that takes it runs on both), and a job home (``job_env``): the tiny
BERT saved as the base ``tiny`` and its bundle in ``$PRIVBERT_HOME``, a dchi-text task
with labelled records made by the edge's own Privatizer, on a SQLite database
(``pg_job_env``: the same on PostgreSQL)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from cloud_api.store.db import Database
from tests.cloud_api.conftest import ServerProcess, new_keys

ETA = 8.0  # tiny table: about 88% of tokens survive, far under the 97% floor (eta 10 keeps 96%:
# its measured floor check refuses one time in 200)
POSITIVE = ["good", "great", "fun", "funny", "love"]
NEGATIVE = ["bad", "awful", "dull", "boring", "hate"]
NEUTRAL = ["the", "a", "movie", "film", "plot", "actor", "story", "it", "this", "was", "is"]


def sentences(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """Synthetic sentences: "pos" iff a positive word is in it."""
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for i in range(n):
        y = i % 2
        words = list(rng.choice(NEUTRAL, size=int(rng.integers(2, 5))))
        words.insert(int(rng.integers(0, len(words) + 1)),
                     str(rng.choice(POSITIVE if y else NEGATIVE)))
        texts.append(" ".join(words))
        labels.append("pos" if y else "neg")
    return texts, labels


@dataclass
class JobEnv:
    home: Path
    db_url: str
    base: Path            # the tiny BERT folder (also saved as the base "tiny")
    bundle: object        # its EdgeBundle
    task: str
    texts: list[str]

    def settings(self, **kw):
        from cloud_api.settings import Settings

        values = dict(home=self.home, database_url=self.db_url, heartbeat_s=0.2,
                      heartbeat_timeout_s=30, reaper_interval_s=1, worker_poll_s=0.1,
                      min_records_per_label=8, device="cpu")
        values.update(kw)
        return Settings(**values)

    def database(self) -> Database:
        return Database(self.db_url, busy_timeout_s=10.0)


def add_records(db: Database, bundle, task, texts, labels, seed: int = 0) -> list[int]:
    """Store labelled records of ``texts`` privatized by the edge's Privatizer."""
    from cloud_api.store import records as store
    from edge_agent import Privatizer
    from shared.arrays import Limits
    from shared.mechanisms import DChiText
    from shared.payload import Record

    payloads = Privatizer(bundle, DChiText(bundle, ETA)).privatize(
        texts, rng=np.random.default_rng(seed))
    recs = [Record(payload=p, label=y) for p, y in zip(payloads, labels, strict=True)]
    raw = [r.model_dump(mode="json", exclude_none=True) for r in recs]
    checked = store.validate_records(task, raw, Limits.for_bundle(bundle, labels=task.labels))
    return store.add_records(db, task, checked, "test-key-id", None, None).ids


def served_home(tiny_home, root: Path) -> Path:
    """``root/home``: a copy of the bootstrapped tiny home for ``cloud-api serve`` (model
    text only, one model to load; no database, no jobs) with the tiny BERT as the base
    ``tiny``."""
    home = root / "home"
    shutil.copytree(tiny_home.root, home,
                    ignore=shutil.ignore_patterns("privbert.db*", "jobs", "emb"))
    shutil.copytree(tiny_home.base, home / "bases" / "tiny")
    return home


@contextmanager
def serve_jobs(tiny_home, tmp_path_factory, name: str,
               env: dict[str, str] | None = None) -> Iterator[ServerProcess]:
    """A running ``cloud-api serve`` of a :func:`served_home` in a fresh folder ``name``
    (``server.root``): no rate limit, CPU, heartbeats every 0.3 s, workers polling every
    0.2 s, then ``env``; stopped when the block ends."""
    root = tmp_path_factory.mktemp(name)
    server = ServerProcess(served_home(tiny_home, root), root / "serve.log", new_keys(), {
        "PRIVBERT_RATE_LIMIT_PER_KEY": "0", "PRIVBERT_HEARTBEAT_S": "0.3",
        "PRIVBERT_WORKER_POLL_S": "0.2", "PRIVBERT_DEVICE": "cpu", **(env or {})})
    server.start()
    server.root = root
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def job_template(tmp_path_factory):
    """A home, database, base, bundle, task and 96 records, made once and copied per test."""
    from cloud_api.home import ModelHome
    from cloud_api.serving.bundles import BundleStore
    from cloud_api.store import tasks
    from shared.bundle import EdgeBundle
    from tests.models.conftest import make_full_tiny_bert

    root = tmp_path_factory.mktemp("job-template")
    base = make_full_tiny_bert(root / "tiny-bert")
    home = ModelHome(root / "home").ensure()
    shutil.copytree(base, home.base_dir("tiny"))
    bundle = EdgeBundle.from_model(base)
    BundleStore(home).add(bundle)
    db = Database(f"sqlite:///{home.root / 'privbert.db'}")
    db.upgrade()
    task, _ = tasks.ensure_task(db, "sent", ["neg", "pos"], "dchi-text", {"eta": ETA},
                                bundle.bundle_id)
    texts, labels = sentences(96, seed=3)
    add_records(db, bundle, task, texts, labels)
    db.dispose()
    return root, base, bundle, texts


@pytest.fixture
def job_env(job_template, tmp_path) -> JobEnv:
    root, base, bundle, texts = job_template
    home = tmp_path / "home"
    shutil.copytree(root / "home", home)
    return JobEnv(home, f"sqlite:///{home / 'privbert.db'}", base, bundle, "sent", texts)


@pytest.fixture
def pg_job_env(job_template, tmp_path, fresh_postgres_url) -> JobEnv:
    """The same home, its task and records in a fresh PostgreSQL database."""
    from cloud_api.store import tasks

    root, base, bundle, texts = job_template
    home = tmp_path / "home"
    shutil.copytree(root / "home", home, ignore=shutil.ignore_patterns("privbert.db*"))
    db = Database(fresh_postgres_url)
    db.upgrade()
    task, _ = tasks.ensure_task(db, "sent", ["neg", "pos"], "dchi-text", {"eta": ETA},
                                bundle.bundle_id)
    add_records(db, bundle, task, texts, sentences(96, seed=3)[1])
    db.dispose()
    return JobEnv(home, fresh_postgres_url, base, bundle, "sent", texts)
