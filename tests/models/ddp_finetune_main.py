"""Run under ``torchrun --nproc-per-node 2``: fine-tune a tiny BERT with DDP (gloo, CPU).

    torchrun --standalone --nproc-per-node 2 tests/models/ddp_finetune_main.py OUT BERT_DIR

Each rank writes ``OUT/rank-<r>.json`` (a hash of its final weights, the steps it ran,
the epoch losses); rank 0 writes the pretrained BERT ``OUT/pre`` (the retraining job test covers rank 0
writing a model version through ``train_from_records``). Used by
tests/models/test_distributed.py.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from models.training import distributed  # noqa: E402
from models.training.data import dataset_from_records  # noqa: E402
from models.training.finetune import TrainConfig, finetune  # noqa: E402
from shared.bundle import EdgeBundle  # noqa: E402
from tests.models.conftest import sentiment_texts, token_records  # noqa: E402


def main(out: Path, bert_dir: Path) -> None:
    torch.set_num_threads(1)
    ctx = distributed.init_from_env("cpu")
    assert ctx is not None and ctx.backend == "gloo"
    bundle = EdgeBundle.from_model(bert_dir)
    texts, _, labels = sentiment_texts(72, seed=1)
    records = token_records(bundle, "dchi-text", texts, labels, seed=2)
    train = dataset_from_records(records[:64], ["neg", "pos"])
    dev = dataset_from_records(records[64:], ["neg", "pos"])
    cfg = TrainConfig(epochs=2, batch_size=8, progress=False, lr=1e-3)
    steps: list[int] = []
    res = finetune(train, dev, bundle, bert_dir, cfg, dist_ctx=ctx,
                   should_stop=lambda: steps.append(1) is None and False)
    digest = hashlib.sha256()
    for k, v in sorted(res.module.state_dict().items()):
        digest.update(k.encode() + v.detach().cpu().numpy().tobytes())
    # privacy-adaptive pretraining with DDP: 4 steps, rank 0 writes the BERT folder
    from models.pretraining.pretrain import pretrain

    pre_steps: list[int] = []
    pretrain(bert_dir, out / "pre", "denoising", "dchi-text", 10.0, corpus_texts=texts,
             steps=4, batch_size=8, max_length=32, progress=False, dist_ctx=ctx, seed=1,
             should_stop=lambda: pre_steps.append(1) is None and False)
    (out / f"rank-{ctx.rank}.json").write_text(json.dumps({
        "weights": digest.hexdigest(), "steps": len(steps),
        "losses": [e["train_loss"] for e in res.history], "pretrain_steps": len(pre_steps)}))
    distributed.close(ctx)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
