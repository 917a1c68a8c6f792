"""models.versions.manifest: a folder is whole only when every file matches its manifest, nothing is
missing or added; a folder without one passes only with finite weights (every float
dtype safetensors stores), and is then sealed; writers that add files keep it whole."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from models.versions.manifest import (
    MANIFEST_FILE,
    IntegrityError,
    check_finite_safetensors,
    file_sha256,
    seal,
    update_manifest,
    verify_folder,
)


def weights_folder(path, arrays: dict | None = None):
    from safetensors.numpy import save_file

    path.mkdir(parents=True)
    save_file(arrays or {"w": np.ones((4, 4), np.float32), "ids": np.arange(4, dtype=np.int32)},
              str(path / "model.safetensors"))
    (path / "config.json").write_text('{"format": "x"}\n')
    return path


def test_a_sealed_folder_is_whole_until_a_byte_changes_or_a_file_comes_or_goes(tmp_path):
    f = weights_folder(tmp_path / "v")
    v = verify_folder(f)
    assert not v.sealed and set(v.digests) == {"config.json", "model.safetensors"}
    seal(v)
    doc = json.loads((f / MANIFEST_FILE).read_text())
    assert doc["files"] == {n: file_sha256(f / n) for n in ("config.json", "model.safetensors")}
    assert verify_folder(f).sealed
    (f / ".model.safetensors.tmp").write_bytes(b"partial")  # hidden: a writer's temporary
    assert verify_folder(f).sealed
    cases = {
        "does not match its SHA-256": lambda d: (d / "config.json").write_text('{"x": 1}\n'),
        "is missing": lambda d: (d / "config.json").unlink(),
        "is not in manifest.json": lambda d: (d / "classifier.int8.onnx").write_bytes(b"x"),
        "not a privbert-manifest": lambda d: (d / MANIFEST_FILE).write_text("[]"),
    }
    for why, attack in cases.items():
        d = tmp_path / why.replace(" ", "-")
        shutil.copytree(f, d)
        attack(d)
        with pytest.raises(IntegrityError, match=why) as exc:
            verify_folder(d)
        assert "\n" not in str(exc.value)


def test_without_a_manifest_only_finite_weights_pass(tmp_path):
    """NaN and infinity in every float dtype safetensors stores (bf16 as its bits); an
    integer tensor with the same bytes is no weight to check; a cut file is refused."""
    import torch
    from safetensors.torch import save_file

    ok = {"f32": torch.ones(3), "f16": torch.ones(3, dtype=torch.float16),
          "bf16": torch.ones(3, dtype=torch.bfloat16), "f64": torch.ones(3, dtype=torch.float64),
          "i32": torch.full((3,), 0x7FC00000, dtype=torch.int32)}
    save_file(ok, str(tmp_path / "ok.safetensors"))
    check_finite_safetensors(tmp_path / "ok.safetensors")
    for name in ("f32", "f16", "bf16", "f64"):
        for bad in (float("nan"), float("inf"), float("-inf")):
            t = dict(ok)
            t[name] = t[name].clone()
            t[name][1] = bad
            path = tmp_path / f"{name}.safetensors"
            save_file(t, str(path))
            with pytest.raises(IntegrityError, match=f"tensor {name} holds NaN or infinite"):
                check_finite_safetensors(path)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes((tmp_path / "ok.safetensors").read_bytes()[:-8])
    with pytest.raises(IntegrityError, match="outside the file"):
        check_finite_safetensors(cut)
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 4)
    with pytest.raises(IntegrityError, match="not a safetensors file"):
        check_finite_safetensors(tmp_path / "bad.safetensors")
    f = weights_folder(tmp_path / "v", {"w": np.array([1.0, np.nan], np.float32)})
    with pytest.raises(IntegrityError, match="tensor w holds NaN"):
        verify_folder(f)


def test_writers_that_add_files_keep_a_sealed_version_whole(tmp_path, tiny_bert_dir,
                                                            tiny_bert_bundle):
    """A version is sealed when it is made (issue 42); the ONNX export (and its int8 file)
    rewrite config.json and add files in a version already sealed in a home: it stays whole;
    a folder without a manifest stays without."""
    from cloud_api.home import ModelHome
    from models.export.writers import export_classifier_onnx
    from models.training.experiment import train_from_records
    from models.training.finetune import TrainConfig
    from tests.models.conftest import sentiment_texts, token_records

    texts, _, labels = sentiment_texts(16)
    recs = token_records(tiny_bert_bundle, "dchi-text", texts, labels, eta=50.0)
    out = train_from_records(recs, tmp_path / "out", bundle=tiny_bert_bundle, base=tiny_bert_dir,
                             cfg=TrainConfig(epochs=1, progress=False, seed=0)).model_dir
    assert verify_folder(out).sealed  # sealed when it is made (issue 42)
    home = ModelHome(tmp_path / "home").ensure()
    v = home.version_dir("m", home.register("m", out))
    assert verify_folder(v).sealed
    export_classifier_onnx(v, int8=True)
    whole = verify_folder(v)
    assert {"classifier.onnx", "classifier.int8.onnx", "config.json"} <= set(whole.digests)
    (out / MANIFEST_FILE).unlink()
    update_manifest(out, ["config.json"])  # no manifest: nothing written
    assert not (out / MANIFEST_FILE).exists()
