"""Jobs through a real ``cloud-api serve`` (its worker thread on) and the real edge CLI:
records uploaded with ``edge-agent privatize --post records``, ``POST /admin/retrain``,
the job succeeds, the version is promoted and ``edge-agent privatize --post predict``
is answered by it without a restart; and every submission-time check answers 4xx."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from tests.cloud_api.conftest import REPO, cli_env
from tests.cloud_api.jobs.conftest import sentences, serve_jobs

ETA = 8.0  # as in conftest: far under the tiny table's floor (about 10.7)
PROBLEM = "urn:privbert:problem:"


@pytest.fixture(scope="module")
def jobs_server(tiny_home, tmp_path_factory):
    """A copy of the bootstrapped home (model text, dchi-text eta 5, v1) with the tiny BERT
    as the base ``tiny``, served with the worker thread on."""
    with serve_jobs(tiny_home, tmp_path_factory, "jobs-http") as server:
        yield server


def admin(server, method: str, path: str, **kw) -> httpx.Response:
    return httpx.request(method, server.url + path, headers=server.headers(server.admin_key),
                         timeout=30, **kw)


def declare(server, task: str, bundle_id: str, labels=("neg", "pos"), mechanism="dchi-text",
            eta: float = ETA) -> None:
    r = admin(server, "POST", "/admin/tasks", json={
        "task": task, "labels": list(labels), "mechanism": mechanism,
        "params": {"eta": eta}, "bundle_id": bundle_id})
    assert r.status_code in (200, 201), r.text


def post_records(server, task: str, bundle, texts, labels, eta: float = ETA) -> list[int]:
    from edge_agent import Privatizer
    from shared.mechanisms import DChiText

    payloads = Privatizer(bundle, DChiText(bundle, eta)).privatize(
        texts, rng=np.random.default_rng(5))
    body = {"task": task, "records": [
        {"payload": p.model_dump(mode="json", exclude_none=True), "label": y}
        for p, y in zip(payloads, labels, strict=True)]}
    r = httpx.post(server.url + "/v1/records", json=body, headers=server.headers(), timeout=30)
    assert r.status_code == 201, r.text
    return r.json()["ids"]


def wait_job(server, job_id: int, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = admin(server, "GET", f"/admin/jobs/{job_id}").json()
        if job["state"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} still {job['state']}: {job}")


def edge(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edge_agent.cli", *args], cwd=REPO,
                          env=cli_env(env), capture_output=True, text=True, timeout=180)


def test_cli_records_then_retrain_then_the_new_version_answers(jobs_server,
                                                                tiny_bundle_of_home, tmp_path):
    server = jobs_server
    declare(server, "e2e", tiny_bundle_of_home.bundle_id)
    texts, labels = sentences(80, seed=11)
    tsv = tmp_path / "train.tsv"
    tsv.write_text("".join(f"{t}\t{y}\n" for t, y in zip(texts, labels, strict=True)))
    env = {"PRIVBERT_API_KEY": server.app_key, "PRIVBERT_CACHE": str(tmp_path / "cache")}
    up = edge("privatize", str(tsv), "--tsv", "--mechanism", "dchi-text", "--eta", str(ETA),
              "--server", server.url, "--model", "text", "--post", "records", "--task", "e2e",
              "--no-progress", env=env)
    assert up.returncode == 0, up.stderr
    ids = [json.loads(line)["id"] for line in up.stdout.splitlines()]
    assert len(ids) == 80

    r = admin(server, "POST", "/admin/retrain", json={
        "task": "e2e", "model_id": "e2e", "base": "tiny", "epochs": 3, "lr": 1e-3,
        "batch_size": 8, "promote": True})
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    assert r.headers["location"] == f"/admin/jobs/{job_id}"
    job = wait_job(server, job_id)
    assert job["state"] == "succeeded", job
    assert job["version"] == "v1" and job["result"]["promoted"]
    assert job["watermark"] == max(ids) and job["attempts"] == 1
    assert job["progress"]["phase"] == "done" and job["heartbeat_at"]
    listed = admin(server, "GET", "/admin/jobs", params={"state": "succeeded"}).json()["jobs"]
    assert job_id in [j["job_id"] for j in listed]

    # the server serves the new model without a restart (the registry polls the pointer)
    deadline = time.monotonic() + 60
    while not any(m["id"] == "e2e" for m in httpx.get(
            server.url + "/v1/models", headers=server.headers(), timeout=10).json()["models"]):
        assert time.monotonic() < deadline, "the new model was not picked up"
        time.sleep(0.2)
    dev = tmp_path / "dev.txt"
    dev.write_text("\n".join(sentences(6, seed=12)[0]) + "\n")
    pred = edge("privatize", str(dev), "--mechanism", "dchi-text", "--eta", str(ETA),
                "--server", server.url, "--model", "e2e", "--post", "predict", "--no-progress",
                env=env)
    assert pred.returncode == 0, pred.stderr
    answers = [json.loads(line) for line in pred.stdout.splitlines()]
    assert len(answers) == 6 and all(a["label"] in ("neg", "pos") for a in answers)
    assert server.model("e2e")["version"] == "v1"
    # a finished job cannot be cancelled
    r = admin(server, "POST", f"/admin/jobs/{job_id}/cancel")
    assert r.status_code == 409 and r.json()["type"] == PROBLEM + "conflict"


def test_submission_checks_answer_4xx_before_any_job(jobs_server, tiny_bundle_of_home,
                                                     tmp_path):
    server = jobs_server
    bid = tiny_bundle_of_home.bundle_id
    declare(server, "few", bid)
    post_records(server, "few", tiny_bundle_of_home, ["good film", "bad plot", "great fun"],
                 ["pos", "neg", "pos"])
    declare(server, "enough", bid)
    texts, labels = sentences(24, seed=13)
    post_records(server, "enough", tiny_bundle_of_home, texts, labels)
    before = admin(server, "GET", "/admin/jobs").json()["jobs"]

    def retrain(**body):
        return admin(server, "POST", "/admin/retrain",
                     json={"task": "enough", "model_id": "chk", "base": "tiny", **body})

    r = retrain(task="nope")
    assert r.status_code == 404 and r.json()["type"] == PROBLEM + "not-found"
    r = retrain(task="few")
    assert r.status_code == 422 and r.json()["type"] == PROBLEM + "validation"
    assert "neg 1, pos 2" in r.json()["detail"] and "at least 8" in r.json()["detail"]
    for bad in ({"epochs": 0}, {"epochs": 101}, {"lr": 2.0}, {"lr": 0}, {"lr": "nan"},
                {"surprise": 1}, {"promote": "maybe"}, {"promote": "yes"}, {"promote": 1},
                {"epochs": "3"}, {"lr": "1e-4"}):
        r = retrain(**bad)
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["type"] == PROBLEM + "validation"
    # the recipe: levers that need raw public text, a posterior table that does not exist
    for lever in ({"fresh_noise": True}, {"denoise": 0.5}, {"rtd": 1.0}, {"distill": 0.5},
                  {"warm_start": True}):
        r = retrain(recipe=lever)
        assert r.status_code == 422, (lever, r.text)
        assert "need the raw public text" in r.json()["detail"], r.text
        assert next(iter(lever)) in r.json()["detail"]
    for bad in ({"denoise": -1.0}, {"fresh_noise": "yes"}, {"magic": True}):
        r = retrain(recipe=bad)
        assert r.status_code == 422 and r.json()["type"] == PROBLEM + "validation", r.text
    r = retrain(recipe={"posterior": True})
    assert r.status_code == 422 and "no promoted version with a posterior table" in \
        r.json()["detail"], r.text
    # a contextual denoiser: records cannot train one, and no promoted version has one
    r = retrain(recipe={"denoiser": True})
    assert r.status_code == 422 and r.json()["type"] == PROBLEM + "validation", r.text
    assert "no promoted version with a denoiser" in r.json()["detail"]
    assert "training one needs the raw public text" in r.json()["detail"]
    r = retrain(recipe={"denoiser": "yes"})
    assert r.status_code == 422 and r.json()["type"] == PROBLEM + "validation", r.text
    r = retrain(base="missing")
    assert r.status_code == 422 and "no base named 'missing'" in r.json()["detail"]
    # a base of another bundle (another tiny BERT), and one pretrained for another mechanism
    from tests.conftest import make_tiny_bert_dir

    home = server.home
    make_tiny_bert_dir(home / "bases" / "other", seed=7)
    r = retrain(base="other")
    assert r.status_code == 422 and "was made for bundle" in r.json()["detail"]
    shutil.copytree(home / "bases" / "tiny", home / "bases" / "emb-pre")
    (home / "bases" / "emb-pre" / "pretrain.json").write_text(json.dumps(
        {"bundle_id": bid, "mechanism": "dchi-embedding", "eta": ETA}))
    r = retrain(base="emb-pre")
    assert r.status_code == 422 and "pretrained with dchi-embedding" in r.json()["detail"]
    # a model id that serves other payloads (model text: eta 5; the task's records: eta 8)
    r = retrain(model_id="text")
    assert r.status_code == 422 and "serves parameters {'eta': 5.0}" in r.json()["detail"]
    # keys
    r = httpx.post(server.url + "/admin/retrain", json={"task": "enough", "model_id": "chk"},
                   headers=server.headers(), timeout=10)
    assert r.status_code == 403
    r = httpx.post(server.url + "/admin/retrain", json={}, timeout=10)
    assert r.status_code == 401
    # pretraining: a taken name, bad objective or parameters
    pre = {"objective": "denoising", "mechanism": "dchi-text", "params": {"eta": ETA},
           "steps": 5, "name": "tiny"}
    r = admin(server, "POST", "/admin/pretrain", json=pre)
    assert r.status_code == 409 and r.json()["type"] == PROBLEM + "conflict"
    for bad in ({"objective": "magic"}, {"params": {"eta": -1}}, {"steps": 0},
                {"mechanism": "laplace"}, {"name": "../x"}):
        r = admin(server, "POST", "/admin/pretrain", json={**pre, "name": "new", **bad})
        assert r.status_code == 422, (bad, r.text)
    # an eta whose tokens mostly come back unchanged (MiniLM's floor starts near 316)
    r = admin(server, "POST", "/admin/pretrain", json={**pre, "name": "new",
                                                       "params": {"eta": 1e6}})
    assert r.status_code == 422 and r.json()["type"] == PROBLEM + "weak-privacy", r.text
    assert "privacy floor" in r.json()["detail"]
    # reading and cancelling
    assert admin(server, "GET", "/admin/jobs", params={"state": "bogus"}).status_code == 422
    r = admin(server, "GET", "/admin/jobs/999999")
    assert r.status_code == 404 and r.json()["type"] == PROBLEM + "not-found"
    assert admin(server, "POST", "/admin/jobs/999999/cancel").status_code == 404
    assert admin(server, "GET", "/admin/jobs").json()["jobs"] == before  # nothing queued
