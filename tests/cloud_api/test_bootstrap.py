"""`cloud-api bootstrap`: what it prints and leaves in the home (the session's tiny run), and
what it refuses (the privacy floor, bad flags) without writing anything."""

from __future__ import annotations

import json

from tests.cloud_api.conftest import cloud_api


def test_bootstrap_registers_promotes_and_reports(tiny_home):
    out = tiny_home.bootstrap_out["text"]
    assert "model=text version=v1 promoted" in out
    assert "training on the first 32 of 40 rows" in out  # the subset is said
    assert "guarantee: dchi-text: published eta=5" in out
    acc = [ln for ln in out.splitlines() if ln.startswith("dev_accuracy=")]
    assert acc and 0.0 <= float(acc[0].split("=")[1]) <= 1.0
    # the kept model on three fresh privatizations of the dev set, recorded and served
    fresh = [ln for ln in out.splitlines() if ln.startswith("dev_accuracy_fresh=")]
    mean, draws = fresh[0].removeprefix("dev_accuracy_fresh=").split(" draws=")
    draws = [float(x) for x in draws.split(",")]
    assert len(draws) == 3 and abs(float(mean) - sum(draws) / 3) < 1e-4
    # the default recipe of dchi-text; fresh noise needs a second epoch, so it is not recorded
    assert "recipe: posterior" in out
    models = tiny_home.root / "models" / "text"
    # the pointer as bootstrap left it (the session's later tests promote newer versions)
    assert tiny_home.promoted_at_start["text"] == "v1"
    config = json.loads((models / "versions" / "v1" / "config.json").read_text())
    assert config["task"] == "text" and config["mechanism"] == "dchi-text"
    assert config["recipe"]["levers"] == ["posterior"]
    assert (models / "versions" / "v1" / "posterior.npz").is_file()
    metrics = json.loads((models / "versions" / "v1" / "metrics.json").read_text())
    assert metrics["dev"]["fresh_draws"] == draws
    # bootstrapped with PRIVBERT_BACKEND=onnx: what the onnx backend serves is there, checked
    assert "exporting classifier.onnx" in out
    assert (models / "versions" / "v1" / "classifier.onnx").is_file()
    assert config["onnx"]["checked_max_abs_diff"] <= 1e-4
    bundle = tiny_home.root / "bundles" / config["bundle_id"] / "bundle.json"
    assert bundle.is_file()  # GET /v1/bundles/{id} can serve it
    assert not [p for p in models.iterdir() if p.name.startswith(".bootstrap-")]


def test_bootstrap_refuses_parameters_below_the_privacy_floor(tiny_home, tmp_path):
    home = tmp_path / "home"
    r = cloud_api("bootstrap", "--data", str(tiny_home.data), "--base", str(tiny_home.base),
                  "--eta", "500", "--model-id", "weak", "--home", str(home))
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("cloud-api: error:")]
    assert len(errors) == 1 and "privacy floor" in errors[0] and "--allow-weak-privacy" in \
        errors[0]
    assert "Traceback" not in r.stderr
    assert not (home / "models" / "weak").exists()


def test_bootstrap_bad_input_is_one_line_and_if_missing_does_nothing(tiny_home, tmp_path):
    r = cloud_api("bootstrap", "--data", str(tmp_path / "missing.tsv"), "--home",
                  str(tmp_path / "h"))
    assert r.returncode == 2 and "missing.tsv: no such file" in r.stderr
    assert "Traceback" not in r.stderr
    versions = tiny_home.root / "models" / "text" / "versions"
    before = sorted(p.name for p in versions.iterdir())
    again = cloud_api("bootstrap", "--data", str(tiny_home.data), "--model-id", "text",
                      "--if-missing", "--home", str(tiny_home.root))
    assert again.returncode == 0, again.stderr
    assert "already promoted; nothing to do" in again.stdout
    assert sorted(p.name for p in versions.iterdir()) == before


def test_serve_refuses_to_start_without_keys(tmp_path):
    r = cloud_api("serve", "--home", str(tmp_path / "h"), "--port", "0", timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().startswith("cloud-api: error: no API keys configured")
    assert len(r.stderr.strip().splitlines()) == 1


def test_serve_port_from_the_environment_is_checked(tmp_path):
    """--port defaults to $PRIVBERT_PORT (the serve image's HEALTHCHECK reads it too)."""
    r = cloud_api("serve", "--home", str(tmp_path / "h"), env={"PRIVBERT_PORT": "80a"},
                  timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == "cloud-api: error: PRIVBERT_PORT must be a port number, got '80a'"
    r = cloud_api("serve", "--home", str(tmp_path / "h"), env={"PRIVBERT_PORT": "70000"},
                  timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == "cloud-api: error: --port must be in [0, 65535], got 70000"


def test_register_with_an_unusable_bundle_is_one_line(tmp_path):
    from models.versions.version_folder import CONFIG_FILE, FORMAT, FORMAT_VERSION

    model, bundle = tmp_path / "model", tmp_path / "bundle"
    model.mkdir()
    bundle.mkdir()
    (model / CONFIG_FILE).write_text(json.dumps({
        "format": FORMAT, "format_version": FORMAT_VERSION, "bundle_id": "a" * 64,
        "mechanism": "dchi-text", "params": {"eta": 5.0}}))
    (bundle / "bundle.json").write_text("{}")
    r = cloud_api("models", "register", str(model), "--model-id", "m", "--bundle",
                  str(bundle), "--home", str(tmp_path / "h"), timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("cloud-api: error: ") and "bundle.json" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_bootstrap_keeps_three_layers_of_the_packaged_minilm_only():
    """The quick start's default: 3 of the packaged MiniLM's 6 layers; a --base keeps all of
    its layers, the vector MLPs have none, and --layers always wins."""
    from cloud_api.bootstrap import DEFAULT_LAYERS, _layers

    assert DEFAULT_LAYERS == 3
    assert _layers(None, None, "dchi-text") == 3 and _layers(None, None, "dchi-embedding") == 3
    assert _layers(None, "var/pre/denoise-65", "dchi-text") is None
    assert _layers(None, None, "laplace") is None
    assert _layers(6, None, "dchi-text") == 6 and _layers(2, "b", "dchi-text") == 2


def test_bootstrap_names_the_labels_or_refuses_names_that_miss_one(tiny_home, tmp_path):
    """--label-names: predictions and records say "negative"/"positive", not the TSV's
    labels; names that do not cover the data's labels are refused before any training."""
    home = tmp_path / "home"
    common = ["--data", str(tiny_home.data), "--base", str(tiny_home.base), "--home", str(home),
              "--eta", "5", "--epochs", "1", "--limit", "8", "--dev-draws", "0",
              "--device", "cpu", "--no-progress"]
    bad = cloud_api("bootstrap", *common, "--model-id", "bad", "--label-names", "0=negative,1=positive")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "--label-names must name exactly the data's labels ['neg', 'pos']" in bad.stderr
    assert not (home / "models" / "bad").exists()
    r = cloud_api("bootstrap", *common, "--model-id", "named", "--label-names",
                  "neg=negative,pos=positive")
    assert r.returncode == 0, r.stderr[-2000:]
    config = json.loads((home / "models" / "named" / "versions" / "v1" / "config.json").read_text())
    assert config["labels"] == ["negative", "positive"]
