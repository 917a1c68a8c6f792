"""The training recipe (models.training.recipe): each lever runs end to end through `cloud-api train`,
is recorded in the model version, and is refused in one line where it makes no sense."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from models.training.data import collate_dataset, collate_originals, dataset_from_records
from models.training.recipe import Recipe, default_recipe
from tests.models.conftest import sentiment_texts, token_records, write_tsv
from tests.models.test_cli_train import FAST, one_error_line, run

ETA = 4.0  # the tiny table: about half the tokens change (tests/models/test_posterior.py)


@pytest.fixture(scope="module")
def tsv(tmp_path_factory):
    d = tmp_path_factory.mktemp("recipe")
    texts, _, labels = sentiment_texts(24, seed=5)
    return write_tsv(d / "train.tsv", texts, labels)


def test_recipe_levers_where_they_apply():
    assert default_recipe("laplace", raw_text=True) == Recipe()
    text = default_recipe("dchi-text", raw_text=True)
    assert text.posterior and text.fresh_noise
    assert default_recipe("dchi-text", raw_text=False).levers() == ["posterior"]
    with pytest.raises(ValueError, match="--posterior makes no sense for laplace"):
        Recipe(posterior=True).check("laplace", raw_text=True)
    with pytest.raises(ValueError, match="--denoise makes no sense for ome"):
        Recipe(denoise=0.5).check("ome", raw_text=True)
    with pytest.raises(ValueError, match="fresh_noise, distill need the raw public text"):
        Recipe(fresh_noise=True, distill=0.5).check("dchi-text", raw_text=False)
    Recipe(posterior=True).check("dchi-embedding", raw_text=False)
    for bad in (Recipe(denoise=-1.0), Recipe(distill=1.5), Recipe(denoise_rate=0.0)):
        with pytest.raises(ValueError):
            bad.check("dchi-text", raw_text=True)
    r = Recipe(posterior=True, denoise=0.3)
    assert Recipe.from_dict(r.as_dict()) == r
    assert Recipe(ema=0.999).levers() == ["ema"]
    with pytest.raises(ValueError, match="rtd need the raw public text"):
        Recipe(rtd=1.0).check("dchi-text", raw_text=False)
    with pytest.raises(ValueError, match="--rtd makes no sense for laplace"):
        Recipe(rtd=1.0).check("laplace", raw_text=True)
    Recipe(ema=0.999).check("dchi-text", raw_text=False)  # no raw text needed
    with pytest.raises(ValueError, match="--ema must be in"):
        Recipe(ema=1.0).check("dchi-text", raw_text=True)


def test_originals_line_up_with_the_payload_positions(tiny_bert_bundle):
    """The denoising target of each payload position is the id it was privatized from; the
    special positions and padding are ignored (-100), pairs and truncation included."""
    b = tiny_bert_bundle
    texts, second, labels = sentiment_texts(6, seed=1, pairs=True)
    recs = token_records(b, "dchi-text", texts, labels, pairs=second, eta=ETA, seed=2)
    ds = dataset_from_records(recs, None)
    plain = dataset_from_records(token_records(b, "none", texts, labels, pairs=second), None)
    ds.extra["originals"] = plain.arrays
    for max_length in (64, 7):
        idx = np.arange(len(ds))
        priv = collate_dataset(ds, idx, b.special_ids, max_length)
        want = collate_dataset(plain, idx, b.special_ids, max_length)["input_ids"]
        got = collate_originals(ds, idx, b.special_ids, max_length)
        payload = (priv["attention_mask"] == 1) & ~torch.isin(
            priv["input_ids"], torch.tensor(sorted(b.special_ids.values())))
        assert torch.equal(got[payload], want[payload])
        assert (got[~payload] == -100).all()
    ds.extra["originals"] = [a[:-1] for a in plain.arrays]
    with pytest.raises(ValueError, match="original ids for"):
        collate_originals(ds, [0], b.special_ids, 64)


def test_every_lever_through_the_cli_then_retraining_on_records(capsys, tsv, tiny_bert_dir,
                                                                tiny_bert_bundle, tmp_path):
    from models.versions.model_version import load_model
    from models.versions.version_folder import read_config

    out = tmp_path / "m"
    rc, stdout, err = run(capsys, "train", "--data", str(tsv), "--dev", str(tsv),
                          "--mechanism", "dchi-text", "--eta", str(ETA), "--base",
                          str(tiny_bert_dir), "--out", str(out), "--denoise", "0.5",
                          "--rtd", "1", "--distill", "0.5", "--ema", "0.9",
                          *[a if a != "1" else "2" for a in FAST])
    assert rc == 0, err
    assert "recipe: fresh_noise, posterior, denoise, rtd, distill, ema" in stdout
    cfg = read_config(out)
    assert cfg["recipe"]["levers"] == ["fresh_noise", "posterior", "denoise", "rtd", "distill",
                                       "ema"]
    assert cfg["posterior"]["mechanism"] == "dchi-text" and cfg["posterior"]["eta"] == ETA
    assert (out / "posterior.npz").is_file()
    history = json.loads((out / "metrics.json").read_text())["epochs"]
    assert len(history) == 2 and all("train_denoise_loss" in h and "train_distill_loss" in h
                                     and "train_rtd_loss" in h for h in history)
    mv = load_model(out)
    assert mv.module.has_posterior
    # the served forms agree: ONNX export is checked against torch inside export
    rc, _, err = run(capsys, "export-bundle", "--onnx", "--model", str(out))
    assert rc == 0, err

    # device records: only the posterior applies, read from the base version
    texts, _, labels = sentiment_texts(16, seed=9)
    recs = token_records(tiny_bert_bundle, "dchi-text", texts, labels, eta=ETA, seed=9)
    jsonl = tmp_path / "edge.jsonl"
    jsonl.write_text("".join(r.model_dump_json() + "\n" for r in recs))
    rec_out = tmp_path / "r"
    tiny_bert_bundle.save(tmp_path / "bundle")
    bundle = ["--bundle", str(tmp_path / "bundle")]
    rc, stdout, err = run(capsys, "train", "--records", str(jsonl), "--base", str(out),
                          *bundle, "--out", str(rec_out), *FAST)
    assert rc == 0, err
    assert read_config(rec_out)["recipe"]["levers"] == ["posterior"]
    assert (rec_out / "posterior.npz").read_bytes() == (out / "posterior.npz").read_bytes()
    # ... and a lever needing raw text is refused on records, in one line
    rc, _, err = run(capsys, "train", "--records", str(jsonl), "--base", str(out), *bundle,
                     "--out", str(tmp_path / "x"), "--denoise", "0.5", *FAST)
    assert rc == 2 and "need the raw public text" in one_error_line(err)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("case", ["posterior for laplace", "table of another eta",
                                  "records posterior without table", "teacher not none",
                                  "teacher without distill"])
def test_recipe_bad_input_is_one_line_before_training(case, capsys, tsv, tiny_bert_dir,
                                                      tiny_bert_bundle, tiny_encoder_bundle,
                                                      tmp_path):
    from models.training.posterior import build_posterior

    bdir = tmp_path / "bundle"
    tiny_encoder_bundle.save(bdir)
    table = build_posterior(tiny_bert_bundle, "dchi-text", ETA + 1, ["good film"])
    table.save(tmp_path / "other.npz")
    recs = token_records(tiny_bert_bundle, "dchi-text", ["good film"], ["pos"], eta=ETA)
    jsonl = tmp_path / "edge.jsonl"
    jsonl.write_text(recs[0].model_dump_json() + "\n")
    text = ["--data", str(tsv), "--mechanism", "dchi-text", "--eta", str(ETA), "--base",
            str(tiny_bert_dir)]
    argv, expect = {
        "posterior for laplace": (["--data", str(tsv), "--mechanism", "laplace", "--epsilon",
                                   "1", "--bundle", str(bdir), "--posterior"],
                                  "--posterior makes no sense for laplace"),
        "table of another eta": ([*text, "--posterior-table", str(tmp_path / "other.npz")],
                                 "built for eta=5"),
        "records posterior without table": (["--records", str(jsonl), "--base",
                                             str(tiny_bert_dir), "--posterior"],
                                            "needs --posterior-table"),
        "teacher not none": ([*text, "--distill", "0.5", "--teacher", str(tiny_bert_dir)],
                             "not a privbert model folder"),
        "teacher without distill": ([*text, "--teacher", str(tmp_path)],
                                    "--teacher needs --distill ALPHA > 0 or --warm-start"),
    }[case]
    out = tmp_path / "out"
    rc, _, err = run(capsys, "train", *argv, "--out", str(out), *FAST)
    assert rc == 2
    assert expect in one_error_line(err)
    assert not out.exists()


def test_layers_keeps_the_first_transformer_layers(capsys, tsv, tiny_bert_dir,
                                                    tiny_encoder_bundle, tmp_path):
    """--layers N trains, saves and reloads an N-layer model whose layers are the base's
    first N; more layers than the base has, or a vector mechanism, is one line."""
    from safetensors.numpy import load_file

    from models.versions.model_version import load_model
    from models.versions.version_folder import read_config

    out = tmp_path / "m"
    rc, _, err = run(capsys, "train", "--data", str(tsv), "--mechanism", "dchi-text", "--eta",
                     str(ETA), "--base", str(tiny_bert_dir), "--out", str(out), "--layers", "1",
                     "--lr", "1e-9", "--epochs", "1", "--batch-size", "8", "--no-progress")
    assert rc == 0, err
    assert read_config(out)["architecture"]["bert_config"]["num_hidden_layers"] == 1
    mv = load_model(out)
    assert len(mv.module.bert.encoder.layer) == 1
    base = load_file(str(tiny_bert_dir / "model.safetensors"))
    got = mv.module.state_dict()
    key = "encoder.layer.0.attention.self.query.weight"
    # lr 1e-9: the kept layer is still the base's first layer
    assert np.allclose(got["bert." + key].numpy(), base[key], atol=1e-6)
    assert not any(k.startswith("bert.encoder.layer.1.") for k in got)
    bdir = tmp_path / "bundle"
    tiny_encoder_bundle.save(bdir)
    for argv, expect in (
            (["--mechanism", "dchi-text", "--eta", str(ETA), "--base", str(tiny_bert_dir),
              "--layers", "3"], "--layers 3: the base BERT has 2 layers"),
            (["--mechanism", "laplace", "--epsilon", "1", "--bundle", str(bdir), "--layers",
              "1"], "--layers does not apply to laplace")):
        rc, _, err = run(capsys, "train", "--data", str(tsv), *argv, "--out",
                         str(tmp_path / "x"), *FAST)
        assert rc == 2 and expect in one_error_line(err)
        assert not (tmp_path / "x").exists()


def test_replaced_token_detection_targets_the_positions_the_mechanism_changed(tiny_bert_dir):
    """ELECTRA-style loss: with a constant head (logit b) it is the binary cross-entropy of
    σ(b) against the share of payload positions whose id differs from the original; positions
    without an original (−100) do not count."""
    from models.nets.backbone import load_bert
    from models.nets.classifiers import TokenClassifier
    from models.training.objectives import Objective

    clf = TokenClassifier(load_bert(tiny_bert_dir), 2)
    obj = Objective(clf, rtd=1.0)
    torch.nn.init.zeros_(obj.rtd_head.weight)
    torch.nn.init.constant_(obj.rtd_head.bias, 0.3)
    ids = torch.tensor([[101, 7, 8, 9, 102], [101, 5, 6, 102, 0]])
    originals = torch.tensor([[-100, 7, 3, 4, -100], [-100, 5, 6, -100, -100]])
    hidden = torch.randn(2, 5, clf.bert.config.hidden_size)
    got = obj._rtd_loss(hidden, ids, originals)
    r = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.0])  # 2 of the 5 payload positions replaced
    p = torch.sigmoid(torch.tensor(0.3))
    want = -(r * torch.log(p) + (1 - r) * torch.log(1 - p)).mean()
    assert torch.allclose(got, want, atol=1e-6)
