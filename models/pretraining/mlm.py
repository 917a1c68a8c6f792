"""Masked language modelling for privacy-adaptive pretraining (Qu et al. 2021 §3.4).

Pure functions (numpy) choose the masked positions and replace them BERT-style
(Devlin et al. 2019: 80% [MASK], 10% kept, 10% a random token); the three
objectives differ only in the target of each masked position:

- Vanilla MLM (Eq. 5): the privatized token ŵ at that position;
- Prob MLM (Eq. 6): K privatizations of the original token; the soft target is
  their empirical frequency count(w, Ŵ)/|Ŵ|;
- Denoising MLM (Eq. 7): the original token w.

``MLMHead`` is BERT's prediction head (dense + GELU + LayerNorm, then a decoder)
with the decoder weight TIED to the frozen word-embedding table and a trainable
bias; logits are computed only at the masked positions.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

OBJECTIVES = ("vanilla", "prob", "denoising")

# what happens to the input at a masked position (BERT's 80/10/10)
REPLACE_MASK, REPLACE_KEEP, REPLACE_RANDOM = 0, 1, 2


class MLMHead(nn.Module):
    """BERT's MLM head over hidden states, decoder tied to ``word_embeddings.weight``."""

    def __init__(self, word_embeddings: nn.Embedding, hidden_size: int, layer_norm_eps: float = 1e-12):
        super().__init__()
        vocab, dim = word_embeddings.weight.shape
        self.dense = nn.Linear(hidden_size, dim)
        self.layer_norm = nn.LayerNorm(dim, eps=layer_norm_eps)
        self.decoder = nn.Linear(dim, vocab, bias=False)
        self.decoder.weight = word_embeddings.weight  # tied: the very same Parameter
        self.bias = nn.Parameter(torch.zeros(vocab))

    def reset_parameters(self, std: float = 0.02) -> None:
        """BERT's initialisation (normal(0, std) dense, LayerNorm 1/0, zero bias)."""
        nn.init.normal_(self.dense.weight, std=std)
        nn.init.zeros_(self.dense.bias)
        nn.init.ones_(self.layer_norm.weight)
        nn.init.zeros_(self.layer_norm.bias)
        nn.init.zeros_(self.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(P, hidden) -> logits (P, vocab)."""
        h = self.layer_norm(F.gelu(self.dense(hidden)))
        return self.decoder(h) + self.bias

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Everything but the tied decoder weight (that one is the bundle's table)."""
        return {k: v for k, v in self.state_dict().items() if k != "decoder.weight"}


# -- masking (numpy) ------------------------------------------------------------------------
def predictions_per_sequence(lengths: np.ndarray, mask_rate: float, max_predictions: int) -> np.ndarray:
    """BERT's count: min(max_predictions, max(1, round(length * mask_rate))), 0 for empty."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = np.maximum(1, np.rint(lengths * mask_rate).astype(np.int64))
    n = np.minimum(n, max_predictions)
    return np.where(lengths > 0, np.minimum(n, lengths), 0)


def choose_masked_positions(candidates: np.ndarray, mask_rate: float, max_predictions: int,
                            rng: np.random.Generator) -> np.ndarray:
    """Boolean (B, L): which positions are predicted.

    ``candidates`` (B, L) bool marks the positions that may be masked (content tokens,
    never [CLS]/[SEP]/[PAD]); each row gets ``predictions_per_sequence`` of them,
    uniformly without replacement.
    """
    candidates = np.asarray(candidates, dtype=bool)
    counts = predictions_per_sequence(candidates.sum(axis=1), mask_rate, max_predictions)
    keys = rng.random(candidates.shape)
    keys[~candidates] = np.inf
    rank = np.argsort(np.argsort(keys, axis=1, kind="stable"), axis=1, kind="stable")
    return candidates & (rank < counts[:, None])


def choose_replacements(count: int, rng: np.random.Generator,
                        mask_prob: float = 0.8, keep_prob: float = 0.1) -> np.ndarray:
    """(count,) of REPLACE_MASK (80%), REPLACE_KEEP (10%), REPLACE_RANDOM (10%)."""
    u = rng.random(count)
    out = np.full(count, REPLACE_RANDOM, dtype=np.int8)
    out[u < mask_prob + keep_prob] = REPLACE_KEEP
    out[u < mask_prob] = REPLACE_MASK
    return out


# -- targets and losses ---------------------------------------------------------------------
def empirical_distribution(samples: np.ndarray, vocab_size: int) -> np.ndarray:
    """Prob MLM's soft target (Eq. 6): row i = count(w, Ŵ_i) / |Ŵ_i| over the vocabulary.

    ``samples`` (P, K) token ids -> (P, vocab_size) float32, each row sums to 1.
    """
    samples = np.asarray(samples, dtype=np.int64)
    p, k = samples.shape
    out = np.zeros((p, vocab_size), dtype=np.float32)
    np.add.at(out, (np.repeat(np.arange(p), k), samples.ravel()), 1.0 / k)
    return out


def mlm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the masked positions.

    ``targets`` (P,) ids: Eq. 5 / Eq. 7 (one-hot target). ``targets`` (P, K) ids: Eq. 6,
    -Σ_w count(w, Ŵ)/K · log p(w) = -(1/K) Σ_k log p(ŵ_k), the same sum without building
    the (P, vocab) frequency matrix.
    """
    logp = F.log_softmax(logits.float(), dim=-1)
    if targets.ndim == 1:
        return F.nll_loss(logp, targets)
    return -logp.gather(1, targets).mean()
