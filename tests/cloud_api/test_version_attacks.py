"""Model versions against a corrupt file (issue 34, finding 4), through a real `cloud-api
serve` (torch backend) on a home of tiny dchi-text versions built for it:

* ``ctx``: v1 reads a contextual denoiser; v2, registered whole, then has 4 KB of its
  ``denoiser.safetensors`` overwritten with NaNs (the finding's attack). v2 is refused at
  promotion (HTTP and CLI), at load (a pointer moved without that check), and by a
  retraining job, each in one line naming the file; v1 keeps serving and /readyz says why.
* ``nan``: v1 has finite weights that give NaN scores for one token id (its embedding row
  overflows a LayerNorm): a prediction that reaches it is a 500 ``non-finite-scores``,
  counted, and its charge refunded; the others are answered.
* ``old``: versions from before manifests (their manifest.json removed): a sound one is
  sealed on its first verified load; one with NaNs in its denoiser is refused.

The retraining job's later links (the child reading a base changed since it was submitted,
the publisher sealing an output with NaN weights) are checked on the same folders."""

from __future__ import annotations

import json
import shutil
import struct
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest

from cloud_api.auth import key_id
from cloud_api.errors import InvalidRequest, problem_type
from cloud_api.home import ModelHome
from models.versions.manifest import MANIFEST_FILE, IntegrityError, file_sha256
from shared.payload import make_payload
from tests.cloud_api.conftest import ServerProcess, cloud_api, new_keys

ETA = 4.0
PROBLEM = "application/problem+json"


def nan_overwrite(path: Path, offset: int, size: int = 4096) -> None:
    """``size`` bytes of a safetensors file's data, from ``offset`` in its data, set to
    float32 NaNs (the finding's 4 KB)."""
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little") + offset
    assert start + size <= len(data)
    data[start:start + size] = struct.pack("<f", float("nan")) * (size // 4)
    path.write_bytes(bytes(data))


def tensor_offset(path: Path, name: str) -> int:
    header = json.loads(path.read_bytes()[8:8 + int.from_bytes(path.read_bytes()[:8],
                                                                  "little")])
    return int(header[name]["data_offsets"][0])


def corrupt_denoiser(folder: Path) -> None:
    """NaNs over 16 rows of the denoiser's per-output table ``sparse_val`` (40 x 64 float32
    on the tiny table): the outputs of those ids read NaN, the others do not."""
    f = folder / "denoiser.safetensors"
    nan_overwrite(f, tensor_offset(f, "sparse_val") + 10 * 64 * 4)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The home (module docstring), with its bundle, and the ids ``nan`` reads as NaN."""
    import torch

    from cloud_api.serving.backends import warmup_payloads
    from cloud_api.serving.bundles import BundleStore
    from models.attacks.denoiser import new_denoiser
    from models.nets.backbone import load_bert
    from models.nets.classifiers import build_classifier
    from models.training.posterior import build_posterior
    from models.versions.model_version import save_model_version
    from shared.bundle import EdgeBundle
    from tests.conftest import make_full_tiny_bert
    from tests.models.conftest import sentiment_texts

    tmp = tmp_path_factory.mktemp("version-attacks")
    bert_dir = make_full_tiny_bert(tmp / "bert")
    b = EdgeBundle.from_model(bert_dir)
    home = ModelHome(tmp / "home").ensure()
    BundleStore(home).add(b)
    cfg = {"kind": "tokens", "mechanism": "dchi-text", "params": {"eta": ETA},
           "bundle_id": b.bundle_id, "special_ids": b.special_ids, "labels": ["neg", "pos"],
           "max_length": 32}
    texts, _, _ = sentiment_texts(16, seed=2)
    table = build_posterior(b, "dchi-text", ETA, texts, rng=np.random.default_rng(0))
    torch.manual_seed(0)
    den = new_denoiser(table, b, layers=1, candidates=12, base=bert_dir)
    with torch.no_grad():
        den.out.weight.normal_(0, 0.3)  # reads the context
    ctx = save_model_version(tmp / "ctx", build_classifier(
        "dchi-text", 2, bert=load_bert(bert_dir), denoiser=den), {**cfg, "task": "ctx"}, {}, {})

    def register(model_id: str, src: Path, promote: bool = False) -> Path:
        version = home.register(model_id, src)
        if promote:
            home.promote(model_id, version)
        return home.version_dir(model_id, version)

    register("ctx", ctx, promote=True)
    corrupt_denoiser(register("ctx", ctx))  # v2: whole when registered, then overwritten
    # nan: finite weights, NaN scores for one id (a row of 3e38 overflows the LayerNorm)
    plain = build_classifier("dchi-text", 2, bert=load_bert(bert_dir))
    warm = {int(i) for p in warmup_payloads({**cfg, "architecture": {"bert_config": {
        "vocab_size": b.vocab_size}}}) for i in p.data_array()}
    poison = next(int(i) for i in b.regular_ids if int(i) not in warm)
    with torch.no_grad():
        plain.bert.embeddings.word_embeddings.weight[poison] = 3e38
    register("nan", save_model_version(tmp / "nan", plain, {**cfg, "task": "nan"}, {}, {}),
             promote=True)
    for corrupt in (False, True):  # old: v1 sound, v2 NaNs; neither with a manifest
        folder = register("old", ctx, promote=not corrupt)
        (folder / MANIFEST_FILE).unlink()
        if corrupt:
            corrupt_denoiser(folder)
    return home, b, poison, tmp


@pytest.fixture(scope="module")
def srv(built):
    home, _, _, tmp = built
    s = ServerProcess(home.root, tmp / "serve.log", new_keys(app=2), {
        "PRIVBERT_BACKEND": "torch", "PRIVBERT_WORKER_IN_SERVE": "0",
        "PRIVBERT_DEFAULT_BUDGET": "1e9", "PRIVBERT_RATE_LIMIT_PER_KEY": "0",
        "PRIVBERT_ALLOW_WEAK_PRIVACY": "1"})  # the task of ctx is declared at its eta 4
    s.start()
    yield s
    s.stop()


def admin(srv, method: str, path: str, **kw) -> httpx.Response:
    return httpx.request(method, f"{srv.url}{path}", headers=srv.headers(srv.admin_key),
                         timeout=60, **kw)


def predict(srv, model_id: str, bundle, ids, key: str | None = None,
            device: str | None = None) -> httpx.Response:
    p = make_payload("dchi-text", {"eta": ETA}, bundle.bundle_id, np.asarray(ids, np.int64))
    headers = {**srv.headers(key), "Content-Type": "application/json"}
    if device:
        headers["X-Device-Id"] = device
    return httpx.post(f"{srv.url}/v1/models/{model_id}/predict", headers=headers, timeout=60,
                      content='{"payloads":[' + p.model_dump_json(exclude_none=True) + "]}")


def served_version(srv, model_id: str) -> str:
    return srv.model(model_id)["version"]


def every_id_answers(srv, model_id: str, bundle) -> set[int]:
    """The status codes of one prediction per regular id (each id twice)."""
    return {predict(srv, model_id, bundle, [i, i]).status_code for i in bundle.regular_ids}


def test_a_corrupt_denoiser_is_never_promoted_served_or_built_on(srv, built):
    home, b, _, _ = built
    assert served_version(srv, "ctx") == "v1"
    why = "denoiser.safetensors does not match its SHA-256 in manifest.json"
    # promotion through the API: 422 naming the file, v1 keeps serving
    r = admin(srv, "POST", "/admin/models/ctx/promote", json={"version": "v2"})
    assert r.status_code == 422 and r.headers["content-type"] == PROBLEM, r.text
    assert why in r.json()["detail"] and "\n" not in r.json()["detail"]
    assert home.promoted("ctx") == "v1" and served_version(srv, "ctx") == "v1"
    # promotion by the CLI: one line, exit 2, the pointer unchanged
    cli = cloud_api("models", "promote", "ctx", "v2", "--home", str(home.root))
    lines = cli.stderr.strip().splitlines()
    assert cli.returncode == 2 and len(lines) == 1 and why in lines[0], cli.stderr
    assert home.promoted("ctx") == "v1"
    check = cloud_api("models", "verify", "ctx", "--home", str(home.root))
    assert check.returncode == 1 and check.stdout.splitlines()[0] == "ctx v1 ok", check.stdout
    assert check.stdout.splitlines()[1].startswith("ctx v2 NOT WHOLE: ") and why in check.stdout
    # a pointer moved without that check: the server refuses to load v2, v1 serves, and
    # /readyz says why while it stays ready
    failures = srv.metric("privbert_model_load_failure_total", model="ctx")
    with home.promotion_lock("ctx"):
        home.write_promoted("ctx", "v2")
    try:
        for _ in range(300):  # the server reads the pointer every 0.2 s
            ready = httpx.get(f"{srv.url}/readyz", timeout=10)
            if "failed to load" in (ready.json().get("problems") or {}).get("ctx", ""):
                break
            time.sleep(0.1)
        assert ready.status_code == 200, ready.text
        assert why in ready.json()["problems"]["ctx"] and "serving v1" in \
            ready.json()["problems"]["ctx"]
        assert srv.metric("privbert_model_load_failure_total", model="ctx") == failures + 1
        assert every_id_answers(srv, "ctx", b) == {200}
        assert served_version(srv, "ctx") == "v1"
        # a retraining job that would read v2 (its denoiser, by default) is refused
        r = admin(srv, "POST", "/admin/tasks", json={
            "task": "ctx", "labels": ["neg", "pos"], "mechanism": "dchi-text",
            "params": {"eta": ETA}, "bundle_id": b.bundle_id})
        assert r.status_code in (200, 201), r.text
        r = admin(srv, "POST", "/admin/retrain", json={"task": "ctx", "model_id": "ctx"})
        assert r.status_code == 422 and why in r.json()["detail"], r.text
        assert admin(srv, "GET", "/admin/jobs").json()["jobs"] == []
    finally:
        with home.promotion_lock("ctx"):
            home.write_promoted("ctx", "v1")
    print(f"\ncorrupt denoiser v2: API promote 422, CLI exit {cli.returncode}, retrain 422, "
          f"load refused and v1 serving; {len(b.regular_ids)} ids predicted, all 200")


def test_a_job_never_builds_on_or_publishes_non_finite_weights(built, tmp_path):
    """The job's later links: the child verifies what it reads (a base changed after the
    job was submitted is refused), and an output with NaN weights is never sealed,
    registered or promoted."""
    from cloud_api.home import seal_folder
    from cloud_api.jobs.retrain import read_whole

    home, *_ = built
    v1, v2 = home.version_dir("ctx", "v1"), home.version_dir("ctx", "v2")
    read_whole({"denoiser_path": str(v1 / "denoiser.safetensors")})  # whole: no error
    with pytest.raises(IntegrityError, match="denoiser.safetensors does not match"):
        read_whole({"denoiser_path": str(v2 / "denoiser.safetensors"), "base_path": None})
    out = tmp_path / "output"
    shutil.copytree(v2, out)
    (out / MANIFEST_FILE).unlink()  # as a job's output: no manifest yet
    with pytest.raises(InvalidRequest, match="tensor sparse_val holds NaN"):
        seal_folder(out)
    assert not (out / MANIFEST_FILE).exists()
    versions = home.versions("ctx")
    with pytest.raises(InvalidRequest, match="tensor sparse_val holds NaN"):
        home.register("ctx", out)
    assert home.versions("ctx") == versions


def test_non_finite_scores_are_a_500_that_is_counted_and_never_charged(srv, built):
    _, b, poison, _ = built
    key = srv.keys["app"][1]
    kid = key_id(key)
    other = next(int(i) for i in b.regular_ids if int(i) != poison)
    ok = predict(srv, "nan", b, [other, other], key, "dev-ok")
    assert ok.status_code == 200, ok.text
    scores = ok.json()["predictions"][0]["scores"]
    assert all(isinstance(v, float) and np.isfinite(v) for v in scores.values())
    spent = admin(srv, "GET", f"/admin/budgets/{kid}").json()["spent"]
    assert spent > 0
    before = (srv.metric("privbert_predictions_nonfinite_total", model="nan", version="v1"),
              srv.metric("privbert_privacy_refunds_total", reason="non-finite"))
    device = f"dev-{uuid.uuid4().hex[:8]}"
    bad = predict(srv, "nan", b, [other, poison, other], key, device)
    assert bad.status_code == 500 and bad.headers["content-type"] == PROBLEM, bad.text
    assert bad.json()["type"] == problem_type("non-finite-scores")
    assert "payloads[0]" in bad.json()["detail"] and "refunded" in bad.json()["detail"]
    view = admin(srv, "GET", f"/admin/budgets/{kid}").json()
    dev = next(d for d in view["devices"] if d["device_id"] == device)
    assert view["spent"] == pytest.approx(spent, rel=1e-12, abs=1e-9)
    assert dev["spent"] == pytest.approx(0.0, abs=1e-9)
    after = (srv.metric("privbert_predictions_nonfinite_total", model="nan", version="v1"),
             srv.metric("privbert_privacy_refunds_total", reason="non-finite"))
    assert after == (before[0] + 1, before[1] + 1)
    assert predict(srv, "nan", b, [other], key).status_code == 200  # the others still serve
    print(f"\nnon-finite scores: 500 {bad.json()['type']}, key spent {view['spent']:.6g} "
          f"before and after, counted {after[0] - before[0]:g}, refunded {after[1] - before[1]:g}")


def test_a_version_from_before_manifests_is_sealed_on_load_or_refused(srv, built):
    home, b, _, _ = built
    v1, v2 = home.version_dir("old", "v1"), home.version_dir("old", "v2")
    assert served_version(srv, "old") == "v1"
    sealed = json.loads((v1 / MANIFEST_FILE).read_text())["files"]  # its first load
    assert sealed == {f.name: file_sha256(f) for f in v1.iterdir()
                      if f.name != MANIFEST_FILE and not f.name.startswith(".")}
    assert "denoiser.safetensors" in sealed and "model.safetensors" in sealed
    r = admin(srv, "POST", "/admin/models/old/promote", json={"version": "v2"})
    assert r.status_code == 422, r.text
    assert "denoiser.safetensors: tensor sparse_val holds NaN" in r.json()["detail"]
    assert not (v2 / MANIFEST_FILE).exists() and home.promoted("old") == "v1"
    assert every_id_answers(srv, "old", b) == {200}


def test_the_servers_database_is_its_owners_alone(srv, built):
    """The SQLite database the server made in its home (records, budgets, key ids), and its
    journal, are 0600 (issue 34: 0644)."""
    import stat

    home, *_ = built
    files = sorted(home.root.glob("privbert.db*"))
    assert home.root / "privbert.db" in files
    assert {f.name: stat.S_IMODE(f.stat().st_mode) for f in files} == {
        f.name: 0o600 for f in files}
