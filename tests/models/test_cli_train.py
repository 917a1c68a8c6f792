"""`cloud-api train | evaluate | export-bundle`: the happy paths on a tiny BERT, and bad input
answered with one line and exit code 2 before any training starts."""

from __future__ import annotations

import re

import pytest

import models.training.experiment
from cloud_api.cli import main
from tests.conftest import TINY_WORDS
from tests.models.conftest import (
    make_full_tiny_bert,
    sentiment_texts,
    token_records,
    write_tsv,
)

FAST = ["--epochs", "1", "--lr", "1e-3", "--batch-size", "8", "--no-progress"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli-data")
    texts, _, labels = sentiment_texts(24, seed=5)
    dtexts, _, dlabels = sentiment_texts(12, seed=6)
    return {"train": write_tsv(d / "train.tsv", texts, labels),
            "dev": write_tsv(d / "dev.tsv", dtexts, dlabels), "dir": d}


@pytest.fixture
def no_training(monkeypatch):
    """Any call into fine-tuning fails the test: errors must come before training."""
    def boom(*a, **k):
        raise AssertionError("training started")

    monkeypatch.setattr(models.training.experiment, "finetune", boom)


def run(capsys, *argv) -> tuple[int, str, str]:
    try:
        rc = main(list(argv))
    except SystemExit as exc:  # argparse errors
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def one_error_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip() and "warning" not in x]
    assert len(lines) == 1, err
    assert lines[0].startswith("cloud-api: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_train_then_evaluate_tsv(capsys, data, tiny_bert_dir, tmp_path):
    """At eta=50 the tiny table's tokens come back unchanged (the floor starts near 12):
    training needs --allow-weak-privacy, says so, records it, and evaluation follows."""
    from models.versions.version_folder import read_config

    out = tmp_path / "m"
    rc, stdout, err = run(capsys, "train", "--data", str(data["train"]), "--dev",
                          str(data["dev"]), "--mechanism", "dchi-text", "--eta", "50",
                          "--base", str(tiny_bert_dir), "--out", str(out), "--seed", "3",
                          "--allow-weak-privacy", *FAST)
    assert rc == 0, err
    assert "seed" in err and "warning" in err  # a known seed removes the protection
    assert f"model={out}" in stdout and re.search(r"dev_accuracy=0\.\d{4}", stdout)
    assert "guarantee: dchi-text" in stdout
    assert "weak privacy (--allow-weak-privacy): dchi-text eta=50 is weaker than the privacy " \
           "floor" in stdout
    assert "weaker than the privacy floor" in read_config(out)["weak_privacy"]
    rc, stdout, err = run(capsys, "evaluate", "--model", str(out), "--data", str(data["dev"]),
                          "--no-progress")
    assert rc == 0, err
    assert re.match(r"accuracy=[01]\.\d{4}\n", stdout)
    assert "class=neg precision=" in stdout and "class=pos precision=" in stdout


def test_sentence_pairs_tsv(capsys, tiny_bert_dir, tmp_path):
    texts, pairs, labels = sentiment_texts(16, pairs=True)
    tsv = write_tsv(tmp_path / "pairs.tsv", texts, labels, pairs=pairs)
    out = tmp_path / "m"
    rc, stdout, err = run(capsys, "train", "--data", str(tsv), "--dev", str(tsv), "--mechanism",
                          "dchi-embedding", "--eta", "5", "--base", str(tiny_bert_dir), "--out",
                          str(out), *FAST)
    assert rc == 0, err
    rc, stdout, err = run(capsys, "evaluate", "--model", str(out), "--data", str(tsv),
                          "--no-progress")
    assert rc == 0 and stdout.startswith("accuracy="), err
    single = write_tsv(tmp_path / "single.tsv", texts, labels)
    rc, _, err = run(capsys, "train", "--data", str(single), "--dev", str(tsv), "--mechanism",
                     "none", "--base", str(tiny_bert_dir), "--out", str(tmp_path / "x"), *FAST)
    assert rc == 2 and "pairs" in one_error_line(err)
    # a pairs model evaluated on single sentences: refused, not silently scored
    rc, _, err = run(capsys, "evaluate", "--model", str(out), "--data", str(single),
                     "--no-progress")
    assert rc == 2 and "trained on sentence pairs" in one_error_line(err)


def test_base_checkpoint_provenance(capsys, tiny_bert_dir, tiny_encoder_bundle, tmp_path):
    """A vector mechanism refuses --base; a pretraining checkpoint's mechanism and eta are
    recorded, with a warning when they are not the task's."""
    import json

    from models.versions.version_folder import read_config

    texts, _, labels = sentiment_texts(16)
    tsv = write_tsv(tmp_path / "t.tsv", texts, labels)
    tiny_encoder_bundle.save(tmp_path / "bundle")
    rc, _, err = run(capsys, "train", "--data", str(tsv), "--mechanism", "laplace",
                     "--epsilon", "1", "--bundle", str(tmp_path / "bundle"), "--base",
                     str(tiny_bert_dir), "--out", str(tmp_path / "v"), *FAST)
    assert rc == 2 and "--base does not apply to laplace" in one_error_line(err)
    pre = tmp_path / "pre"
    import shutil

    shutil.copytree(tiny_bert_dir, pre)
    (pre / "pretrain.json").write_text(json.dumps(
        {"objective": "denoising", "mechanism": "dchi-text", "eta": 6.0, "steps": 3}))
    for eta, warned in (("6", False), ("7", True)):
        out = tmp_path / f"m{eta}"
        rc, _, err = run(capsys, "train", "--data", str(tsv), "--mechanism", "dchi-text",
                         "--eta", eta, "--base", str(pre), "--out", str(out), *FAST)
        assert rc == 0, err
        assert ("was pretrained with dchi-text eta=6.0" in err) is warned
        cfg = read_config(out)["pretraining"]
        assert cfg["objective"] == "denoising" and cfg["matches"] is not warned


def test_train_on_edge_records_and_export_onnx(capsys, tiny_bert_dir, tiny_bert_bundle, tmp_path):
    texts, _, labels = sentiment_texts(16)
    recs = token_records(tiny_bert_bundle, "none", texts, labels)
    jsonl = tmp_path / "edge.jsonl"
    jsonl.write_text("".join(r.model_dump_json() + "\n" for r in recs))
    out = tmp_path / "m"
    rc, stdout, err = run(capsys, "train", "--records", str(jsonl), "--dev-records", str(jsonl),
                          "--base", str(tiny_bert_dir), "--out", str(out), *FAST)
    assert rc == 0, err
    assert "mechanism=none" in stdout
    rc, stdout, err = run(capsys, "evaluate", "--model", str(out), "--records", str(jsonl))
    assert rc == 0 and stdout.startswith("accuracy="), err
    rc, stdout, err = run(capsys, "export-bundle", "--onnx", "--model", str(out))
    assert rc == 0, err
    assert (out / "classifier.onnx").is_file()


def test_vector_mechanism_with_exported_bundle(capsys, data, tiny_encoder_bundle, tmp_path):
    bdir = tmp_path / "bundle"
    tiny_encoder_bundle.save(bdir)
    out = tmp_path / "m"
    rc, stdout, err = run(capsys, "train", "--data", str(data["train"]), "--mechanism",
                          "laplace", "--epsilon", "2", "--calibration", "coordinate",
                          "--bundle", str(bdir), "--out", str(out), *FAST)
    assert rc == 0, err
    # the honest accounting: coordinate calibration holds r*eps for the whole vector
    assert "published eps=2; holds eps=32" in stdout
    rc, stdout, err = run(capsys, "evaluate", "--model", str(out), "--data", str(data["dev"]),
                          "--bundle", str(bdir), "--no-progress")
    assert rc == 0 and stdout.startswith("accuracy="), err


def test_export_bundle_cli(capsys, tiny_bert_dir, tmp_path):
    rc, stdout, err = run(capsys, "export-bundle", "--out", str(tmp_path / "b"), "--model-dir",
                          str(tiny_bert_dir), "--pooling", "mean")
    assert rc == 0, err
    assert "encoder pooling=mean output_dim=16" in stdout
    assert (tmp_path / "b" / "encoder.onnx").is_file()


# -- bad input: one line, exit 2, nothing trained -------------------------------------------
def _bad_tsvs(d):
    (d / "cols.tsv").write_text("text\tlabel\ngood\t1\n")
    (d / "empty.tsv").write_text("sentence\tlabel\n")
    (d / "short.tsv").write_text("sentence\tlabel\ngood film\n")
    (d / "other.tsv").write_text("sentence\tlabel\ngood film\tmaybe\n")
    (d / "bad.jsonl").write_text('{"payload": {"mechanism": "none"}, "label": 0}\n')
    return d


@pytest.mark.parametrize("case", [
    "missing columns", "short row", "empty data set", "missing file", "bad records",
    "laplace without encoder", "texthide without key", "no eta", "out exists",
    "dev labels unknown", "missing --out",
])
def test_train_bad_input(case, capsys, data, tiny_bert_dir, tiny_encoder_bundle, tmp_path,
                         no_training):
    d = _bad_tsvs(tmp_path)
    tiny_encoder_bundle.save(tmp_path / "bundle")
    out = tmp_path / "out"
    base = ["--base", str(tiny_bert_dir), *FAST]
    argv = {
        "missing columns": ["--data", str(d / "cols.tsv"), "--mechanism", "none"],
        "short row": ["--data", str(d / "short.tsv"), "--mechanism", "none"],
        "empty data set": ["--data", str(d / "empty.tsv"), "--mechanism", "none"],
        "missing file": ["--data", str(d / "nope.tsv"), "--mechanism", "none"],
        "bad records": ["--records", str(d / "bad.jsonl")],
        "laplace without encoder": ["--data", str(data["train"]), "--mechanism", "laplace",
                                    "--epsilon", "1"],
        "texthide without key": ["--data", str(data["train"]), "--mechanism", "texthide",
                                 "--m", "4", "--k", "2", "--bundle", str(tmp_path / "bundle")],
        "no eta": ["--data", str(data["train"]), "--mechanism", "dchi-text"],
        "out exists": ["--data", str(data["train"]), "--mechanism", "none"],
        "dev labels unknown": ["--data", str(data["train"]), "--dev", str(d / "other.tsv"),
                               "--mechanism", "none"],
        "missing --out": ["--data", str(data["train"]), "--mechanism", "none"],
    }[case]
    if case == "out exists":
        out.mkdir()
        (out / "config.json").write_text("{}")
    extra = [] if case == "missing --out" else ["--out", str(out)]
    rc, _, err = run(capsys, "train", *argv, *extra, *base)
    assert rc == 2
    line = one_error_line(err)
    if case != "out exists":
        assert not out.exists()
    expect = {"missing columns": "header", "short row": "column", "empty data set": "empty",
              "missing file": "no such file", "bad records": "bad.jsonl:1",
              "laplace without encoder": "encoder", "texthide without key": "--texthide-key",
              "no eta": "--eta", "out exists": "already exists",
              "dev labels unknown": "maybe", "missing --out": "--out"}[case]
    assert expect in line


def test_base_of_another_bundle_or_dimension(capsys, tiny_bert_dir, tiny_bert_bundle, tmp_path,
                                             no_training, data):
    bdir = tmp_path / "bundle"
    tiny_bert_bundle.save(bdir)
    other = make_full_tiny_bert(tmp_path / "other", dim=16, seed=7)  # same vocab, other table
    wider = make_full_tiny_bert(tmp_path / "wider", dim=24, seed=0)
    for base, word in ((other, "differ"), (wider, "do not match")):
        rc, _, err = run(capsys, "train", "--data", str(data["train"]), "--mechanism",
                         "dchi-text", "--eta", "5", "--bundle", str(bdir), "--base", str(base),
                         "--out", str(tmp_path / "o"), *FAST)
        assert rc == 2
        assert word in one_error_line(err)
    # records of one bundle, base (and so bundle) of another
    recs = token_records(tiny_bert_bundle, "none", ["good film"] * 4, ["pos", "neg"] * 2)
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text("".join(r.model_dump_json() + "\n" for r in recs))
    rc, _, err = run(capsys, "train", "--records", str(jsonl), "--base", str(other), "--out",
                     str(tmp_path / "o"), *FAST)
    assert rc == 2 and "bundle" in one_error_line(err)
    assert not (tmp_path / "o").exists()


def test_evaluate_bad_input(capsys, data, tiny_bert_dir, tmp_path):
    out = tmp_path / "m"
    rc, _, err = run(capsys, "train", "--data", str(data["train"]), "--mechanism", "none",
                     "--base", str(tiny_bert_dir), "--out", str(out), *FAST)
    assert rc == 0, err
    d = _bad_tsvs(tmp_path)
    for argv, word in (
        (["--model", str(out), "--data", str(d / "other.tsv")], "unknown label"),
        (["--model", str(out), "--data", str(d / "empty.tsv")], "empty"),
        (["--model", str(tmp_path / "nope"), "--data", str(data["dev"])], "not a model folder"),
        (["--data", str(data["dev"])], "--model"),
    ):
        rc, _, err = run(capsys, "evaluate", *argv)
        assert rc == 2
        assert word in one_error_line(err)


def test_attack_cli_dchi(capsys, data, tiny_bert_bundle, tmp_path):
    bdir = tmp_path / "bundle"
    tiny_bert_bundle.save(bdir)
    rc, stdout, err = run(capsys, "evaluate", "--attack", "--mechanism", "dchi-text", "--eta",
                          "40", "--bundle", str(bdir), "--data", str(data["dev"]), "--tokens",
                          "all", "--samples", "20", "--device", "cpu")
    assert rc == 0, err
    assert "token embedding inversion" in stdout and "N_w" in stdout
    assert f"{len(TINY_WORDS)} regular tokens x 20 perturbations" in stdout
    rc, _, err = run(capsys, "evaluate", "--attack", "--mechanism", "dchi-text", "--bundle",
                     str(bdir), "--data", str(data["dev"]))
    assert rc == 2 and "--eta" in one_error_line(err)


def test_token_ids_outside_the_vocabulary_refused_before_training(
        capsys, tiny_bert_dir, tiny_bert_bundle, tmp_path, no_training):
    """A record id past the vocabulary (or a non-regular dchi-text id) is one clear error,
    not an IndexError in the embedding lookup at the first step."""
    from shared.payload import Record, make_payload

    b = tiny_bert_bundle
    bdir = tmp_path / "bundle"
    b.save(bdir)
    cases = {
        "none": ([5, b.vocab_size], "outside the vocabulary"),
        "dchi-text": ([int(b.regular_ids[0]), b.special_ids["cls"]], "not a regular token"),
    }
    for mech, (ids, word) in cases.items():
        params = {} if mech == "none" else {"eta": 8.0}
        good = make_payload(mech, params, b.bundle_id, [int(b.regular_ids[0])] * 2)
        bad = make_payload(mech, params, b.bundle_id, ids)
        recs = [Record(payload=good, label=0), Record(payload=good, label=1),
                Record(payload=bad, label=1)]
        jsonl = tmp_path / f"{mech}.jsonl"
        jsonl.write_text("".join(r.model_dump_json() + "\n" for r in recs))
        rc, _, err = run(capsys, "train", "--records", str(jsonl), "--bundle", str(bdir),
                         "--base", str(tiny_bert_dir), "--out", str(tmp_path / "o"), *FAST)
        assert rc == 2, err
        assert word in one_error_line(err)
        assert not (tmp_path / "o").exists()


def test_evaluate_records_with_an_id_outside_the_vocabulary(capsys, tiny_bert_dir,
                                                            tiny_bert_bundle, tmp_path):
    from shared.payload import Record, make_payload

    b = tiny_bert_bundle
    recs = token_records(b, "none", ["good film", "bad film"] * 4, ["pos", "neg"] * 4)
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text("".join(r.model_dump_json() + "\n" for r in recs))
    out = tmp_path / "m"
    rc, _, err = run(capsys, "train", "--records", str(jsonl), "--base", str(tiny_bert_dir),
                     "--out", str(out), *FAST)
    assert rc == 0, err
    bad = Record(payload=make_payload("none", {}, b.bundle_id, [5, b.vocab_size + 3]),
                 label="pos")
    (tmp_path / "bad.jsonl").write_text(bad.model_dump_json() + "\n")
    rc, _, err = run(capsys, "evaluate", "--model", str(out), "--records",
                     str(tmp_path / "bad.jsonl"))
    assert rc == 2, err
    assert "outside the model's vocabulary" in one_error_line(err)


@pytest.mark.parametrize(("params", "needle"), [
    (["--mechanism", "dchi-text", "--eta", "50"], "weaker than the privacy floor"),
    (["--mechanism", "dchi-embedding", "--eta", "1e308"], "worst-case epsilon per token"),
    (["--mechanism", "dchi-text", "--eta", "1e-40"], "eta=1e-40 is too small to compute"),
], ids=["weak", "infinite worst case", "uncomputable"])
def test_train_refuses_parameters_below_the_floor_before_any_work(
        params, needle, capsys, data, tiny_bert_dir, tmp_path, no_training, monkeypatch):
    """Refused with exit 2 and one line (naming --allow-weak-privacy where it applies),
    before privatization or training; nothing is written."""
    class NoPublicText:
        def __init__(self, *a, **k):
            raise AssertionError("tokenization or privatization started")

    monkeypatch.setattr(models.training.experiment, "PublicText", NoPublicText)
    rc, _, err = run(capsys, "train", "--data", str(data["train"]), *params, "--base",
                     str(tiny_bert_dir), "--out", str(tmp_path / "o"), *FAST)
    line = one_error_line(err)
    assert rc == 2 and needle in line
    assert ("--allow-weak-privacy" in line) is (needle != "eta=1e-40 is too small to compute")
    assert "RuntimeWarning" not in err and not (tmp_path / "o").exists()
