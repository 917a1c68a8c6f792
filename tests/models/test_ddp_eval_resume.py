"""DDP dev evaluation and pretraining resume under a real ``torchrun`` (2 processes, gloo).

This file is also the script torchrun starts:

    torchrun --standalone --nproc-per-node 2 tests/models/test_ddp_eval_resume.py MODE OUT BERT

MODE "eval": each rank evaluates its share of a dev set, then fine-tunes one epoch with a
dev set; rank r writes ``OUT/eval-<r>.json`` (the sharded reports, the rows its module
evaluated, and the single-process reports on the same weights).
MODE "resume": a 4-step pretraining uninterrupted (``OUT/full``), and one cancelled after
its step-2 checkpoint then resumed (``OUT/cut``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PRE = {"objective": "denoising", "mechanism": "dchi-text", "eta": 8.0, "batch_size": 4,
       "max_length": 32, "progress": False, "seed": 3}


def _torchrun(mode: str, out: Path, bert_dir: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        env.pop(k, None)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(Path(__file__).resolve()), mode, str(out), str(bert_dir)],
        env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _figures(rep: dict) -> tuple:
    return rep["accuracy"], rep["loss"], rep["n"], rep["confusion"], rep["macro_f1"]


def test_two_ranks_share_the_dev_set_and_get_the_single_process_figures(tmp_path,
                                                                          tiny_bert_dir):
    _torchrun("eval", tmp_path, tiny_bert_dir)
    ranks = [json.loads((tmp_path / f"eval-{r}.json").read_text()) for r in (0, 1)]
    for what in ("direct", "finetune"):
        alone = ranks[0][f"{what}_alone"]
        for r in ranks:  # every rank: exactly the single-process figures on the same weights
            assert _figures(r[what]) == _figures(alone), what
            assert r[what]["per_class"] == alone["per_class"]
    # 42 dev examples in batches of 8: 6 batches, ranks 0 and 1 take 3 each (8+8+8, 8+8+2);
    # no example evaluated twice, none left out
    rows = [r["direct_rows"] for r in ranks]
    assert sum(rows) == 42 and max(rows) < 42
    assert sorted(rows) == [18, 24]
    fin = [r["finetune_eval_rows"] for r in ranks]  # 1 epoch: the epoch's dev + the final
    assert sum(fin) == 2 * 42 and max(fin) < 2 * 42


def test_resumed_two_rank_pretraining_counts_the_tokens_of_an_uninterrupted_run(
        tmp_path, tiny_bert_dir):
    import torch

    from models.pretraining.pretrain import INFO_FILE, STATE_FILE, list_checkpoints, pretrain
    from tests.models.conftest import sentiment_texts

    _torchrun("resume", tmp_path, tiny_bert_dir)
    full = json.loads((tmp_path / "full" / INFO_FILE).read_text())
    cut = json.loads((tmp_path / "cut" / INFO_FILE).read_text())
    assert full["world_size"] == cut["world_size"] == 2 and full["steps"] == 4
    assert cut["tokens_seen"] == full["tokens_seen"] > 0
    assert cut["predictions_seen"] == full["predictions_seen"] > 0
    # the logged loss is the mean over both ranks' batches, the same on every rank (each
    # rank trains on other batches, so rank-local losses differ)
    told = [json.loads((tmp_path / f"loss-{r}.json").read_text()) for r in (0, 1)]
    assert len(told[0]) == 4 and told[0] == told[1]
    assert [round(v, 5) for v in told[0]] == [v for _, v in full["loss_curve"]]

    # The same batches in one process: 4 steps × 2 ranks = single-process steps 0-7, so the
    # counts (and those of the step-2 checkpoint, single-process step 4) are the global ones.
    texts = sentiment_texts(40, seed=5)[0]
    alone = pretrain(tiny_bert_dir, tmp_path / "alone", corpus_texts=texts, steps=8,
                     save_every=4, **PRE)
    one = json.loads((alone / INFO_FILE).read_text())
    assert one["tokens_seen"] == full["tokens_seen"]
    assert one["predictions_seen"] == full["predictions_seen"]

    def saved(out: Path, i: int) -> dict:
        return torch.load(list_checkpoints(out)[i] / STATE_FILE, weights_only=True)["run"]

    assert saved(tmp_path / "cut", 0)["tokens_seen"] == saved(alone, 0)["tokens_seen"]
    assert saved(tmp_path / "cut", 0)["world_size"] == 2

    # resuming a 2-process checkpoint with one process is refused, naming both sizes
    with pytest.raises(ValueError, match=r"written by 2 process\(es\), this run has 1"):
        pretrain(tiny_bert_dir, tmp_path / "cut", corpus_texts=texts, steps=4, resume=True,
                 **PRE)


# -- the torchrun side ---------------------------------------------------------------------
def _count_rows(module, counter: list[int], eval_only: bool = False):
    def hook(mod, args, kwargs):
        if not (eval_only and mod.training):
            counter[0] += int(kwargs["input_ids"].shape[0] if "input_ids" in kwargs
                              else args[0].shape[0])
    return module.register_forward_pre_hook(hook, with_kwargs=True)


def _eval_main(ctx, out: Path, bert_dir: Path) -> None:
    import torch

    from models.training.data import dataset_from_records
    from models.training.finetune import TrainConfig, build_model, evaluate_dataset, finetune
    from shared.bundle import EdgeBundle
    from tests.models.conftest import sentiment_texts, token_records

    bundle = EdgeBundle.from_model(bert_dir)
    texts, _, labels = sentiment_texts(74, seed=1)
    records = token_records(bundle, "dchi-text", texts, labels, seed=2)
    train = dataset_from_records(records[:32], ["neg", "pos"])
    dev = dataset_from_records(records[32:], ["neg", "pos"])
    special = bundle.special_ids
    res: dict = {}

    model = build_model(train, bundle, bert_dir, TrainConfig(seed=0))
    rows = [0]
    handle = _count_rows(model, rows)
    res["direct"] = evaluate_dataset(model, dev, special, 32, torch.device("cpu"), None, 8,
                                     dist_ctx=ctx)
    handle.remove()
    res["direct_rows"] = rows[0]
    res["direct_alone"] = evaluate_dataset(model, dev, special, 32, torch.device("cpu"), None, 8)

    model = build_model(train, bundle, bert_dir, TrainConfig(seed=0))
    rows = [0]
    handle = _count_rows(model, rows, eval_only=True)
    cfg = TrainConfig(epochs=1, batch_size=8, eval_batch_size=8, max_length=32, lr=1e-3,
                      progress=False, seed=0)
    fin = finetune(train, dev, bundle, bert_dir, cfg, model=model, dist_ctx=ctx)
    handle.remove()
    res["finetune"] = fin.metrics["dev"]
    res["finetune_eval_rows"] = rows[0]
    res["finetune_alone"] = evaluate_dataset(fin.module, dev, special, 32, torch.device("cpu"),
                                             None, 8)
    (out / f"eval-{ctx.rank}.json").write_text(json.dumps(res))


def _resume_main(ctx, out: Path, bert_dir: Path) -> None:
    from models.pretraining.pretrain import pretrain
    from models.training.finetune import TrainingCancelled
    from tests.models.conftest import sentiment_texts

    texts = sentiment_texts(40, seed=5)[0]
    args = {"corpus_texts": texts, "steps": 4, "save_every": 2, "dist_ctx": ctx, **PRE}
    losses: list[float] = []  # what this rank's progress callback was told
    pretrain(bert_dir, out / "full", on_progress=lambda _f, info: losses.append(info["loss"]),
             **args)
    (out / f"loss-{ctx.rank}.json").write_text(json.dumps(losses))
    polls: list[int] = []
    with pytest.raises(TrainingCancelled):  # stops before step 3, after the step-2 checkpoint
        pretrain(bert_dir, out / "cut", should_stop=lambda: polls.append(1) or len(polls) > 2,
                 **args)
    pretrain(bert_dir, out / "cut", resume=True, **args)


def _main(mode: str, out: Path, bert_dir: Path) -> None:
    import torch

    from models.training import distributed

    torch.set_num_threads(1)
    ctx = distributed.init_from_env("cpu")
    assert ctx is not None and ctx.world_size == 2
    finished = False
    try:
        {"eval": _eval_main, "resume": _resume_main}[mode](ctx, out, bert_dir)
        finished = True
    finally:
        distributed.close(ctx, wait_for_peers=finished)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    _main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
