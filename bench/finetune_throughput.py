"""Fine-tuning throughput of models.training.finetune against a plain torch loop, same model, same batches.

    python -m bench.finetune_throughput [--sentences 2000] [--mechanism dchi-text] [--eta 65]
                                        [--rounds 2] [--threads 2]

Data: the first ``--sentences`` SST-2 training sentences privatized on the edge path
(``edge_agent.Privatizer``), as ``cloud-api train`` does. Both variants train one epoch
over the SAME batches: the length-sorted buckets that ``finetune(seed=0)`` draws
(``models.training.data.length_buckets`` with ``default_rng(0)``), collated by
``models.training.data.collate_dataset``.

- plain torch loop (written here, independent of ``models/``): ``BertModel`` with frozen
  word embeddings, mean pooling, dropout, linear head, cross-entropy, backward, AdamW step;
- ours: ``models.training.finetune.finetune`` (no dev set): the same plus warm-up/decay schedule,
  gradient clipping, GradScaler/autocast switches, keeping the best state, and the frozen-
  table checks at the end.

Variants alternate ``--rounds`` times; each variant's time is its best round. The model is
built before timing in both (loading the checkpoint is not part of a training step).
Throughput = non-padding tokens per second.
"""

from __future__ import annotations

import argparse
import copy
import os
import time

import numpy as np
import torch

from bench.common import DATA, machine, read_tsv, table


def build_data(n: int, mechanism: str, eta: float):
    from edge_agent import Privatizer
    from models.training.data import dataset_from_records
    from shared.bundle import EdgeBundle
    from shared.mechanisms import DChiEmbedding, DChiText

    bundle = EdgeBundle.from_model()
    rows = read_tsv(DATA / "sst2" / "train.tsv", limit=n)
    mech = DChiText(bundle, eta) if mechanism == "dchi-text" else DChiEmbedding(eta)
    recs = Privatizer(bundle, mech).privatize_records(
        [r[0] for r in rows], [int(r[1]) for r in rows], rng=np.random.default_rng(0))
    return bundle, dataset_from_records(recs, ["0", "1"])


def plain_epoch(bert, ds, batches, special, lr: float) -> float:
    """One epoch of the plain loop; returns seconds."""
    from models.training.data import collate_dataset

    head = torch.nn.Linear(bert.config.hidden_size, 2)
    drop = torch.nn.Dropout(bert.config.hidden_dropout_prob)
    params = [p for p in list(bert.parameters()) + list(head.parameters()) if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    bert.train()
    t = time.perf_counter()
    for idx in batches:
        b = collate_dataset(ds, idx, special, 128)
        if "token_rows" in b:  # dchi-embedding: perturbed rows replace the table's
            table_rows = bert.embeddings.word_embeddings(b["input_ids"])
            emb = torch.where(b["row_mask"].unsqueeze(-1), b["token_rows"], table_rows)
            out = bert(inputs_embeds=emb, attention_mask=b["attention_mask"],
                       token_type_ids=b["token_type_ids"])
        else:
            out = bert(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                       token_type_ids=b["token_type_ids"])
        m = b["attention_mask"].unsqueeze(-1).float()
        pooled = (out.last_hidden_state * m).sum(1) / m.sum(1)
        loss = torch.nn.functional.cross_entropy(head(drop(pooled)),
                                                 torch.from_numpy(ds.targets[idx]))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=int, default=2000)
    ap.add_argument("--mechanism", choices=("dchi-text", "dchi-embedding"), default="dchi-text")
    ap.add_argument("--eta", type=float, default=65.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from models.nets.backbone import load_bert
    from models.training.data import length_buckets
    from models.training.finetune import TrainConfig, build_model, finetune

    bundle, ds = build_data(args.sentences, args.mechanism, args.eta)
    special = bundle.special_ids
    batches = list(length_buckets(ds.lengths(), 32, np.random.default_rng(0)))
    tokens = int(ds.lengths().sum()) + 2 * len(ds)  # + [CLS], [SEP]
    lr = 2e-5
    base_bert = load_bert(None)
    base_bert.embeddings.word_embeddings.weight.requires_grad_(False)
    cfg = TrainConfig(epochs=1, lr=lr, seed=0, device="cpu", precision="fp32", progress=False)
    base_ours = build_model(ds, bundle, None, cfg)
    t_plain, t_ours = [], []
    for _ in range(args.rounds):
        torch.manual_seed(0)
        t_plain.append(plain_epoch(copy.deepcopy(base_bert), ds, batches, special, lr))
        model = copy.deepcopy(base_ours)
        t = time.perf_counter()
        finetune(ds, None, bundle, cfg=cfg, model=model)
        t_ours.append(time.perf_counter() - t)
    bp, bo = min(t_plain), min(t_ours)
    print(f"machine: {machine()}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"MiniLM-L6-H384, {args.mechanism} eta={args.eta:g}, {len(ds)} SST-2 sentences, "
          f"{len(batches)} batches of 32, {tokens} tokens, 1 epoch, best of {args.rounds} "
          "alternating rounds")
    print(table(["variant", "epoch wall", "tokens/s", "speed vs plain", "all rounds"], [
        ["plain torch loop (BertModel, mean pool, AdamW)", f"{bp:.1f} s", f"{tokens / bp:,.0f}",
         "1.000", ", ".join(f"{x:.1f}" for x in t_plain)],
        ["ours: models.training.finetune.finetune", f"{bo:.1f} s", f"{tokens / bo:,.0f}",
         f"{bp / bo:.3f}", ", ".join(f"{x:.1f}" for x in t_ours)],
    ]))
    verdict = "within" if bp / bo >= 0.9 else "OUTSIDE"
    print(f"fine-tuning: {bp / bo:.3f}x the plain loop's speed ({verdict} the 10% target)")


if __name__ == "__main__":
    main()
