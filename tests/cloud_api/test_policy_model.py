"""A model trained under a token policy (shared.policy), end to end with the real commands:
`cloud-api train --policy` keeps its bundle, `cloud-api evaluate` finds the model's own
bundle (in the version, or in the home it was registered into), a real `cloud-api serve`
refuses payloads of another policy with a 4xx naming both, and the real `edge-agent`
privatizes under the model's policy."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys

import httpx
import pytest

from shared.bundle import EdgeBundle
from shared.policy import POLICIES
from tests.cloud_api.conftest import ServerProcess, cli_env, cloud_api, new_keys
from tests.cloud_api.test_web_browser import DEMO, _missing
from tests.conftest import REPO

ETA = 5.0


@pytest.fixture(scope="module")
def trained(tiny_home, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("policy")
    out = root / "m"
    p = cloud_api("train", "--data", str(tiny_home.data), "--dev", str(tiny_home.dev),
                  "--mechanism", "dchi-text", "--eta", str(ETA), "--policy", "function-words",
                  "--base", str(tiny_home.base), "--epochs", "1", "--device", "cpu",
                  "--no-progress", "--out", str(out), timeout=600)
    assert p.returncode == 0, p.stderr
    return {"root": root, "out": out, "stderr": p.stderr}


def test_train_under_a_policy_keeps_its_bundle_and_p(trained):
    cfg = json.loads((trained["out"] / "config.json").read_text())
    assert cfg["params"] == {"eta": ETA, "public_p": 0.3}  # --policy alone: p = 0.3
    b = EdgeBundle.load(trained["out"] / "bundle", expected_id=cfg["bundle_id"])
    assert b.policy is not None and b.policy.name == "function-words"
    assert b.has_embeddings  # the model's own table, with the policy


def test_evaluate_finds_the_models_bundle_in_its_home(tiny_home):
    """A version registered by `cloud-api bootstrap` holds no bundle/ of its own: its bundle
    is in the home's bundles/ folder, where evaluate (and --attack, the benches) find it."""
    from models.training.privatize import model_bundle_dir
    from models.versions.version_folder import read_config

    version = tiny_home.root / "models" / "text" / "versions" / "v1"
    assert not (version / "bundle").exists()
    bundle_id = read_config(version)["bundle_id"]
    assert model_bundle_dir(version, bundle_id) == tiny_home.root / "bundles" / bundle_id
    assert model_bundle_dir(version, "0" * 64) is None
    p = cloud_api("evaluate", "--model", str(version), "--data", str(tiny_home.dev),
                  "--device", "cpu", "--no-progress")
    assert p.returncode == 0, p.stderr
    assert "accuracy" in p.stdout


def test_served_under_its_policy_and_other_policies_refused(trained, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(trained["out"], tmp_path / "m")
    reg = cloud_api("models", "register", "--model-id", "pol", str(tmp_path / "m"),
                    "--promote", "--home", str(home))
    assert reg.returncode == 0, reg.stderr
    keys = new_keys()
    server = ServerProcess(home, tmp_path / "serve.log", keys).start()
    try:
        model = next(m for m in httpx.get(f"{server.url}/v1/models", headers=server.headers(),
                                          timeout=10).json()["models"] if m["id"] == "pol")
        assert model["params"] == {"eta": ETA, "public_p": 0.3}
        inp = tmp_path / "in.txt"
        inp.write_text("the movie is good\nit was a dull plot\n")
        env = cli_env({"PRIVBERT_API_KEY": server.app_key,
                       "PRIVBERT_CACHE": str(tmp_path / "cache")})
        run = [sys.executable, "-m", "edge_agent", "privatize", str(inp), "--mechanism",
               "dchi-text", "--eta", str(ETA), "--server", server.url, "--model", "pol",
               "--no-progress"]
        p = subprocess.run([*run, "--public-p", "0.3", "--post", "predict"], cwd=REPO,
                           capture_output=True, text=True, env=env, timeout=180)
        assert p.returncode == 0, p.stderr
        assert [json.loads(x)["line"] for x in p.stdout.splitlines()] == [1, 2]
        # the same words without the policy: a payload the model does not read
        out = tmp_path / "plain.jsonl"
        p = subprocess.run([*run[:-5], "--bundle", str(trained["out"] / "bundle"), "-o",
                            str(out), "--no-progress"], cwd=REPO, capture_output=True,
                           text=True, env=env, timeout=180)
        assert p.returncode == 0, p.stderr
        payload = json.loads(out.read_text().splitlines()[0])["payload"]
        assert "public_p" not in payload["params"]
        r = httpx.post(f"{server.url}/v1/models/pol/predict", headers=server.headers(),
                       json={"payloads": [payload]}, timeout=30)
        assert r.status_code in (409, 422), r.text
        detail = r.json()["detail"]
        assert "no token policy" in detail and "token policy public_p 0.3" in detail
        # the page's session (EdgeSession, in Node) under the model's policy: for a seed, the
        # bytes edge-agent sends; the guarantee says what it covers; its ledger counts the
        # public words apart; the model answers
        _session_sends_edge_agents_bytes(server, run, env, inp, tmp_path)
    finally:
        server.stop()


SESSION = """
import { EdgeSession, Pcg64Source, summary } from "@privbert/edge";
// the tiny test model's bundle is trusted by the page, as the suite trusts it in edge-agent
const s = await EdgeSession.open({ server: process.env.URL, apiKey: process.env.KEY, model: "pol",
  trustedBundles: process.env.TRUSTED });
const texts = process.env.TEXTS.split("\\n");
const sent = await s.privatize(texts, new Pcg64Source(21));
const r = await s.predict(texts[0]);
const st = await s.status();
console.log(JSON.stringify({ payloads: sent.map((x) => x.payload), costs: sent.map((x) => x.cost),
  summary: summary(s.guarantee), dchi: st.families.dchi, label: r.predictions[0].label,
  params: s.info.params }));
await s.close();
"""


def _session_sends_edge_agents_bytes(server, run, env, inp, tmp_path) -> None:
    from tests.web_edge.conftest import _node_ready

    if _node_ready() is not None:
        pytest.skip(_node_ready())
    out = tmp_path / "seeded.jsonl"
    # --no-memo: the device ledger holds these texts' payloads from the run above
    p = subprocess.run([*run, "--public-p", "0.3", "--seed", "21", "--no-memo", "-o", str(out)],
                       cwd=REPO, capture_output=True, text=True, env=env, timeout=180)
    assert p.returncode == 0, p.stderr
    texts = inp.read_text().splitlines()
    js = subprocess.run(["node", "--input-type=module", "-e", SESSION], cwd=REPO / "web_edge",
                        env={"PATH": os.environ["PATH"], "URL": server.url,
                             "KEY": server.app_key, "TEXTS": "\n".join(texts),
                             "TRUSTED": server.model("pol")["bundle_id"]},
                        capture_output=True, text=True, timeout=180)
    assert js.returncode == 0, js.stderr
    got = json.loads(js.stdout)
    lines = out.read_text().splitlines()
    assert [f'{{"payload":{x}}}' for x in got["payloads"]] == lines
    assert got["params"] == {"eta": ETA, "public_p": 0.3}
    assert "public words of policy function-words are sent unchanged with probability 0.7" \
        in got["summary"]
    public = sum(c.get("public", 0) for c in got["costs"])
    assert public > 0 and got["dchi"]["public"] == public  # the repeat of texts[0]: memoized
    assert got["label"] in server.model("pol")["labels"]


def test_the_page_marks_public_words_and_charges_the_rest(trained, tmp_path):
    """/demo on a model trained under function-words: the page privatizes with the model's
    public_p (the model answers), marks the public words it sent as is (and only those), shows
    the guarantee's policy clause, and its ledger counts the public words apart (all of them:
    none is charged)."""
    why = _missing()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    home = tmp_path / "home"
    shutil.copytree(trained["out"], tmp_path / "m")
    reg = cloud_api("models", "register", "--model-id", "pol", str(tmp_path / "m"),
                    "--promote", "--home", str(home))
    assert reg.returncode == 0, reg.stderr
    server = ServerProcess(home, tmp_path / "serve.log", new_keys(), {
        "PRIVBERT_DEMO": "1", "PRIVBERT_DEMO_KEY": "demo-" + os.urandom(8).hex(),
        "PRIVBERT_RATE_LIMIT_PER_KEY": "0"}).start()
    sentence = "the movie is good and the plot is a dull story"
    try:
        # the tiny model's bundle is trusted by the page (?trusted-bundles), as the suite
        # trusts it in edge-agent: too small a table for the text floor to measure
        bundle_id = server.model("pol")["bundle_id"]
        args = {"url": f"{server.url}/demo/?model=pol&trusted-bundles={bundle_id}",
                "sentence": sentence,
                "scenarios": ["predict"]}
        r = subprocess.run(["node", "test/drive.mjs", json.dumps(args)], cwd=DEMO,
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr[-4000:]
        scene = json.loads(r.stdout)["scenarios"]["predict"]
        assert "failed" not in scene, scene
        first = scene["result"]["first"]
        assert first["error"] is None, (first, scene["console"])
        assert first["prediction"].split(" ", 1)[0] in server.model("pol")["labels"]
        public = set(POLICIES["function-words"])
        kinds, classes = first["tokenKinds"], first["tokenClasses"]
        assert len(kinds) == len(first["tokens"]) == len(sentence.split())
        for word, sent_as, kind, cls in zip(sentence.split(), first["tokens"], kinds, classes,
                                            strict=True):
            assert (kind == "public") == (word in public and sent_as == word), (word, kind)
            assert cls == {"public": "public", "typed": "same", "near": "near",
                           "far": "far"}[kind]
        n_public = kinds.count("public")
        # p = 0.3: the 6 public words all privatized has probability 0.3^6 < 0.001
        assert n_public >= 1, first
        assert re.search(rf"Of {len(kinds)} word pieces: {n_public} public words sent as is, ",
                         first["tokenCounts"]), first["tokenCounts"]
        assert "public words" in first["guarantee"], first["guarantee"]
        assert any("Token policy function-words" in n for n in first["guaranteeNotes"])
        # the ledger counts every public word (not charged, outside the guarantee), those
        # the coin privatized too
        assert int(first["ledger"]["public"]) == sum(w in public for w in sentence.split())
        assert "public" in first["legend"] and "Sent as is" in first["legend"]
        calls = [x for x in scene["requests"] if x["url"].endswith("/predict")]
        assert calls, scene["requests"]
        body = json.loads(base64.b64decode(calls[0]["body"]))
        assert body["payloads"][0]["params"] == {"eta": ETA, "public_p": 0.3}
    finally:
        server.stop()
