"""Pretraining throughput against a plain torch loop on the same model and the same batches.

    python -m bench.train_throughput [--steps 3] [--rounds 2] [--batch-size 32] [--max-length 128]
                                     [--objective denoising] [--mechanism dchi-text] [--eta 65] [--hf]

Variants, each over the SAME batches (the first ``--steps`` batches that
``models.pretraining.pretrain.pretrain(..., seed=S)`` would train on, from the default corpus):

- plain torch loop: ``BertModel`` + a hand-written tied MLM head at the masked positions,
  cross-entropy, backward, ``AdamW.step``, ``zero_grad`` (no privatization, no clipping,
  no schedule) — written here, independent of ``models/``;
- ours, privatization excluded: ``models.pretraining.pretrain.Trainer.step`` on the pre-built batches
  (autocast switch, gradient clipping, AdamW, linear schedule);
- ours, privatization included: the loop body of ``pretrain`` — ``build_batch``
  (dχ privatization of every token, masking, targets) + ``Trainer.step``;
- with ``--hf``: ``transformers.BertForMaskedLM`` (logits over the whole vocabulary at every
  position), for reference.

Variants run interleaved step by step in rotating order, ``--rounds`` times; a variant's time is the sum
over batches of its best round (the machine may be shared); process CPU time likewise. Throughput = non-padding tokens the model reads per second.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

from bench.common import machine, table


class PlainHead(torch.nn.Module):
    """BERT's MLM transform + decoder tied to the (frozen) word embeddings."""

    def __init__(self, emb: torch.nn.Embedding, hidden: int):
        super().__init__()
        self.dense = torch.nn.Linear(hidden, emb.weight.shape[1])
        self.norm = torch.nn.LayerNorm(emb.weight.shape[1], eps=1e-12)
        self.emb = emb
        self.bias = torch.nn.Parameter(torch.zeros(emb.weight.shape[0]))

    def forward(self, h):
        return torch.nn.functional.linear(self.norm(torch.nn.functional.gelu(self.dense(h))),
                                          self.emb.weight, self.bias)


def plain_loop(base, batches):
    """The baseline: returns a function that runs one step on batch i."""
    from transformers import BertModel

    bert = BertModel.from_pretrained(str(base), local_files_only=True)
    bert.embeddings.word_embeddings.weight.requires_grad_(False)
    head = PlainHead(bert.embeddings.word_embeddings, bert.config.hidden_size)
    params = [p for p in [*bert.parameters(), *head.parameters()] if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=5e-5, eps=1e-6, weight_decay=0.01)
    bert.train()
    data = []
    for b in batches:
        ids = torch.from_numpy(b.input_ids)
        if b.embeds is None:
            inputs = {"input_ids": ids}
        else:  # dchi-embedding: the perturbed rows, prepared before the loop
            with torch.no_grad():
                x = bert.embeddings.word_embeddings(ids)
                x.view(-1, x.shape[-1])[torch.from_numpy(b.embed_pos)] = torch.from_numpy(b.embeds)
            inputs = {"inputs_embeds": x}
        data.append((inputs, torch.from_numpy(b.attention_mask), torch.from_numpy(b.masked_pos),
                     torch.from_numpy(b.targets)))

    def step(i):
        inputs, att, pos, tgt = data[i]
        h = bert(**inputs, attention_mask=att).last_hidden_state
        logits = head(h.reshape(-1, h.shape[-1])[pos])
        if tgt.ndim == 1:
            loss = torch.nn.functional.cross_entropy(logits, tgt)
        else:  # Prob MLM: mean over the K privatizations of -log p
            loss = -torch.log_softmax(logits, -1).gather(1, tgt).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def hf_loop(base, batches):
    """transformers.BertForMaskedLM: full-vocabulary logits at every position."""
    from transformers import BertForMaskedLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model = BertForMaskedLM.from_pretrained(str(base), local_files_only=True)
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-5, eps=1e-6)
    model.train()
    data = []
    for b in batches:
        if b.targets.ndim != 1 or b.embeds is not None:
            raise SystemExit("--hf: only for id inputs with one target (dchi-text, not prob)")
        labels = np.full(b.input_ids.size, -100, dtype=np.int64)
        labels[b.masked_pos] = b.targets
        data.append((torch.from_numpy(b.input_ids), torch.from_numpy(b.attention_mask),
                     torch.from_numpy(labels.reshape(b.input_ids.shape))))

    def step(i):
        ids, att, labels = data[i]
        model(input_ids=ids, attention_mask=att, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="timed steps per variant per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--objective", default="denoising")
    ap.add_argument("--mechanism", default="dchi-text")
    ap.add_argument("--eta", type=float, default=65.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hf", action="store_true", help="also time transformers.BertForMaskedLM")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads (1 makes the timing robust on a shared machine)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from models.nets.backbone import load_bert, resolve_model_dir
    from models.pretraining.pretrain import PretrainConfig, Trainer, batch_to_device, build_model
    from models.pretraining.pretrain_data import (
        BatchPrivatizer,
        batch_indices,
        build_batch,
        default_corpus_paths,
        read_corpus,
        step_rng,
        tokenize_corpus,
    )
    from shared.bundle import EdgeBundle

    base = resolve_model_dir(None)
    bundle = EdgeBundle.from_model(base)
    seqs = tokenize_corpus(bundle, read_corpus(default_corpus_paths()), args.max_length)
    priv = BatchPrivatizer(bundle, args.mechanism, args.eta)
    n = args.steps + 1  # batch 0 warms every variant up, untimed

    def make(s):
        idx = batch_indices(len(seqs), args.batch_size, args.seed, s)
        return build_batch([seqs[i] for i in idx], priv, args.objective, step_rng(args.seed, s))

    batches = [make(s) for s in range(n)]
    tokens = sum(b.n_tokens for b in batches[1:])
    t = time.perf_counter()
    for s in range(1, n):
        make(s)
    t_priv = time.perf_counter() - t

    torch.manual_seed(0)
    model = build_model(load_bert(base))
    cfg = PretrainConfig(args.objective, args.mechanism, args.eta, steps=10_000)
    trainer = Trainer(model, cfg, 10_000, torch.device("cpu"), None)
    cpu = torch.device("cpu")
    variants = {
        "plain torch loop (BertModel + tied head, AdamW)": plain_loop(base, batches),
        "ours: Trainer.step, privatization excluded":
            lambda i: trainer.step(batch_to_device(batches[i], cpu)),
        "ours: build_batch + Trainer.step (privatization included)":
            lambda i: trainer.step(batch_to_device(make(i), cpu)),
    }
    if args.hf:
        variants["transformers BertForMaskedLM (all positions x vocabulary)"] = hf_loop(base, batches)
    load0 = os.getloadavg()[0]
    for step in variants.values():
        step(0)
    # Interleaved step by step (A1 B1 C1 B2 C2 A2 ...), so that every variant meets the same
    # load from other processes and follows each other variant equally often (numpy's BLAS
    # threads keep spinning for a moment after a search); a variant's time = sum over
    # batches of its best round.
    wall = {name: np.full((args.rounds, n - 1), np.inf) for name in variants}
    cpu_t = {name: np.full((args.rounds, n - 1), np.inf) for name in variants}
    names = list(variants)
    for r in range(args.rounds):
        for i in range(1, n):
            first = (i + r) % len(names)  # rotate the order: no variant always follows another
            for name in names[first:] + names[:first]:
                step = variants[name]
                t, c = time.perf_counter(), time.process_time()
                step(i)
                wall[name][r, i - 1] = time.perf_counter() - t
                cpu_t[name][r, i - 1] = time.process_time() - c
        print(f"round {r + 1}: " + ", ".join(f"{w[r].sum():.2f} s" for w in wall.values()),
              file=sys.stderr)
    best = {name: float(w.min(axis=0).sum()) for name, w in wall.items()}
    best_cpu = {name: float(c.min(axis=0).sum()) for name, c in cpu_t.items()}
    plain = best[next(iter(variants))]
    plain_cpu = best_cpu[next(iter(variants))]
    rows = [[name, f"{t:.2f} s", f"{tokens / t:,.0f}", f"{args.steps / t:.3f}", f"{plain / t:.3f}",
             f"{best_cpu[name]:.2f} s", f"{plain_cpu / best_cpu[name]:.3f}"]
            for name, t in best.items()]
    print(f"machine: {machine()}, torch {torch.__version__} ({torch.get_num_threads()} threads), CPU, fp32")
    print(f"load average (1 min) at start {load0:.2f}, at end {os.getloadavg()[0]:.2f} "
          "(other processes share the cores: compare variants, not runs)")
    print(f"MiniLM-L6-H384, batch {args.batch_size}, max length {args.max_length}, "
          f"{args.objective} MLM, {args.mechanism} eta={args.eta:g}; {args.steps} timed steps "
          f"({tokens} non-pad tokens, {sum(b.masked_pos.size for b in batches[1:])} predictions), "
          f"per batch the best of {args.rounds} rounds, interleaved step by step")
    print(table(["variant", "wall", "tokens/s", "steps/s", "speed vs plain", "CPU time",
                 "CPU-time speed vs plain"], rows))
    ours = best["ours: Trainer.step, privatization excluded"]
    print(f"training part vs plain loop: {plain / ours:.3f}x the plain loop's speed "
          f"({'within' if ours <= plain * 1.10 else 'NOT within'} the 10% target)")
    print(f"privatization + masking alone (build_batch): {t_priv / args.steps:.3f} s/batch, "
          f"{tokens / t_priv:,.0f} tokens/s")


if __name__ == "__main__":
    main()
