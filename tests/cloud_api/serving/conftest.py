"""Real tiny models for the serving core: a 2-layer, 16-wide BERT trained for one epoch on
synthetic privatized records (seconds on one core), registered into a fresh
``$PRIVBERT_HOME`` per test."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cloud_api.home import ModelHome
from cloud_api.settings import Settings
from models.training.finetune import TrainConfig
from tests.models.conftest import sentiment_texts, token_records

FAST = TrainConfig(epochs=1, lr=1e-3, batch_size=8, progress=False, seed=0)
ETA = 50.0


def run(coro):
    """Run one async test body on a fresh event loop."""
    return asyncio.run(coro)


async def until(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Let the event loop run until ``cond()`` holds; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread):
    yield


@pytest.fixture(scope="session")
def bert_dir(tiny_bert_dir) -> Path:
    """The session's tiny full BERT (tests/conftest.py), shared with tests/models."""
    return tiny_bert_dir


@pytest.fixture(scope="session")
def bundle(tiny_bert_bundle):
    return tiny_bert_bundle


@pytest.fixture(scope="session")
def records(bundle):
    """48 dchi-text records of 3..7 word pieces (labels neg/pos)."""
    texts, _, labels = sentiment_texts(48, seed=3)
    return token_records(bundle, "dchi-text", texts, labels, eta=ETA, seed=1)


@pytest.fixture(scope="session")
def trained(tmp_path_factory, bert_dir, bundle, records) -> dict[str, Path]:
    """Two dchi-text versions with different weights (seeds 0 and 1)."""
    from dataclasses import replace

    from models.training.experiment import train_from_records

    root = tmp_path_factory.mktemp("serving-trained")
    out = {}
    for name, seed in (("a", 0), ("b", 1)):
        res = train_from_records(records, root / name, bundle=bundle, dev_records=records[:8],
                                 base=bert_dir, cfg=replace(FAST, seed=seed))
        out[name] = res.model_dir
    return out


@pytest.fixture
def home(tmp_path, bundle) -> ModelHome:
    h = ModelHome(tmp_path / "home").ensure()
    bundle.save(h.bundle_dir(bundle.bundle_id))
    return h


def settings_for(home: ModelHome, **kw) -> Settings:
    base = dict(home=home.root, auth_disabled=True, reload_interval_s=0.05, max_wait_ms=5.0,
                queue_timeout_s=30.0)
    base.update(kw)
    return Settings(**base)


def add_version(home: ModelHome, model_id: str, src: Path, promote: bool = True) -> str:
    version = home.register(model_id, src)
    if promote:
        home.promote(model_id, version)
    return version


def broken_copy(src: Path, dest: Path) -> Path:
    """A version folder whose weights file is cut short."""
    shutil.copytree(src, dest)
    w = dest / "model.safetensors"
    w.write_bytes(w.read_bytes()[:100])
    return dest


def add_broken_version(home: ModelHome, model_id: str, src: Path, promote: bool = True) -> str:
    """A version registered whole (``register`` refuses a broken folder), then its weights
    file cut short in the home (a disk error, a hand edit); promoted (the pointer written
    without the check a promotion makes: as after the cut) when ``promote``."""
    version = home.register(model_id, src)
    w = home.version_dir(model_id, version) / "model.safetensors"
    w.write_bytes(w.read_bytes()[:100])
    if promote:
        with home.promotion_lock(model_id):
            home.write_promoted(model_id, version)
    return version
