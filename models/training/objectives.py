"""The fine-tuning loss, with the levers that need the public text the server trains on.

L = (1 − α)·CE(task) + α·τ²·KL(p_teacher,τ ‖ p_student,τ) + λ·L_denoise + ρ·L_rtd

* ``L_denoise`` (Qu et al. 2021 §3.4's Denoising MLM folded into fine-tuning): at a random
  ``denoise_rate`` share of the payload positions, predict the original token from the
  privatized sequence through the tied, frozen word-embedding table (a BERT-style transform
  and bias on top). Needs the original ids: public text only.
* ``L_rtd``, replaced-token detection (Clark et al. 2020, ELECTRA §3): at every payload
  position, binary cross-entropy of "did the mechanism change this token?" from the
  privatized sequence (a linear head). Needs the original ids: public text only.
* distillation (Hinton et al. 2015): soft targets of a teacher that read the original text,
  temperature τ. Needs the original text: public text only.

Neither head is part of the served classifier: :class:`Objective` wraps it for training only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.nets.classifiers import EmbeddingClassifier, TokenClassifier, classification_loss


class DenoiseHead(nn.Module):
    """h -> LayerNorm(GELU(W h + b)) · E^T + bias over the vocabulary (E frozen, shared with
    the classifier's word embeddings: BERT's tied MLM decoder)."""

    def __init__(self, word_embeddings: nn.Embedding, hidden: int, eps: float = 1e-12):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)
        self.word_embeddings = [word_embeddings]  # a list: not a submodule, no second copy
        self.bias = nn.Parameter(torch.zeros(word_embeddings.weight.shape[0]))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = self.norm(F.gelu(self.dense(h)))
        return h @ self.word_embeddings[0].weight.T.to(h.dtype) + self.bias


class Objective(nn.Module):
    """Training-time wrapper: ``forward(batch, targets, originals, teacher)`` -> (loss, logits,
    parts) where ``parts`` holds each term's value for logging."""

    rtd_head: nn.Linear  # with a replaced-token detection weight
    denoise_head: DenoiseHead  # with a denoising weight

    def __init__(self, classifier: nn.Module, *, denoise: float = 0.0, denoise_rate: float = 0.5,
                 distill: float = 0.0, temperature: float = 2.0, rtd: float = 0.0):
        super().__init__()
        if denoise < 0 or not 0 < denoise_rate <= 1:
            raise ValueError(f"denoise weight must be >= 0 and its rate in (0, 1], got "
                             f"{denoise}, {denoise_rate}")
        if not 0 <= distill <= 1 or temperature <= 0:
            raise ValueError(f"distillation weight must be in [0, 1] and its temperature > 0, "
                             f"got {distill}, {temperature}")
        if rtd < 0:
            raise ValueError(f"replaced-token detection weight must be >= 0, got {rtd}")
        self.classifier = classifier
        self.rtd = float(rtd)
        self.denoise, self.denoise_rate = float(denoise), float(denoise_rate)
        self.distill, self.temperature = float(distill), float(temperature)
        if not (self.denoise or self.rtd):
            return
        if not isinstance(classifier, TokenClassifier | EmbeddingClassifier):
            raise ValueError("the denoising and replaced-token losses need a BERT classifier")
        if self.rtd:
            self.rtd_head = nn.Linear(classifier.bert.config.hidden_size, 1)
        if self.denoise:
            bert = classifier.bert
            self.denoise_head = DenoiseHead(bert.embeddings.word_embeddings,
                                            bert.config.hidden_size,
                                            getattr(bert.config, "layer_norm_eps", 1e-12))

    def forward(self, batch: dict, targets: torch.Tensor, originals: torch.Tensor | None = None,
                teacher: torch.Tensor | None = None):
        clf = self.classifier
        parts: dict[str, torch.Tensor] = {}
        if (self.denoise or self.rtd) and originals is not None:
            assert isinstance(clf, TokenClassifier | EmbeddingClassifier)  # as __init__ checked
            out = clf.encode(**batch)
            logits = clf._logits(out, batch["attention_mask"])
            if self.denoise:
                parts["denoise"] = self._denoise_loss(out.last_hidden_state, originals)
            if self.rtd:
                parts["rtd"] = self._rtd_loss(out.last_hidden_state, batch["input_ids"],
                                              originals)
        else:
            logits = clf(**batch)
        task = classification_loss(logits, targets)
        parts["task"] = task
        loss = task
        if self.distill and teacher is not None:
            t = self.temperature
            kd = F.kl_div(F.log_softmax(logits.float() / t, dim=-1), teacher.float(),
                          reduction="batchmean") * t * t
            parts["distill"] = kd
            loss = (1 - self.distill) * task + self.distill * kd
        if "denoise" in parts:
            loss = loss + self.denoise * parts["denoise"]
        if "rtd" in parts:
            loss = loss + self.rtd * parts["rtd"]
        return loss, logits, parts

    def _rtd_loss(self, hidden: torch.Tensor, ids: torch.Tensor,
                  originals: torch.Tensor) -> torch.Tensor:
        """Binary cross-entropy of "replaced" (privatized id != original id) at every
        position that has an original (``originals`` −100 elsewhere)."""
        mask = originals >= 0
        if not bool(mask.any()):
            return hidden.sum() * 0.0
        replaced = (ids[mask] != originals[mask]).float()
        logit = self.rtd_head(hidden[mask]).squeeze(-1)
        return F.binary_cross_entropy_with_logits(logit.float(), replaced)

    def _denoise_loss(self, hidden: torch.Tensor, originals: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the original ids (``originals`` (B, T), −100 where there is none)
        at a random ``denoise_rate`` share of the positions that have one."""
        mask = originals >= 0
        if self.denoise_rate < 1:
            mask &= torch.rand(originals.shape, device=originals.device) < self.denoise_rate
        if not bool(mask.any()):
            return hidden.sum() * 0.0
        logits = self.denoise_head(hidden[mask])
        return F.cross_entropy(logits.float(), originals[mask])


def teacher_targets(probs, temperature: float):
    """Teacher probabilities re-tempered: softmax(log p / τ) (what the KL term compares)."""
    logp = torch.log(torch.as_tensor(probs, dtype=torch.float32).clamp(min=1e-12))
    return torch.softmax(logp / temperature, dim=-1)
