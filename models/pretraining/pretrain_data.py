"""Pretraining data: the public corpus, privatized on the fly, masked for MLM (Qu et al. §3.4).

Each batch is built from the original token ids of a few corpus sequences:

1. every content token (what the edge would send: the tokenizer's ids, no
   [CLS]/[SEP]/[PAD]) is privatized with the task's mechanism — exactly the
   ``shared.mechanisms`` code the edge runs, over the whole batch at once;
2. BERT's masking picks the predicted positions among content tokens and
   replaces them (80% [MASK], 10% kept, 10% a random regular token);
3. the target of each masked position depends on the objective (``models.pretraining.mlm``).

The batch is numpy; ``models.pretraining.pretrain`` moves it to the device.
"""

from __future__ import annotations

import csv
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.nets.torch_nearest import TorchExactNearest
from models.pretraining.mlm import (
    REPLACE_MASK,
    REPLACE_RANDOM,
    choose_masked_positions,
    choose_replacements,
)
from shared.bundle import EdgeBundle
from shared.mechanisms import DChiEmbedding, DChiText, registry

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def default_corpus_paths() -> list[Path]:
    """AG News documents and the SST-2 training sentences (their labels are not read)."""
    return [DATA / "corpus" / "agnews.txt", DATA / "sst2" / "train.tsv"]


def read_corpus(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Texts, one per non-empty line. A ``.tsv`` file contributes its first column
    (the header row ``sentence...`` is skipped); any other file, whole lines."""
    texts: list[str] = []
    for p in map(Path, paths):
        if not p.is_file():
            raise ValueError(f"corpus file {p}: not found")
        try:
            if p.suffix == ".tsv":
                csv.field_size_limit(sys.maxsize)
                with open(p, newline="", encoding="utf-8") as f:
                    reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
                    header = next(reader, None)
                    rows: Iterable[list[str]] = reader
                    if header and header[0].strip().lower() not in ("sentence", "sentence_a", "text"):
                        rows = [header, *reader]
                    texts += [r[0].strip() for r in rows if r and r[0].strip()]
            else:
                with open(p, encoding="utf-8") as f:
                    texts += [line.strip() for line in f if line.strip()]
        except UnicodeDecodeError as exc:
            raise ValueError(f"corpus file {p}: not UTF-8 text ({exc.reason})") from None
    return texts


def tokenize_corpus(bundle: EdgeBundle, texts: list[str], max_length: int) -> list[np.ndarray]:
    """Content ids of each text (the edge's tokenizer, no special tokens), cut into pieces of
    at most ``max_length - 2`` tokens so nothing is dropped; empty texts are skipped."""
    if max_length < 3:
        raise ValueError(f"max_length must be at least 3, got {max_length}")
    room = max_length - 2
    out: list[np.ndarray] = []
    for enc in bundle.text_tokenizer().encode_batch(texts, add_special_tokens=False):
        ids = np.asarray(enc.ids, dtype=np.int32)
        out += [ids[s : s + room] for s in range(0, ids.size, room)]
    return out


@dataclass
class MLMBatch:
    """One padded batch, numpy. Flat positions index the (B, L) grid row-major."""

    input_ids: np.ndarray        # (B, L) int64: what the model reads (dchi-text), or the ids
                                 # whose frozen rows fill the non-perturbed positions (embedding)
    attention_mask: np.ndarray   # (B, L) int64
    embeds: np.ndarray | None    # (R, n) float32 perturbed rows (dchi-embedding), else None
    embed_pos: np.ndarray | None  # (R,) flat positions of those rows
    masked_pos: np.ndarray       # (P,) flat positions predicted
    targets: np.ndarray          # (P,) ids, or (P, K) ids for Prob MLM
    original: np.ndarray         # (P,) the original token at each masked position
    replacement: np.ndarray      # (P,) REPLACE_MASK / _KEEP / _RANDOM
    n_tokens: int                # non-pad tokens the model reads

    @property
    def shape(self) -> tuple[int, int]:
        return self.input_ids.shape


class BatchPrivatizer:
    """The task's mechanism over whole batches: the exact ``shared`` code, batched.

    ``search="numpy"`` is ``DChiText.privatize_ids`` itself; ``search="torch"`` draws the
    same noise with the same ``shared`` code and finds the same exact nearest token with
    the candidate GEMM in torch (``models.nets.torch_nearest``; on ``device``).
    """

    def __init__(self, bundle: EdgeBundle, mechanism: str, eta: float, search: str = "numpy",
                 device=None):
        if mechanism not in registry.dchi_names():  # pretraining simulates dχ
            raise ValueError(f"unknown mechanism {mechanism!r} for pretraining "
                             f"(choose {' or '.join(registry.dchi_names())})")
        if search not in ("numpy", "torch"):
            raise ValueError(f"search must be numpy or torch, got {search!r}")
        self.bundle = bundle
        self.mechanism = mechanism
        self.text = DChiText(bundle, eta)  # also the exact nearest-regular-token index
        self.embedding = DChiEmbedding(eta)
        self.eta = self.text.eta
        self._search = self.text.index.search
        if search == "torch":

            self._search = TorchExactNearest(self.text.exact, device or "cpu").search

    @property
    def mechanism_object(self) -> DChiText | DChiEmbedding:
        return self.text if self.sends_ids else self.embedding

    @property
    def sends_ids(self) -> bool:
        """The edge sends token ids (dχ-text), else noisy embeddings (dχ-embedding)."""
        return self.mechanism == self.text.name

    def privatize_ids(self, ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """DChiText.privatize_ids: nearest regular token to phi(x) + N (§3.2.4)."""
        noisy = self.text.noisy_embeddings(ids, rng)
        if noisy.shape[0] == 0:
            return np.empty(0, dtype=np.int64)
        return self._search(noisy)

    def perturb(self, ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """DChiEmbedding.privatize of the frozen rows: phi(x) + N, float32 (§3.2.3)."""
        rows = self.bundle.embeddings[np.asarray(ids, dtype=np.int64)]
        return self.embedding.privatize(rows, rng)

    def nearest(self, rows: np.ndarray) -> np.ndarray:
        """Exact nearest regular token of each perturbed row."""
        return self._search(rows)

    def privatize_content(self, ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """What the edge sends for these content ids: ids (dchi-text) or rows (dchi-embedding)."""
        if self.sends_ids:
            return self.privatize_ids(ids, rng)
        return self.perturb(ids, rng)


def build_batch(seqs: list[np.ndarray], privatizer: BatchPrivatizer, objective: str,
                rng: np.random.Generator, *, mask_rate: float = 0.15, max_predictions: int = 20,
                prob_k: int = 10) -> MLMBatch:
    """Privatize, mask and target one batch of content-id sequences (see module docstring).

    The first draw from ``rng`` is the privatization of all content tokens concatenated in
    order, so ``privatizer.privatize_content(np.concatenate(seqs), same_rng)`` reproduces it.
    """
    bundle = privatizer.bundle
    sp = bundle.special_ids
    lengths = np.array([s.size for s in seqs], dtype=np.int64)
    b, width = len(seqs), int(lengths.max()) + 2
    content = np.concatenate(seqs).astype(np.int64)

    # grid of original ids: [CLS] content [SEP] [PAD]...
    orig = np.full((b, width), sp["pad"], dtype=np.int64)
    col = np.arange(width)[None, :]
    is_content = (col >= 1) & (col <= lengths[:, None])
    orig[is_content] = content
    orig[:, 0] = sp["cls"]
    orig[np.arange(b), lengths + 1] = sp["sep"]
    attention = (col <= lengths[:, None] + 1).astype(np.int64)
    content_flat = np.flatnonzero(is_content.ravel())  # flat positions, same order as content

    # 1. privatize every content token, the edge's way
    private = privatizer.privatize_content(content, rng)
    # 2. BERT masking among content positions ([UNK] is privatized like the edge does, but
    #    never predicted: no special token is a target)
    masked = choose_masked_positions(is_content & (orig != sp["unk"]), mask_rate,
                                     max_predictions, rng)
    masked_pos = np.flatnonzero(masked.ravel())
    replacement = choose_replacements(masked_pos.size, rng)
    n_random = int((replacement == REPLACE_RANDOM).sum())
    random_ids = bundle.regular_ids[rng.integers(0, bundle.regular_ids.size, n_random)]
    slot = np.searchsorted(content_flat, masked_pos)  # index of each masked position in content
    original = content[slot]

    input_ids = orig.copy().ravel()
    embeds = embed_pos = None
    if privatizer.sends_ids:
        input_ids[content_flat] = private
        input_ids[masked_pos[replacement == REPLACE_MASK]] = sp["mask"]
        input_ids[masked_pos[replacement == REPLACE_RANDOM]] = random_ids
        vanilla = private[slot]
    else:
        rows = private.copy()
        rnd = replacement == REPLACE_RANDOM
        if n_random:  # a random token, privatized like any input token
            rows[slot[rnd]] = privatizer.perturb(random_ids, rng)
        keep = np.ones(content.size, dtype=bool)
        keep[slot[replacement == REPLACE_MASK]] = False  # [MASK] reads the frozen E[MASK]
        input_ids[masked_pos[replacement == REPLACE_MASK]] = sp["mask"]
        input_ids[masked_pos[rnd]] = random_ids  # not read (the row is overwritten)
        embeds, embed_pos = rows[keep], content_flat[keep]
        vanilla = None
    # 3. targets
    if objective == "denoising":
        targets = original
    elif objective == "vanilla":
        targets = vanilla if vanilla is not None else privatizer.nearest(private[slot])
    elif objective == "prob":
        k = int(prob_k)
        targets = privatizer.privatize_ids(np.repeat(original, k), rng).reshape(-1, k)
    else:
        raise ValueError(f"unknown objective {objective!r} (choose vanilla, prob or denoising)")
    return MLMBatch(
        input_ids=input_ids.reshape(b, width), attention_mask=attention, embeds=embeds,
        embed_pos=embed_pos, masked_pos=masked_pos, targets=np.asarray(targets, dtype=np.int64),
        original=original, replacement=replacement, n_tokens=int(attention.sum()),
    )


def epoch_order(n: int, entropy: int, epoch: int) -> np.ndarray:
    """The shuffled order of the corpus in ``epoch``: a pure function of (entropy, epoch)."""
    return np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(0, epoch))).permutation(n)


def step_rng(entropy: int, step: int) -> np.random.Generator:
    """The generator of step ``step`` (noise, masks): independent per step, so a resumed
    run and a prefetching loader draw exactly what an uninterrupted run draws."""
    return np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(1, step)))


def batch_indices(n: int, batch_size: int, entropy: int, step: int) -> np.ndarray:
    """Corpus indices of step ``step`` (0-based): consecutive slices of each epoch's order;
    the last batch of an epoch may be smaller."""
    per_epoch = -(-n // batch_size)
    epoch, i = divmod(step, per_epoch)
    return epoch_order(n, entropy, epoch)[i * batch_size : (i + 1) * batch_size]
