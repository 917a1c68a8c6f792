"""The contextual denoiser through `cloud-api`: trained with a model version from public text,
read again when retraining from device records, and as an attack in `evaluate --attack`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from models.attacks.denoiser import new_denoiser
from models.training.posterior import build_posterior
from tests.models.conftest import sentiment_texts, token_records, write_tsv
from tests.models.test_cli_train import no_training, one_error_line, run  # noqa: F401

ETA = 4.0
FAST = ["--epochs", "1", "--lr", "1e-3", "--batch-size", "8", "--no-progress"]


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_bert_bundle, tiny_bert_dir):
    d = tmp_path_factory.mktemp("denoiser-cli")
    b = tiny_bert_bundle
    b.save(d / "bundle")
    texts, _, labels = sentiment_texts(40, seed=3)
    table = build_posterior(b, "dchi-text", ETA, texts, rng=np.random.default_rng(0))
    new_denoiser(table, b, layers=1, candidates=12, base=tiny_bert_dir).save(d / "d.safetensors")
    return {"dir": d, "bundle": d / "bundle", "denoiser": d / "d.safetensors",
            "train": write_tsv(d / "train.tsv", texts, labels),
            "dev": write_tsv(d / "dev.tsv", *sentiment_texts(12, seed=4)[::2])}


def test_attack_prints_what_a_contextual_server_recovers(capsys, files):
    common = ["evaluate", "--attack", "--mechanism", "dchi-text", "--bundle",
              str(files["bundle"]), "--data", str(files["dev"]), "--tokens", "5", "--samples",
              "10", "--inversion-tokens", "200", "--device", "cpu", "--draws", "2"]
    rc, out, err = run(capsys, *common, "--eta", str(ETA), "--denoiser", str(files["denoiser"]))
    assert rc == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("contextual attack"))
    assert "a server with a contextual model of public text recovers" in line
    assert "% of tokens at this eta" in line and "cloud-api evaluate" not in out
    assert out.index("token embedding inversion") < out.index("guarantee: dchi-text") < \
        out.index("contextual attack")
    rc, out, err = run(capsys, *common, "--eta", str(ETA), "--denoiser",
                       str(files["denoiser"]), "--json")
    assert rc == 0, err
    ctx = json.loads(out)["contextual_attack"]
    assert ctx["draws"] == 2 and len(ctx["contextual_draws"]) == 2 and ctx["tokens"] > 40
    assert 0 < ctx["survive"] < 1 and ctx["denoiser"]["layers"] == 1
    # untrained, it reads each token alone: no more than the context-free posterior
    assert abs(ctx["contextual"] - ctx["context_free_smoothed"]) < 0.01
    # refused in one line, before any work: another eta, another mechanism, no eta
    for extra, word in ((["--eta", "5", "--denoiser", str(files["denoiser"])],
                         "trained for eta=4"),
                        (["--target-inversion", "0.4", "--denoiser", str(files["denoiser"])],
                         "give --eta"),
                        (["--eta", str(ETA), "--denoiser", str(files["dir"] / "nope")],
                         "no such denoiser file")):
        rc, _, err = run(capsys, *common, *extra)
        assert rc == 2 and word in one_error_line(err), err
    rc, _, err = run(capsys, *[a if a != "dchi-text" else "dchi-embedding" for a in common],
                     "--eta", str(ETA), "--denoiser", str(files["denoiser"]))
    assert rc == 2 and "dchi-text only" in one_error_line(err)


def test_train_with_a_denoiser_then_retrain_from_records(capsys, files, tiny_bert_dir,
                                                          tiny_bert_bundle, tmp_path):
    """`train --denoiser` trains one on the public text and the version carries it; records
    retrain reading the base version's; the recipe records it."""
    from models.versions.model_version import load_model
    from models.versions.version_folder import read_config

    out = tmp_path / "v1"
    rc, stdout, err = run(capsys, "train", "--data", str(files["train"]), "--mechanism",
                          "dchi-text", "--eta", str(ETA), "--bundle", str(files["bundle"]),
                          "--base", str(tiny_bert_dir), "--out", str(out), "--denoiser",
                          "--denoiser-layers", "1", "--denoiser-candidates", "16", *FAST)
    assert rc == 0, err
    assert "recipe: fresh_noise, posterior, denoiser" not in stdout  # 1 epoch: no refresh
    assert "denoiser" in next(ln for ln in stdout.splitlines() if ln.startswith("recipe:"))
    cfg = read_config(out)
    assert cfg["denoiser"]["layers"] == 1 and cfg["denoiser"]["candidates"] == 16
    assert cfg["recipe"]["denoiser"] is True and (out / "denoiser.safetensors").is_file()
    assert load_model(out).module.denoiser is not None
    b = tiny_bert_bundle
    texts, _, labels = sentiment_texts(24, seed=9)
    recs = files["dir"] / "recs.jsonl"
    recs.write_text("".join(r.model_dump_json() + "\n" for r in
                            token_records(b, "dchi-text", texts, labels, eta=ETA)))
    out2 = tmp_path / "v2"
    rc, stdout, err = run(capsys, "train", "--records", str(recs), "--bundle",
                          str(files["bundle"]), "--base", str(out), "--out", str(out2),
                          "--denoiser", *FAST)
    assert rc == 0, err
    assert read_config(out2)["denoiser"]["digest"] == cfg["denoiser"]["digest"]
    # records cannot train one: without a base that has one, a one-line refusal
    rc, _, err = run(capsys, "train", "--records", str(recs), "--bundle", str(files["bundle"]),
                     "--base", str(tiny_bert_dir), "--out", str(tmp_path / "v3"),
                     "--denoiser", *FAST)
    assert rc == 2 and "records cannot train one" in one_error_line(err)
    rc, _, err = run(capsys, "train", "--records", str(recs), "--bundle", str(files["bundle"]),
                     "--out", str(tmp_path / "v4"), "--denoiser-corpus", str(files["train"]),
                     *FAST)
    assert rc == 2 and "device records read an existing one" in one_error_line(err)


@pytest.mark.usefixtures("no_training")
def test_denoiser_flags_refused_where_they_make_no_sense(capsys, files, tmp_path, tiny_bert_dir):
    base = ["train", "--data", str(files["train"]), "--bundle", str(files["bundle"]), "--out",
            str(tmp_path / "x"), "--base", str(tiny_bert_dir), *FAST]
    for extra, word in (
            (["--mechanism", "dchi-embedding", "--eta", "4", "--denoiser"],
             "makes no sense for dchi-embedding"),
            (["--mechanism", "none", "--denoiser-layers", "2"], "makes no sense for none"),
            (["--mechanism", "dchi-text", "--eta", "4", "--no-denoiser", "--denoiser-layers",
              "2"], "contradict --no-denoiser"),
            (["--mechanism", "dchi-text", "--eta", "4", "--denoiser-file",
              str(files["denoiser"]), "--denoiser-epochs", "2"], "trained already"),
            (["--mechanism", "dchi-text", "--eta", "5", "--denoiser-file",
              str(files["denoiser"])], "trained for eta=4"),
            (["--mechanism", "dchi-text", "--eta", "4", "--denoiser-corpus",
              str(tmp_path / "missing.txt")], "no such corpus file")):
        rc, _, err = run(capsys, *base, *extra)
        assert rc == 2 and word in one_error_line(err), (extra, err)
