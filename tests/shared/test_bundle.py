"""EdgeBundle: reading a BERT folder without torch, ids, hashing, corruption errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from shared.bundle import BundleError, EdgeBundle
from tests.conftest import REPO, make_tiny_bert_dir


def test_default_minilm_bundle(minilm_bundle):
    b = minilm_bundle
    assert (b.vocab_size, b.dim) == (30522, 384)
    assert b.special_ids == {"pad": 0, "unk": 100, "cls": 101, "sep": 102, "mask": 103}
    vocab = b.tokenizer.get_vocab()
    inv = {i: t for t, i in vocab.items()}
    regular_tokens = {inv[i] for i in b.regular_ids}
    assert not any(t.startswith("[unused") for t in regular_tokens)
    assert not regular_tokens & {"[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"}
    assert b.regular_ids.size == 30522 - 5 - 994
    assert len(b.bundle_id) == 64


def test_tokenizer_neither_pads_nor_truncates(minilm_bundle):
    enc = minilm_bundle.tokenizer.encode("hello " * 300, add_special_tokens=False)
    assert len(enc.ids) == 300
    short = minilm_bundle.tokenizer.encode("hello", add_special_tokens=False)
    assert short.ids == [minilm_bundle.tokenizer.token_to_id("hello")]


def test_save_load_round_trip_and_tarball(tiny_bundle, tmp_path):
    tiny_bundle.save(tmp_path / "b")
    loaded = EdgeBundle.load(tmp_path / "b")
    assert loaded.bundle_id == tiny_bundle.bundle_id
    np.testing.assert_array_equal(loaded.embeddings, tiny_bundle.embeddings)
    np.testing.assert_array_equal(loaded.regular_ids, tiny_bundle.regular_ids)
    from_tar = EdgeBundle.from_tar_bytes(tiny_bundle.to_tar_bytes(), expected_id=tiny_bundle.bundle_id)
    assert from_tar.bundle_id == tiny_bundle.bundle_id


def test_bundle_id_is_a_content_hash(tiny_model_dir, tmp_path):
    a = EdgeBundle.from_model(tiny_model_dir)
    assert EdgeBundle.from_model(tiny_model_dir).bundle_id == a.bundle_id
    other = EdgeBundle.from_model(make_tiny_bert_dir(tmp_path / "o", seed=1))
    assert other.bundle_id != a.bundle_id
    with_enc = a.with_encoder(b"onnx-bytes", {"pooling": "mean", "output_dim": 16})
    assert with_enc.bundle_id != a.bundle_id
    assert with_enc.with_encoder(b"onnx-bytes", {"pooling": "mean", "output_dim": 16}).bundle_id \
        == with_enc.bundle_id


@pytest.mark.parametrize("victim", ["embeddings.npy", "tokenizer.json", "encoder.onnx"])
def test_corrupted_file_is_named(tiny_bundle, tmp_path, victim):
    b = tiny_bundle.with_encoder(b"onnx-bytes", {"pooling": "mean"})
    d = b.save(tmp_path / "b")
    data = bytearray((d / victim).read_bytes())
    data[-1] ^= 1
    (d / victim).write_bytes(bytes(data))
    with pytest.raises(BundleError, match=victim):
        EdgeBundle.load(d)


@pytest.mark.parametrize("victim", ["embeddings.npy", "bundle.json", "encoder.onnx"])
def test_missing_file_is_named(tiny_bundle, tmp_path, victim):
    d = tiny_bundle.with_encoder(b"x", {"pooling": "mean"}).save(tmp_path / "b")
    (d / victim).unlink()
    with pytest.raises(BundleError, match=f"{victim}: missing"):
        EdgeBundle.load(d)


def test_tampered_metadata_and_expected_id(tiny_bundle, tmp_path):
    d = tiny_bundle.save(tmp_path / "b")
    meta = json.loads((d / "bundle.json").read_text())
    meta["unused_ids"] = []  # would make [unused] tokens privatization targets
    (d / "bundle.json").write_text(json.dumps(meta))
    with pytest.raises(BundleError, match="bundle_id does not match"):
        EdgeBundle.load(d)
    d2 = tiny_bundle.save(tmp_path / "c")
    with pytest.raises(BundleError, match="not the expected"):
        EdgeBundle.load(d2, expected_id="0" * 64)
    with pytest.raises(BundleError, match="not a tar"):
        EdgeBundle.from_tar_bytes(b"garbage")


@pytest.mark.parametrize(("content", "needle"), [
    (b"[1, 2]", "not a JSON object"),
    (b"\xff\xfe", "not valid JSON"),
    (None, "lacks its files, vocab_size or dim"),
])
def test_malformed_metadata_is_a_bundle_error(tiny_bundle, tmp_path, content, needle):
    d = tiny_bundle.save(tmp_path / "b")
    if content is None:
        meta = json.loads((d / "bundle.json").read_text())
        del meta["vocab_size"]
        content = json.dumps(meta).encode()
    (d / "bundle.json").write_bytes(content)
    with pytest.raises(BundleError, match=needle) as err:
        EdgeBundle.load(d)
    assert "bundle.json" in str(err.value)


def test_save_atomically_replaces_and_cleans_up(tiny_bundle, tiny_model_dir, tmp_path,
                                                monkeypatch):
    from shared.bundle import save_atomically

    target = tmp_path / "cache" / "b"
    save_atomically(tiny_bundle, target)
    save_atomically(tiny_bundle, target)  # over an existing copy
    assert EdgeBundle.load(target).bundle_id == tiny_bundle.bundle_id
    assert sorted(p.name for p in target.parent.iterdir()) == ["b"]

    def broken_save(self, directory):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(EdgeBundle, "save", broken_save)
    with pytest.raises(OSError, match="No space"):
        save_atomically(tiny_bundle, tmp_path / "cache" / "other")
    assert sorted(p.name for p in target.parent.iterdir()) == ["b"]  # no temp dir left


def test_model_dir_errors(tmp_path):
    with pytest.raises(BundleError, match="not a directory"):
        EdgeBundle.from_model(tmp_path / "nope")
    d = make_tiny_bert_dir(tmp_path / "m")
    (d / "model.safetensors").unlink()
    with pytest.raises(BundleError, match="safetensors"):
        EdgeBundle.from_model(d)


def test_bfloat16_weights_are_read(tmp_path):
    from safetensors.numpy import load_file

    d = make_tiny_bert_dir(tmp_path / "m")
    emb = load_file(str(d / "model.safetensors"))["embeddings.word_embeddings.weight"]
    bf16 = (emb.view(np.uint32) >> 16).astype(np.uint16)  # truncate to bfloat16
    header = json.dumps({"bert.embeddings.word_embeddings.weight": {
        "dtype": "BF16", "shape": list(emb.shape), "data_offsets": [0, bf16.nbytes]}}).encode()
    (d / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bf16.tobytes())
    b = EdgeBundle.from_model(d)
    np.testing.assert_array_equal(b.embeddings, (bf16.astype(np.uint32) << 16).view(np.float32))


def test_import_shared_pulls_no_torch():
    code = ("import sys, shared, shared.mechanisms, shared.accounting, shared.bundle, shared.payload;"
            "bad=[m for m in ('torch','transformers','onnxruntime') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_length_a_model_reads_is_its_own_within_the_bundles(tiny_bundle):
    """``EdgeBundle.length_for_model``: the one length policy of the edge's ``--post
    predict`` and the server's records for a served task."""
    top = tiny_bundle.max_length
    assert tiny_bundle.length_for_model(16) == 16
    assert tiny_bundle.length_for_model(top + 100) == top
    for bad in (None, 3, True, 16.0, "16"):
        assert tiny_bundle.length_for_model(bad) is None
