"""Privacy-adaptive pretraining (models/pretraining/mlm.py, models/pretraining/pretrain_data.py, models/pretraining/pretrain.py,
models/cli/pretrain.py) on a tiny randomly initialised BERT built here (seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from models.pretraining.mlm import (
    REPLACE_KEEP,
    REPLACE_MASK,
    REPLACE_RANDOM,
    choose_masked_positions,
    choose_replacements,
    empirical_distribution,
    mlm_loss,
    predictions_per_sequence,
)
from models.pretraining.pretrain import (
    INFO_FILE,
    PretrainConfig,
    Trainer,
    batch_to_device,
    build_model,
    compose_inputs_embeds,
    list_checkpoints,
    pretrain,
)
from models.pretraining.pretrain_data import (
    BatchPrivatizer,
    build_batch,
    read_corpus,
    tokenize_corpus,
)
from shared.bundle import EdgeBundle
from shared.mechanisms import DChiEmbedding, DChiText
from tests.conftest import TINY_WORDS

OBJECTIVES = ["vanilla", "prob", "denoising"]
MECHS = ["dchi-text", "dchi-embedding"]
SENTENCES = [
    "the movie is very good", "a film was not fun", "this plot is awful and dull",
    "it was a great story , and the actor was funny !", "i love this film", "boring , boring plot",
    "the actor is not bad but the story is dull .", "a very very great movie", "hate it",
    "this was fun", "the plot was great but the film was awful", "a good actor , a bad movie",
]


def make_bert(path: Path, dim: int = 16, dropout: float = 0.1, seed: int = 0) -> Path:
    """A complete tiny HF BERT folder (all weights) over tests/conftest.py's vocabulary."""
    import json as _json

    from transformers import BertConfig, BertModel

    vocab = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *TINY_WORDS]
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (path / "tokenizer_config.json").write_text(_json.dumps({"do_lower_case": True}))
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=dim, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=2 * dim, max_position_embeddings=64,
                     hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    model = BertModel(cfg)
    with torch.no_grad():  # spread the table: distinct tokens, a useful nearest-token step
        model.embeddings.word_embeddings.weight.normal_(0.0, 0.5)
    model.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return make_bert(tmp_path_factory.mktemp("pt-bert"))


@pytest.fixture(scope="module")
def bundle(base) -> EdgeBundle:
    return EdgeBundle.from_model(base)


@pytest.fixture(scope="module")
def seqs(bundle):
    return tokenize_corpus(bundle, SENTENCES, max_length=32)


def special_set(bundle) -> set[int]:
    return set(bundle.special_ids.values())


# -- the head and the frozen table ----------------------------------------------------------
def test_decoder_is_the_frozen_word_embedding_parameter(base):
    from models.nets.backbone import load_bert

    model = build_model(load_bert(base))
    emb = model.bert.embeddings.word_embeddings.weight
    assert model.head.decoder.weight is emb
    assert not emb.requires_grad
    trainer = Trainer(model, PretrainConfig("denoising", "dchi-text", 10.0, steps=5), 5,
                      torch.device("cpu"), None)
    in_optimizer = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert id(emb) not in in_optimizer
    assert id(model.head.bias) in in_optimizer and model.head.bias.requires_grad
    assert "decoder.weight" not in model.head.trainable_state_dict()


# -- masking --------------------------------------------------------------------------------
def test_prediction_count_follows_bert():
    got = predictions_per_sequence(np.array([0, 1, 3, 7, 10, 100, 126, 200]), 0.15, 20)
    assert got.tolist() == [0, 1, 1, 1, 2, 15, 19, 20]  # max(1, round(0.15 L)), at most 20


def test_masks_only_content_at_the_rate_and_at_most_max_predictions():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 200, 300)
    width = int(lengths.max()) + 2
    col = np.arange(width)[None, :]
    candidates = (col >= 1) & (col <= lengths[:, None])
    masked = choose_masked_positions(candidates, 0.15, 20, rng)
    assert not (masked & ~candidates).any()  # never [CLS]/[SEP]/[PAD]
    counts = masked.sum(axis=1)
    assert (counts == predictions_per_sequence(lengths, 0.15, 20)).all()
    assert counts.max() == 20
    # between the floor of 1 and the cap of 20 the rate is 0.15 up to rounding (± 0.5 token)
    short = (lengths >= 4) & (lengths < 130)
    assert np.all(np.abs(counts[short] - 0.15 * lengths[short]) <= 0.5 + 1e-9)


def test_masked_positions_are_uniform_over_content():
    # 20,000 rows of 10 candidates, 2 picks each: each column is picked 4,000 times on
    # average (sd ~57); a tolerance of 5 sd fails a biased sampler.
    rng = np.random.default_rng(1)
    masked = choose_masked_positions(np.ones((20_000, 10), dtype=bool), 0.2, 20, rng)
    assert np.abs(masked.sum(axis=0) - 4000).max() < 5 * 57


def test_replacements_are_80_10_10():
    r = choose_replacements(100_000, np.random.default_rng(2))
    frac = [np.mean(r == k) for k in (REPLACE_MASK, REPLACE_KEEP, REPLACE_RANDOM)]
    # binomial sd at n=1e5 is <= 0.0013; tolerance 0.006 (> 4.5 sd)
    assert frac == pytest.approx([0.8, 0.1, 0.1], abs=0.006)


@pytest.mark.parametrize("mechanism", MECHS)
def test_batch_masks_never_touch_special_tokens(bundle, seqs, mechanism):
    priv = BatchPrivatizer(bundle, mechanism, 20.0)
    sp = special_set(bundle)
    assert any((x == bundle.special_ids["unk"]).any() for x in seqs)  # "i" is not in the vocab
    for s in range(20):
        batch = build_batch(seqs, priv, "denoising", np.random.default_rng(s))
        flat = _original_grid(bundle, seqs).ravel()
        assert not np.isin(flat[batch.masked_pos], list(sp)).any()
        per_row = np.bincount(batch.masked_pos // batch.shape[1], minlength=len(seqs))
        maskable = [int((x != bundle.special_ids["unk"]).sum()) for x in seqs]
        expected = predictions_per_sequence(np.array(maskable), 0.15, 20)
        assert (per_row == expected).all()
        # [CLS], [SEP] and [PAD] are unchanged in the model's input ids
        keep = np.isin(flat, [bundle.special_ids[k] for k in ("cls", "sep", "pad")])
        assert (batch.input_ids.ravel()[keep] == flat[keep]).all()


def _content_positions(seqs) -> np.ndarray:
    """Flat positions of the content tokens in the padded (B, L) grid, in order."""
    width = max(len(s) for s in seqs) + 2
    return np.concatenate([i * width + 1 + np.arange(len(s)) for i, s in enumerate(seqs)])


def _original_grid(bundle, seqs) -> np.ndarray:
    sp = bundle.special_ids
    width = max(len(s) for s in seqs) + 2
    grid = np.full((len(seqs), width), sp["pad"], dtype=np.int64)
    for i, s in enumerate(seqs):
        grid[i, 0], grid[i, 1 : len(s) + 1], grid[i, len(s) + 1] = sp["cls"], s, sp["sep"]
    return grid


# -- privatization is the shared mechanism --------------------------------------------------
def test_on_the_fly_dchi_text_equals_shared_privatize_ids(bundle, seqs):
    priv = BatchPrivatizer(bundle, "dchi-text", 15.0)
    batch = build_batch(seqs, priv, "vanilla", np.random.default_rng(7))
    content = np.concatenate(seqs).astype(np.int64)
    expected = DChiText(bundle, 15.0).privatize_ids(content, np.random.default_rng(7))
    content_pos = _content_positions(seqs)
    assert content_pos.size == content.size
    unmasked = ~np.isin(content_pos, batch.masked_pos)
    assert unmasked.sum() > 10
    np.testing.assert_array_equal(batch.input_ids.ravel()[content_pos[unmasked]], expected[unmasked])
    assert not np.array_equal(expected, content)  # eta=15 on this table does change tokens
    # Vanilla target = the privatized token at each masked position
    masked_slot = np.searchsorted(content_pos, batch.masked_pos)
    np.testing.assert_array_equal(batch.targets, expected[masked_slot])


@pytest.mark.parametrize("eta", [3.0, 15.0, 60.0])
def test_torch_search_privatizes_exactly_like_shared(bundle, seqs, eta):
    content = np.concatenate(seqs).astype(np.int64)
    ids = np.tile(content, 20)
    expected = DChiText(bundle, eta).privatize_ids(ids, np.random.default_rng(9))
    got = BatchPrivatizer(bundle, "dchi-text", eta, search="torch").privatize_ids(
        ids, np.random.default_rng(9))
    np.testing.assert_array_equal(got, expected)
    batch_np = build_batch(seqs, BatchPrivatizer(bundle, "dchi-embedding", eta), "vanilla",
                           np.random.default_rng(2))
    batch_t = build_batch(seqs, BatchPrivatizer(bundle, "dchi-embedding", eta, search="torch"),
                          "vanilla", np.random.default_rng(2))
    np.testing.assert_array_equal(batch_t.targets, batch_np.targets)


def test_torch_search_hands_ties_to_the_shared_index():
    from models.nets.torch_nearest import TorchExactNearest
    from shared.mechanisms.nearest import ExactNearest, brute_force_nearest

    rng = np.random.default_rng(0)
    table = rng.normal(size=(50, 8)).astype(np.float32)
    table[7] = table[3]  # exact duplicate: a tie broken towards the lower row, in float64
    queries = np.concatenate([table[[3, 7, 3]] + 1e-9, rng.normal(size=(200, 8))])
    index = ExactNearest(table)
    fast = TorchExactNearest(index, "cpu", chunk=64)
    got = fast.search(queries)
    assert fast.last_delegated >= 3
    np.testing.assert_array_equal(got, index.search(queries))
    np.testing.assert_array_equal(got, brute_force_nearest(table, queries))


def test_on_the_fly_dchi_embedding_equals_shared_privatize(bundle, seqs):
    priv = BatchPrivatizer(bundle, "dchi-embedding", 15.0)
    batch = build_batch(seqs, priv, "vanilla", np.random.default_rng(3))
    content = np.concatenate(seqs).astype(np.int64)
    expected = DChiEmbedding(15.0).privatize(bundle.embeddings[content], np.random.default_rng(3))
    content_pos = _content_positions(seqs)
    slot = {p: i for i, p in enumerate(content_pos)}
    masked = dict(zip(batch.masked_pos.tolist(), batch.replacement.tolist(), strict=True))
    rows = dict(zip(batch.embed_pos.tolist(), batch.embeds, strict=True))
    for p in content_pos:
        if p not in masked or masked[p] == REPLACE_KEEP:
            np.testing.assert_array_equal(rows[p], expected[slot[p]])
        elif masked[p] == REPLACE_MASK:
            assert p not in rows and batch.input_ids.ravel()[p] == bundle.special_ids["mask"]
        else:  # a random token, perturbed: not the original's row
            assert not np.array_equal(rows[p], expected[slot[p]])
    # Vanilla target = nearest regular token of the perturbed embedding
    near = DChiText(bundle, 15.0).index.search(expected[[slot[p] for p in batch.masked_pos]])
    np.testing.assert_array_equal(batch.targets, near)


def test_compose_inputs_embeds_uses_frozen_rows_for_special_and_mask(bundle, seqs, base):
    from models.nets.backbone import load_bert

    bert = load_bert(base)
    priv = BatchPrivatizer(bundle, "dchi-embedding", 15.0)
    batch = build_batch(seqs, priv, "denoising", np.random.default_rng(4))
    t = batch_to_device(batch, torch.device("cpu"))
    x = compose_inputs_embeds(bert.embeddings.word_embeddings, t["input_ids"], t["embeds"],
                              t["embed_pos"]).reshape(-1, bundle.dim).numpy()
    np.testing.assert_array_equal(x[batch.embed_pos], batch.embeds)
    other = np.setdiff1d(np.arange(x.shape[0]), batch.embed_pos)
    np.testing.assert_array_equal(x[other], bundle.embeddings[batch.input_ids.ravel()[other]])
    assert (batch.input_ids.ravel()[other] != bundle.special_ids["mask"]).sum() > 0
    assert (batch.input_ids.ravel()[other] == bundle.special_ids["mask"]).sum() > 0


# -- targets --------------------------------------------------------------------------------
@pytest.mark.parametrize("mechanism", MECHS)
def test_vanilla_and_prob_targets_are_regular_tokens(bundle, seqs, mechanism):
    priv = BatchPrivatizer(bundle, mechanism, 5.0)
    regular = set(bundle.regular_ids.tolist())
    for objective in ("vanilla", "prob"):
        batch = build_batch(seqs, priv, objective, np.random.default_rng(5), prob_k=10)
        assert set(batch.targets.ravel().tolist()) <= regular


@pytest.mark.parametrize("mechanism", MECHS)
def test_denoising_targets_are_the_original_tokens(bundle, seqs, mechanism):
    priv = BatchPrivatizer(bundle, mechanism, 5.0)
    batch = build_batch(seqs, priv, "denoising", np.random.default_rng(6))
    np.testing.assert_array_equal(batch.targets, _original_grid(bundle, seqs).ravel()[batch.masked_pos])


def test_prob_targets_are_k_privatizations_and_a_frequency_distribution(bundle, seqs):
    priv = BatchPrivatizer(bundle, "dchi-text", 8.0)
    batch = build_batch(seqs, priv, "prob", np.random.default_rng(8), prob_k=10)
    assert batch.targets.shape == (batch.masked_pos.size, 10)
    dist = empirical_distribution(batch.targets, bundle.vocab_size)
    np.testing.assert_allclose(dist.sum(axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(dist * 10, np.round(dist * 10), atol=1e-5)  # counts / K
    assert (dist > 0).sum(axis=1).max() > 1  # eta=8 spreads the K samples over tokens
    # the K samples of position i are DChiText draws of its original token: at a huge eta
    # they all equal it
    big = build_batch(seqs, BatchPrivatizer(bundle, "dchi-text", 1e6), "prob",
                      np.random.default_rng(8), prob_k=10)
    assert (big.targets == big.original[:, None]).all()


def test_prob_loss_equals_the_soft_cross_entropy_of_eq6():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 30, generator=g)
    samples = torch.randint(0, 30, (7, 10), generator=g)
    dist = torch.from_numpy(empirical_distribution(samples.numpy(), 30))
    dense = -(dist * torch.log_softmax(logits, -1)).sum(-1).mean()
    torch.testing.assert_close(mlm_loss(logits, samples), dense)
    # one-hot targets: ordinary cross-entropy
    hard = samples[:, 0]
    torch.testing.assert_close(mlm_loss(logits, hard), torch.nn.functional.cross_entropy(logits, hard))


# -- learning -------------------------------------------------------------------------------
@pytest.mark.parametrize("mechanism", MECHS)
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_each_objective_lowers_its_loss_on_a_fixed_batch(base, bundle, seqs, objective, mechanism):
    from models.nets.backbone import load_bert

    torch.manual_seed(0)
    model = build_model(load_bert(base))
    before = model.bert.embeddings.word_embeddings.weight.detach().clone()
    batch = build_batch(seqs, BatchPrivatizer(bundle, mechanism, 20.0), objective,
                        np.random.default_rng(0), mask_rate=0.3)
    tensors = batch_to_device(batch, torch.device("cpu"))
    cfg = PretrainConfig(objective, mechanism, 20.0, steps=40, lr=3e-3, warmup_ratio=0.0)
    trainer = Trainer(model, cfg, 40, torch.device("cpu"), None)
    model.eval()  # dropout off to measure
    with torch.no_grad():
        first = float(model(**tensors))
    for _ in range(40):
        trainer.step(tensors)
    model.eval()
    with torch.no_grad():
        last = float(model(**tensors))
    # a fixed batch is memorised: at least a halving over 40 steps (typical: 3.6 -> < 0.5)
    assert last < 0.5 * first, (first, last)
    assert torch.equal(model.bert.embeddings.word_embeddings.weight, before)


def test_head_warmup_trains_only_the_head_first(base, bundle, seqs):
    from models.nets.backbone import load_bert

    model = build_model(load_bert(base))
    encoder0 = {k: v.clone() for k, v in model.bert.state_dict().items()}
    bias0 = model.head.bias.detach().clone()
    batch = batch_to_device(build_batch(seqs, BatchPrivatizer(bundle, "dchi-text", 20.0),
                                        "denoising", np.random.default_rng(0)), torch.device("cpu"))
    cfg = PretrainConfig("denoising", "dchi-text", 20.0, steps=5, lr=1e-3, warmup_ratio=0.0,
                         head_warmup_steps=3)
    trainer = Trainer(model, cfg, 5, torch.device("cpu"), None)
    for _ in range(3):
        trainer.step(batch)
    assert all(torch.equal(v, encoder0[k]) for k, v in model.bert.state_dict().items())
    assert not torch.equal(model.head.bias, bias0)
    trainer.step(batch)
    changed = [k for k, v in model.bert.state_dict().items() if not torch.equal(v, encoder0[k])]
    assert any("encoder.layer" in k for k in changed)
    assert "embeddings.word_embeddings.weight" not in changed


# -- the whole run: frozen table, output folder, resume -------------------------------------
def run_pretrain(base, out, steps=6, **kw):
    opts = {"objective": "denoising", "mechanism": "dchi-text", "eta": 8.0, "batch_size": 4,
            "max_length": 32, "seed": 11, "progress": False} | kw
    return pretrain(base, out, corpus_texts=SENTENCES, steps=steps, **opts)


@pytest.mark.parametrize("mechanism", MECHS)
def test_pretrain_keeps_the_word_embeddings_bit_identical(base, bundle, tmp_path, mechanism):
    from models.nets.backbone import check_same_bundle, load_bert

    out = run_pretrain(base, tmp_path / "out", mechanism=mechanism, objective="prob")
    bert = load_bert(out)
    check_same_bundle(bert, bundle)  # raises unless bit-identical
    assert EdgeBundle.from_model(out).bundle_id == bundle.bundle_id
    before = load_bert(base).state_dict()
    changed = [k for k, v in bert.state_dict().items() if not torch.equal(v, before[k])]
    assert "embeddings.word_embeddings.weight" not in changed
    assert any("encoder.layer" in k for k in changed)  # the encoder did train
    info = json.loads((out / INFO_FILE).read_text())
    assert info["objective"] == "prob" and info["mechanism"] == mechanism
    assert info["eta"] == 8.0 and info["bundle_id"] == bundle.bundle_id and info["steps"] == 6
    assert info["tokens_seen"] > 0 and info["loss_curve"][-1][0] == 6
    assert info["guarantee"]["worst_case"]["eta"] == 8.0


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors")) | {
        "head." + k: v for k, v in load_file(str(folder / "mlm_head.safetensors")).items()}


@pytest.mark.parametrize("objective", ["vanilla", "prob"])
def test_resume_gives_the_same_parameters_as_an_uninterrupted_run(base, tmp_path, monkeypatch,
                                                                   objective):
    import models.pretraining.pretrain as mp

    full = run_pretrain(base, tmp_path / "full", steps=6, save_every=3, objective=objective)

    real_save = mp.save_checkpoint

    def save_then_crash(out_dir, step, *a, **k):
        path = real_save(out_dir, step, *a, **k)
        if step == 3:
            raise KeyboardInterrupt  # the session ends right after the first checkpoint
        return path

    monkeypatch.setattr(mp, "save_checkpoint", save_then_crash)
    with pytest.raises(KeyboardInterrupt):
        run_pretrain(base, tmp_path / "cut", steps=6, save_every=3, objective=objective)
    monkeypatch.setattr(mp, "save_checkpoint", real_save)
    assert [p.name for p in list_checkpoints(tmp_path / "cut")] == ["step-00000003"]
    resumed = run_pretrain(base, tmp_path / "cut", steps=6, save_every=3, objective=objective,
                           resume=True, seed=None)
    a, b = _weights(full), _weights(resumed)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ia, ib = (json.loads((d / INFO_FILE).read_text()) for d in (full, resumed))
    assert ia["loss_curve"] == ib["loss_curve"] and ia["tokens_seen"] == ib["tokens_seen"]
    # and without resuming, the same seed on a different cut point is not the same run
    other = run_pretrain(base, tmp_path / "other", steps=6, seed=12, objective=objective)
    assert not torch.equal(_weights(other)["head.bias"], a["head.bias"])


def test_refuses_to_overwrite_a_run_or_resume_a_different_one(base, tmp_path):
    out = run_pretrain(base, tmp_path / "r", steps=2)
    with pytest.raises(ValueError, match="already holds"):
        run_pretrain(base, out, steps=2)
    with pytest.raises(ValueError, match="eta"):
        run_pretrain(base, out, steps=2, resume=True, eta=11.0)
    with pytest.raises(ValueError, match="no checkpoint"):
        run_pretrain(base, tmp_path / "empty", steps=2, resume=True)


# -- the command line -----------------------------------------------------------------------
def cli(args: list[str]) -> int:
    from cloud_api.cli import main

    try:
        return main(["pretrain", *args])
    except SystemExit as exc:
        return int(exc.code)


@pytest.fixture
def corpus_file(tmp_path) -> Path:
    p = tmp_path / "corpus.txt"
    p.write_text("\n".join(SENTENCES) + "\n")
    return p


def test_cli_pretrains_and_writes_a_base_folder(base, bundle, corpus_file, tmp_path, capsys):
    from models.nets.backbone import load_bert

    out = tmp_path / "cli-out"
    rc = cli(["--objective", "vanilla", "--mechanism", "dchi-embedding", "--eta", "8",
              "--base", str(base), "--corpus", str(corpus_file), "--out", str(out),
              "--steps", "3", "--batch-size", "4", "--max-length", "32", "--seed", "1",
              "--save-every", "2"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "warning: --seed" in err and "holds" in err
    assert load_bert(out).config.hidden_size == bundle.dim
    assert [p.name for p in list_checkpoints(out)] == ["step-00000002", "step-00000003"]
    assert json.loads((out / INFO_FILE).read_text())["objective"] == "vanilla"


def _small_bundle_dir(tmp_path) -> Path:
    other = make_bert(tmp_path / "dim8", dim=8)
    return EdgeBundle.from_model(other).save(tmp_path / "bundle8")


@pytest.mark.parametrize(("args", "message"), [
    (["--objective", "electra"], "unknown objective"),
    (["--mechanism", "laplace"], "unknown mechanism"),
    (["--eta", "0"], "--eta must be a positive"),
    (["--eta", "-3"], "--eta must be a positive"),
    (["--eta", "abc"], "invalid float value"),
    (["--corpus", "MISSING"], "not found"),
    (["--corpus", "EMPTY"], "empty"),
    (["--bundle", "BUNDLE8"], "do not match the bundle"),
    (["--base", "NOTBERT"], "config.json"),
    (["--steps", "0"], "--steps must be at least 1"),
    (["--eta", "1e6"], "weaker than the privacy floor"),
    (["--mechanism", "dchi-embedding", "--eta", "1e6"], "--allow-weak-privacy pretrains"),
    (["--eta", "1e-40"], "too small to compute"),
])
def test_cli_bad_input_is_one_line_before_training(base, corpus_file, tmp_path, capsys, args,
                                                   message):
    (tmp_path / "empty.txt").write_text("\n  \n\n")
    subst = {"MISSING": str(tmp_path / "nope.txt"), "EMPTY": str(tmp_path / "empty.txt"),
             "NOTBERT": str(tmp_path)}
    if "BUNDLE8" in args:
        subst["BUNDLE8"] = str(_small_bundle_dir(tmp_path))
    args = [subst.get(a, a) for a in args]
    full = {"--objective": "denoising", "--mechanism": "dchi-text", "--eta": "8",
            "--base": str(base), "--corpus": str(corpus_file), "--steps": "2"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        full[flag] = value
    argv = [x for kv in full.items() for x in kv] + ["--out", str(tmp_path / "o"),
                                                     "--batch-size", "4", "--no-progress"]
    capsys.readouterr()
    rc = cli(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("cloud-api: error: ") and message in err[0], err
    assert not (tmp_path / "o").exists()  # nothing trained, nothing written


def test_cli_allow_weak_privacy_pretrains_and_records_why(base, corpus_file, tmp_path,
                                                          capsys):
    """η = 1e6 keeps every token on the tiny table: refused above (exit 2), pretrained with
    --allow-weak-privacy, which the output's pretrain.json and stderr say."""
    out = tmp_path / "weak"
    rc = cli(["--objective", "vanilla", "--mechanism", "dchi-text", "--eta", "1e6",
              "--base", str(base), "--corpus", str(corpus_file), "--out", str(out),
              "--steps", "1", "--batch-size", "4", "--max-length", "32", "--no-progress",
              "--allow-weak-privacy"])
    err = capsys.readouterr().err
    assert rc == 0, err
    info = json.loads((out / "pretrain.json").read_text())
    assert "weaker than the privacy floor" in info["weak_privacy"]
    assert "weak privacy (--allow-weak-privacy)" in err
    normal = run_pretrain(base, tmp_path / "normal", steps=1)
    assert "weak_privacy" not in json.loads((normal / "pretrain.json").read_text())


def test_read_corpus_takes_the_first_tsv_column(tmp_path):
    tsv = tmp_path / "t.tsv"
    tsv.write_text("sentence\tlabel\ngood film \t1\n\t0\nbad plot\t0\n")
    txt = tmp_path / "t.txt"
    txt.write_text("one doc\n\nanother doc\n")
    assert read_corpus([tsv, txt]) == ["good film", "bad plot", "one doc", "another doc"]


def test_a_base_with_its_own_mlm_head_starts_from_it(base, bundle, tmp_path):
    """bert-base-uncased style folders carry cls.predictions.*; a privbert pretraining output
    carries mlm_head.safetensors: continued pretraining starts from that head, not a new one."""
    from transformers import BertForMaskedLM

    from models.nets.backbone import load_bert
    from models.pretraining.pretrain import load_base_head

    hf = BertForMaskedLM.from_pretrained(str(base))  # head missing in `base`: random
    with torch.no_grad():
        hf.bert.embeddings.word_embeddings.weight.copy_(load_bert(base).embeddings
                                                        .word_embeddings.weight)
        hf.cls.predictions.transform.dense.weight.normal_(0, 1)
        hf.cls.predictions.bias.uniform_(-1, 1)
    hf.save_pretrained(str(tmp_path / "hf"))
    model = build_model(load_bert(tmp_path / "hf"))
    assert load_base_head(model.head, tmp_path / "hf").endswith("(cls.predictions)")
    torch.testing.assert_close(model.head.dense.weight, hf.cls.predictions.transform.dense.weight)
    torch.testing.assert_close(model.head.bias, hf.cls.predictions.bias)
    assert model.head.decoder.weight is model.bert.embeddings.word_embeddings.weight  # still tied
    # a plain BertModel folder has no head: the fresh one stays
    fresh = build_model(load_bert(base))
    before = {k: v.clone() for k, v in fresh.head.trainable_state_dict().items()}
    assert load_base_head(fresh.head, base) is None
    assert all(torch.equal(before[k], v) for k, v in fresh.head.trainable_state_dict().items())
    # our own output: the next run starts from the head it trained
    out = run_pretrain(base, tmp_path / "first", objective="denoising")
    again = build_model(load_bert(out))
    assert load_base_head(again.head, out) == str(out / "mlm_head.safetensors")
    from safetensors.torch import load_file

    saved = load_file(str(out / "mlm_head.safetensors"))
    assert torch.equal(again.head.dense.weight, saved["dense.weight"])
    assert json.loads((out / INFO_FILE).read_text())["head"] == "new (BERT initialisation)"


def test_corpus_text_that_spells_special_tokens_is_plain_text(bundle):
    """A public corpus line containing "[MASK]" or "[CLS]" must not inject special ids
    (they are never privatized and would reach the model as real special tokens)."""
    seqs = tokenize_corpus(bundle, ["the [MASK] is [CLS] good [SEP]"], max_length=32)
    injected = {bundle.special_ids[k] for k in ("mask", "cls", "sep", "pad")}
    ids = set(np.concatenate(seqs).tolist())
    assert seqs and not injected & ids  # ([UNK] may appear: the tiny vocabulary has no "[")
    # the bundle's own tokenizer does parse them: what tokenize_corpus must not use as is
    raw = bundle.tokenizer.encode("[MASK] [CLS]", add_special_tokens=False).ids
    assert raw == [bundle.special_ids["mask"], bundle.special_ids["cls"]]
