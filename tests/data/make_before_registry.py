"""Writes ``tests/data/before_registry/``: model version folders and payloads made by the code
as it was before mechanisms became registered objects, so that the tests can show that both
still load and predict the same (``tests/models/test_before_registry.py``).

Run once, from a checkout of that code (commit b81e198)::

    PYTHONPATH=$CHECKOUT python $CHECKOUT/../wt-registry/tests/data/make_before_registry.py OUT
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from models.training.experiment import train_from_records
from models.training.finetune import TrainConfig
from models.versions.model_version import load_model
from shared.bundle import EdgeBundle
from shared.mechanisms import OME, DChiEmbedding, DChiText, Laplace, TextHide
from shared.payload import make_payload
from tests.conftest import make_full_tiny_bert
from tests.models.conftest import sentiment_texts, token_records, vector_records


def main(out: Path) -> None:
    torch.set_num_threads(1)
    out.mkdir(parents=True)
    bert = make_full_tiny_bert(Path(tempfile.mkdtemp()) / "bert")
    bundle = EdgeBundle.from_model(bert)
    cfg = TrainConfig(epochs=1, lr=1e-3, batch_size=8, progress=False, seed=0, hidden=(8,))
    texts, _, labels = sentiment_texts(16)
    sets = {"dchi-text": token_records(bundle, "dchi-text", texts, labels, eta=50.0),
            "ome": vector_records(bundle.bundle_id, "ome", 16, dim=8),
            "texthide": vector_records(bundle.bundle_id, "texthide", 16, dim=8)}
    expected = {}
    for name, recs in sets.items():
        res = train_from_records(recs, out / name, bundle=bundle, dev_records=recs[:8],
                                 base=bert if name == "dchi-text" else None, cfg=cfg)
        mv = load_model(res.model_dir)
        probe = recs[:4]
        with open(out / f"{name}.jsonl", "w") as f:
            for r in probe:
                f.write(r.payload.model_dump_json(exclude_none=True) + "\n")
        expected[name] = mv.predict_proba([r.payload for r in probe]).tolist()
    # one payload of every mechanism, as the wire carries it
    rng = np.random.default_rng(0)
    ids = np.array([12, 13, 14], dtype=np.int64)
    vec = rng.normal(0, 1, 8)
    wire = [
        make_payload("none", {}, bundle.bundle_id, ids),
        make_payload("dchi-text", {"eta": 50.0}, bundle.bundle_id,
                     DChiText(bundle, 50.0).privatize_ids(ids, rng), [2, 1]),
        make_payload("dchi-embedding", {"eta": 50.0}, bundle.bundle_id,
                     DChiEmbedding(50.0).privatize(bundle.embeddings[ids], rng),
                     float_dtype="float16"),
        make_payload("laplace", Laplace(5.0).params, bundle.bundle_id,
                     Laplace(5.0).privatize(vec, rng)),
        make_payload("ome", OME(5.0, 2.0, 8).params, bundle.bundle_id,
                     OME(5.0, 2.0, 8).privatize(vec, rng)),
        make_payload("texthide", {"m": 4, "k": 1}, bundle.bundle_id,
                     TextHide(4, 1, 8, seed=1).encrypt(vec[None], None, rng)[0][0]),
    ]
    with open(out / "wire.jsonl", "w") as f:
        for p in wire:
            f.write(p.model_dump_json(exclude_none=True) + "\n")
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
