"""The privatization table (shared.table) and the bundle layout that carries it."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from shared.bundle import BundleError, EdgeBundle
from shared.mechanisms import DChiText
from shared.table import TableError, TableSpec, build_table, dequantize, quantize_int8


@pytest.mark.parametrize("text,name", [("none", "none"), ("none-int8", "none-int8"),
                                       ("pca32", "pca32"), ("PCA16-int8", "pca16-int8"),
                                       ("pca8-float32", "pca8")])
def test_table_names_parse(text, name):
    assert TableSpec.parse(text).name == name


@pytest.mark.parametrize("text", ["pca", "pca0", "pcax", "384", "pca32-int4", ""])
def test_bad_table_names_are_refused(text):
    with pytest.raises(TableError, match="table|k"):
        TableSpec.parse(text)


def test_int8_table_is_its_dequantized_values():
    rng = np.random.default_rng(0)
    v = rng.standard_normal((500, 12)).astype(np.float32)
    q, s = quantize_int8(v, np.arange(500))
    assert q.dtype == np.int8 and s.dtype == np.float32 and np.abs(q).max() == 127
    d = dequantize(q, s)
    # one float32 rounding of the exact product: what numpy's float32 multiply gives too
    np.testing.assert_array_equal(d, q.astype(np.float32) * s)
    # per column, the error of a value is at most half a step
    assert np.all(np.abs(d - v) <= s / 2 * (1 + 1e-6))


@pytest.mark.parametrize("scale", [np.zeros(3), np.array([1.0, np.nan, 1.0]),
                                   np.array([1.0, -1.0, 1.0]), np.ones(4)])
def test_bad_scales_are_refused(scale):
    with pytest.raises(TableError):
        dequantize(np.zeros((5, 3), np.int8), scale.astype(np.float32))


def test_pca_projection_only_shrinks_distances(minilm_bundle):
    emb, reg = minilm_bundle.embeddings, minilm_bundle.regular_ids
    t = build_table(emb, reg, TableSpec("pca", 32, "float32"))
    assert t.values.shape == (emb.shape[0], 32)
    rng = np.random.default_rng(1)
    a, b = rng.choice(reg, 2000), rng.choice(reg, 2000)
    full = np.linalg.norm(emb[a].astype(np.float64) - emb[b], axis=1)
    low = np.linalg.norm(t.values[a].astype(np.float64) - t.values[b], axis=1)
    assert np.all(low <= full * (1 + 1e-5) + 1e-6)
    # a real reduction, and the top 32 directions keep a real share of the spread
    assert low.mean() < 0.8 * full.mean()
    assert 0.2 < t.description["projection"]["explained_variance"] < 0.5
    assert t.description["projection"]["fitted_on"] == "table"


def test_pca_basis_is_the_same_every_time(minilm_bundle):
    emb, reg = minilm_bundle.embeddings, minilm_bundle.regular_ids
    a = build_table(emb, reg, TableSpec("pca", 16, "int8"))
    b = build_table(emb, reg, TableSpec("pca", 16, "int8"))
    np.testing.assert_array_equal(a.stored, b.stored)
    np.testing.assert_array_equal(a.scale, b.scale)


def test_duplicate_rows_are_refused(tiny_bundle):
    emb = np.array(tiny_bundle.embeddings)
    r = tiny_bundle.regular_ids
    emb[r[3]] = emb[r[7]]
    with pytest.raises(TableError, match=f"{r[3]} and {r[7]}|{r[7]} and {r[3]}"):
        build_table(emb, r, TableSpec("none", None, "float32"))


@pytest.mark.parametrize("name", ["pca32-int8", "pca64", "none-int8"])
def test_compact_bundle_round_trip(minilm_bundle, tmp_path, name):
    c = minilm_bundle.with_table(name)
    assert not c.has_embeddings and c.table_name == name
    files = sorted(p.name for p in c.save(tmp_path / "b").iterdir())
    assert "embeddings.npy" not in files and "table.npy" in files
    assert ("table_scale.npy" in files) == name.endswith("int8")
    loaded = EdgeBundle.load(tmp_path / "b", expected_id=c.bundle_id)
    np.testing.assert_array_equal(loaded.table, c.table)
    assert loaded.table.dtype == np.float32
    assert EdgeBundle.from_tar_bytes(c.to_tar_bytes()).bundle_id == c.bundle_id
    meta = json.loads((tmp_path / "b" / "bundle.json").read_text())
    assert meta["table"]["source"]["sha256"] and meta["table"]["source"]["dim"] == 384
    assert meta["table"]["projection"]["kind"] in ("pca", "none")
    with pytest.raises(BundleError, match="dchi-text only"):
        loaded.embeddings  # noqa: B018


def test_the_original_layout_keeps_its_id(minilm_bundle):
    # the 384-d bundle every existing model names: "table" is absent from its bundle.json
    assert "table" not in minilm_bundle.meta
    assert minilm_bundle.with_table("none").bundle_id == minilm_bundle.bundle_id
    assert minilm_bundle.table is minilm_bundle.embeddings
    assert minilm_bundle.table_info["name"] == "none"


def test_compact_bundle_is_small(minilm_bundle):
    tar = minilm_bundle.with_table("pca32-int8").to_tar_bytes()
    assert len(tar) < 1.6e6  # the table (30,522 x 32 int8) and the tokenizer


def _rewrite(d, name: str, arr: np.ndarray) -> None:
    """Replace one array file and re-sign bundle.json as a hostile server could."""
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    (d / name).write_bytes(buf.getvalue())
    meta = json.loads((d / "bundle.json").read_text())
    import hashlib

    meta["files"][name] = hashlib.sha256(buf.getvalue()).hexdigest()
    meta["bundle_id"] = EdgeBundle._compute_id(meta)
    (d / "bundle.json").write_text(json.dumps(meta))


def test_tampered_table_is_refused_in_one_line(minilm_bundle, tmp_path):
    d = minilm_bundle.with_table("pca16-int8").save(tmp_path / "b")
    raw = bytearray((d / "table.npy").read_bytes())
    raw[-1] ^= 1
    (d / "table.npy").write_bytes(bytes(raw))
    with pytest.raises(BundleError, match="table.npy: content does not match its hash"):
        EdgeBundle.load(d)


@pytest.mark.parametrize("what", ["dtype", "shape", "scale"])
def test_table_that_does_not_match_its_description_is_refused(minilm_bundle, tmp_path, what):
    c = minilm_bundle.with_table("pca16-int8")
    d = c.save(tmp_path / "b")
    q = np.load(d / "table.npy")
    if what == "dtype":
        _rewrite(d, "table.npy", q.astype(np.float32))
        match = "dtype"
    elif what == "shape":
        _rewrite(d, "table.npy", q[:, :8])
        match = "shape"
    else:
        _rewrite(d, "table_scale.npy", np.zeros(16, np.float32))
        match = "scale"
    with pytest.raises(BundleError, match=match) as e:
        EdgeBundle.load(d)
    assert "\n" not in str(e.value)


def test_dchi_text_privatizes_over_the_table(minilm_bundle):
    c = minilm_bundle.with_table("pca32-int8")
    m = DChiText(c, 40.0)
    ids = np.array(minilm_bundle.text_tokenizer().encode(
        "a gripping , funny film", add_special_tokens=False).ids)
    out = m.privatize_ids(np.tile(ids, 200), np.random.default_rng(0))
    assert np.isin(out, c.regular_ids).all()
    # brute force in float64 over the dequantized table agrees on a few queries
    y = m.noisy_embeddings(ids, np.random.default_rng(5))
    reg = c.regular_ids
    d = ((c.table[reg].astype(np.float64)[None] - y[:, None]) ** 2).sum(-1)
    np.testing.assert_array_equal(m.privatize_ids(ids, np.random.default_rng(5)),
                                  reg[d.argmin(axis=1)])


@pytest.mark.parametrize("projection", [{"kind": "pca", "k": 16, "fitted_on": "sst2"},
                                        {"kind": "learned"}, None])
def test_a_projection_fitted_on_anything_but_the_table_is_refused(minilm_bundle, tmp_path,
                                                                 projection):
    d = minilm_bundle.with_table("pca16-int8").save(tmp_path / "b")
    meta = json.loads((d / "bundle.json").read_text())
    meta["table"]["projection"] = projection
    meta["bundle_id"] = EdgeBundle._compute_id(meta)
    (d / "bundle.json").write_text(json.dumps(meta))
    with pytest.raises(BundleError, match="projection"):
        EdgeBundle.load(d)


def test_a_new_dchi_text_model_gets_the_default_table_only_when_nothing_else_is_asked():
    from shared.table import DEFAULT_TABLE, MATCHED_ETA, table_for_new_model

    assert table_for_new_model("dchi-text", None, bundle_given=False) == DEFAULT_TABLE
    assert DEFAULT_TABLE in MATCHED_ETA and MATCHED_ETA[DEFAULT_TABLE] < MATCHED_ETA["none"]
    assert table_for_new_model("dchi-text", "none", bundle_given=False) == "none"
    assert table_for_new_model("dchi-text", None, bundle_given=True) is None  # its own table
    assert table_for_new_model("dchi-embedding", None, bundle_given=False) is None
    assert table_for_new_model("laplace", None, bundle_given=False) is None
