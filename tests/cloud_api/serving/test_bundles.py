"""BundleStore: bundles of the home verified and cached, the default bundle found by id."""

from __future__ import annotations

import pytest

from cloud_api.errors import InvalidRequest, NotFound, Unavailable
from cloud_api.home import ModelHome
from cloud_api.serving import BundleStore
from shared.bundle import EdgeBundle


def test_bundle_of_the_home_and_its_tarball(home, bundle):
    store = BundleStore(home)
    got = store.get(bundle.bundle_id)
    assert got.bundle_id == bundle.bundle_id and store.get(bundle.bundle_id) is got
    tar = store.tarball(bundle.bundle_id)
    assert store.tarball(bundle.bundle_id) is tar  # built once
    assert EdgeBundle.from_tar_bytes(tar, expected_id=bundle.bundle_id).vocab_size == 40
    assert store.ids() == [bundle.bundle_id]


def test_added_bundle_is_saved_and_found_by_a_new_store(tmp_path, bundle):
    home = ModelHome(tmp_path / "h").ensure()
    path = BundleStore(home).add(bundle)
    assert path == home.bundle_dir(bundle.bundle_id) and (path / "bundle.json").is_file()
    assert BundleStore(home).get(bundle.bundle_id).bundle_id == bundle.bundle_id


def test_default_bundle_is_found_without_being_saved(tmp_path, minilm_bundle):
    home = ModelHome(tmp_path / "h").ensure()
    store = BundleStore(home)
    assert store.default_bundle_id == minilm_bundle.bundle_id
    assert store.get(minilm_bundle.bundle_id).dim == 384
    assert not any(home.bundles_dir.iterdir())


def test_unknown_malformed_and_damaged_bundles(home, bundle):
    store = BundleStore(home, default_model_dir=home.root / "no-such-model")
    with pytest.raises(NotFound, match="no bundle"):
        store.get("0" * 64)
    with pytest.raises(InvalidRequest):
        store.get("../etc")
    emb = home.bundle_dir(bundle.bundle_id) / "embeddings.npy"
    data = bytearray(emb.read_bytes())
    data[-1] ^= 0xFF
    emb.write_bytes(bytes(data))
    with pytest.raises(Unavailable, match="damaged") as err:
        store.get(bundle.bundle_id)
    assert str(home.root) not in err.value.detail
