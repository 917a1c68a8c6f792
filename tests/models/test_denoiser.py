"""The contextual denoiser (models.attacks.denoiser): untrained it is the smoothed context-free
posterior, trained on public text it reads context, it is refused for another mechanism, η
or bundle, and it travels whole with its model version."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.attacks.denoiser import Denoiser, candidate_vocabulary, channel_bias, new_denoiser
from models.attacks.denoiser_train import DenoiserConfig, collate, recovery, train_denoiser
from models.training.posterior import build_posterior
from models.versions.manifest import update_manifest

ETA = 4.0  # the tiny table (16-d, N(0, 0.5) rows): about half the tokens change
WORDS = ["the", "a", "movie", "film", "good", "bad", "great", "awful", "is", "was"]


@pytest.fixture(scope="module")
def table(tiny_bert_bundle):
    b = tiny_bert_bundle
    texts = [" ".join([w] * 2 ** i) for i, w in enumerate(WORDS)]
    return build_posterior(b, "dchi-text", ETA, texts, passes=4, min_draws=40,
                           rng=np.random.default_rng(0))


def _batch(bundle, sentences):
    seqs = [np.asarray(bundle.tokenizer.encode(s, add_special_tokens=False).ids)
            for s in sentences]
    return collate(seqs, seqs, bundle.special_ids)


def test_untrained_it_is_the_smoothed_context_free_posterior(tiny_bert_bundle, tiny_bert_dir,
                                                             table):
    """Softmax of the scores at a position = P(x | y) ∝ P(x)·(n_xy + β_x q(y)) / (D_x + β_x)
    over the candidates and y itself, computed here from the table's counts in float64; the
    same y reads the same in any sentence (no context yet)."""
    b = tiny_bert_bundle
    d = new_denoiser(table, b, layers=1, candidates=6, base=tiny_bert_dir)
    vocab = b.tokenizer.get_vocab()
    cand = d.candidates.numpy()
    assert len(cand) == 6 and set(cand) == {vocab[w] for w in WORDS[-6:]}  # most frequent
    batch = _batch(b, ["the good film", "awful was the movie is"])
    with torch.no_grad():
        logits = d.logits(batch["input_ids"], batch["attention_mask"])
        soft = d.soft_embedding(batch["input_ids"], batch["attention_mask"])
    assert logits.shape == (2, 7, 7) and soft.shape == (2, 7, b.dim)
    # the reference, from the counts
    V = b.vocab_size
    n = np.zeros((V, V))
    n[table.pair_x, table.pair_y] = table.pair_n
    D = table.draws.astype(np.float64)
    beta = np.maximum((n == 1).sum(axis=1), 1).astype(np.float64)
    reg = np.zeros(V, bool)
    reg[b.regular_ids] = True
    q = np.where(reg, n.sum(axis=0) + 0.5, 0)
    q /= q.sum()
    prior = np.where(reg, table.prior_counts + 0.5, 0)
    prior /= prior.sum()
    ids = batch["input_ids"].numpy()
    for i, t in ((0, 1), (0, 3), (1, 1), (1, 3)):
        y = ids[i, t]
        support = [x for x in cand if x != y] + [y]
        w = np.array([prior[x] * (n[x, y] + beta[x] * q[y]) / (D[x] + beta[x]) for x in support])
        want = w / w.sum()
        p = torch.softmax(logits[i, t].double(), -1).numpy()
        got = np.array([p[list(cand).index(x)] for x in support[:-1]] + [p[-1]])
        assert np.allclose(got, want, atol=1e-4), (y, got, want)
        assert p[list(cand).index(y)] < 1e-4 if y in cand else True  # y only in the copy slot
        e = b.embeddings
        assert np.allclose(soft[i, t].numpy(), want @ e[support], atol=1e-4)
    # "the" at position 1 and 3 of different sentences: identical scores
    assert ids[0, 1] == ids[1, 3] == vocab["the"]
    assert torch.allclose(logits[0, 1], logits[1, 3], atol=1e-5)
    assert d.is_text(batch["input_ids"]).tolist()[0] == [False, True, True, True, False,
                                                         False, False]
    # the context-free guess from the bias alone is the untrained denoiser's argmax
    text = d.is_text(batch["input_ids"])
    with torch.no_grad():
        assert torch.equal(d.context_free_ids(batch["input_ids"])[text],
                           d.predict_ids(batch["input_ids"], batch["attention_mask"])[text])


def test_trained_on_public_text_it_reads_the_context(tiny_bert_bundle, tiny_bert_dir, table):
    """A corpus where the position decides the word: trained three epochs (each a fresh draw
    of the exact mechanism), the denoiser recovers far more tokens than survive (about half
    at this η) or the context-free argmax recovers; an untrained one recovers no more than
    the context-free argmax (tolerance 0.05 on 500 tokens)."""
    b = tiny_bert_bundle
    texts = ["the movie was good ."] * 240
    cfg = DenoiserConfig(layers=2, candidates=10, epochs=3, lr=1e-2, batch_size=8, seed=0,
                         progress=False)
    dev = texts[:100]
    before = recovery(new_denoiser(table, b, layers=2, candidates=10, base=tiny_bert_dir),
                      table, b, dev, draws=1, rng=np.random.default_rng(5))
    d = train_denoiser(b, table, texts, cfg, base=tiny_bert_dir, rng=np.random.default_rng(1))
    after = recovery(d, table, b, dev, draws=2, rng=np.random.default_rng(5))
    assert after["tokens"] == 500 and len(after["contextual_draws"]) == 2
    assert 0.3 < after["survive"] < 0.7
    assert before["contextual"] < before["context_free"] + 0.05
    assert after["contextual"] > max(after["survive"], after["context_free"]) + 0.2, after
    assert d.meta["training"]["history"][-1]["epoch"] == 3


def test_refused_for_another_mechanism_eta_or_bundle(tiny_bert_bundle, tiny_bert_dir, table):
    b = tiny_bert_bundle
    d = new_denoiser(table, b, layers=1, candidates=8, base=tiny_bert_dir)
    d.check_for("dchi-text", {"eta": ETA}, b.bundle_id)
    for args, msg in ((("dchi-embedding", {"eta": ETA}, b.bundle_id),
                       "trained for dchi-text, not dchi-embedding"),
                      (("dchi-text", {"eta": ETA * 1.001}, b.bundle_id), "trained for eta=4,"),
                      (("dchi-text", {}, b.bundle_id), "trained for eta=4,"),
                      (("dchi-text", {"eta": ETA}, "f" * 64), "trained for bundle")):
        with pytest.raises(ValueError, match=msg) as e:
            d.check_for(*args)
        assert "\n" not in str(e.value)
    emb = build_posterior(b, "dchi-embedding", ETA, ["good film"])
    with pytest.raises(ValueError, match="dchi-text only"):
        channel_bias(emb, candidate_vocabulary(emb.prior_counts, b.regular_ids, 4),
                     b.regular_ids)


def test_file_round_trip_and_refusals(tiny_bert_bundle, tiny_bert_dir, table, tmp_path):
    """Saved through a temporary name (none left behind), read back identical, without the
    bundle's table in the file; anything else is refused in one line."""
    b = tiny_bert_bundle
    d = new_denoiser(table, b, layers=1, candidates=8, base=tiny_bert_dir)
    with torch.no_grad():
        d.out.weight.normal_(0, 0.3)  # not the zero start: the weights must come back
    path = d.save(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["denoiser.safetensors"]
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        assert "bert.embeddings.word_embeddings.weight" not in f.keys()
    back = Denoiser.load(tmp_path, b.embeddings)
    batch = _batch(b, ["the good film was bad"])
    with torch.no_grad():
        assert torch.allclose(back.logits(batch["input_ids"], batch["attention_mask"]),
                              d.eval().logits(batch["input_ids"], batch["attention_mask"]))
    assert back.meta == d.meta
    (tmp_path / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(ValueError, match="not a denoiser file"):
        Denoiser.load(tmp_path / "junk.safetensors", b.embeddings)
    with pytest.raises(ValueError, match="no such denoiser file"):
        Denoiser.load(tmp_path / "missing.safetensors", b.embeddings)
    with pytest.raises(ValueError, match="does not match the table"):
        Denoiser.load(path, b.embeddings[:, :8])


def test_a_model_version_carries_its_denoiser(tiny_bert_bundle, tiny_bert_dir, table,
                                              tmp_path):
    """The classifier's weights hold no denoiser; the version has denoiser.safetensors beside
    them and loads to the same predictions; without that file, or with one for another η,
    it refuses to load."""
    from models.nets.backbone import load_bert
    from models.nets.classifiers import build_classifier
    from models.versions.model_version import load_model, save_model_version
    from models.versions.version_folder import WEIGHTS_FILE

    b = tiny_bert_bundle
    d = new_denoiser(table, b, layers=1, candidates=8, base=tiny_bert_dir)
    model = build_classifier("dchi-text", 2, bert=load_bert(tiny_bert_dir), denoiser=d)
    with pytest.raises(ValueError, match="cannot read dchi-embedding"):
        build_classifier("dchi-embedding", 2, bert=load_bert(tiny_bert_dir), denoiser=d)
    model.train()
    assert not model.denoiser.training  # frozen in eval mode inside the classifier
    assert not any(p.requires_grad for n, p in model.named_parameters()
                   if n.startswith("denoiser."))
    cfg = {"kind": "tokens", "mechanism": "dchi-text", "params": {"eta": ETA},
           "bundle_id": b.bundle_id, "special_ids": b.special_ids, "labels": ["neg", "pos"],
           "max_length": 32}
    out = save_model_version(tmp_path / "v1", model, cfg, {}, {})
    from safetensors import safe_open

    with safe_open(str(out / WEIGHTS_FILE), "pt") as f:
        assert not [k for k in f.keys() if k.startswith("denoiser.")]
    batch = _batch(b, ["the good film", "bad"])
    feed = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
            "token_type_ids": torch.zeros_like(batch["input_ids"])}
    mv = load_model(out)
    with torch.no_grad():
        assert torch.allclose(mv.module(**feed), model.eval()(**feed), atol=1e-6)
    assert mv.config["architecture"]["denoiser"]["eta"] == ETA
    # another η's denoiser in its place
    other = build_posterior(b, "dchi-text", ETA * 2, ["good film"], rng=np.random.default_rng(2))
    new_denoiser(other, b, layers=1, candidates=8, base=tiny_bert_dir).save(out)
    with pytest.raises(ValueError, match="denoiser.safetensors does not match its SHA-256"):
        load_model(out)  # the sealed manifest sees the swap first (issue 42)
    update_manifest(out, ["denoiser.safetensors"])  # resealed: the config's eta still refuses it
    with pytest.raises(ValueError, match="trained for eta=8"):
        load_model(out)
    (out / "denoiser.safetensors").unlink()
    update_manifest(out, ["denoiser.safetensors"])
    with pytest.raises(ValueError, match="no denoiser.safetensors: it is incomplete"):
        load_model(out)
