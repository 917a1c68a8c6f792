"""One classifier per payload kind (DESIGN.md "Models"; Qu et al. 2021 §3.3).

* :class:`TokenClassifier`: BERT over privatized token ids (``dchi-text``, ``none``).
* :class:`EmbeddingClassifier`: BERT over perturbed ``inputs_embeds`` (``dchi-embedding``):
  the payload rows replace the word embeddings; [CLS]/[SEP] rows come from the frozen
  table, and BERT adds its own position and segment embeddings and LayerNorm.
* :class:`VectorMLP`: an MLP over the sentence vector (``laplace``, ``texthide``) or the
  bits as 0/1 floats (``ome``); hidden sizes (768, 768, 768) as in TextHide §4.

The word-embedding table is the edge's: frozen (no gradient) in both BERT classifiers.
Every module's ``forward`` takes the keys of :func:`models.data.collate` by name
(``input_names``) and returns logits (B, C).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from models.backbone import freeze_word_embeddings
from models.data import kind_of

POOLINGS = ("mean", "cls")


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``hidden`` (B, T, d) over positions where ``attention_mask`` is 1."""
    m = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)


def classification_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy; ``targets`` int64 (B,) class indices or float (B, C) soft labels
    (TextHide mixed labels: -Σ_c y_c log softmax(logits)_c, Huang et al. 2020 §3)."""
    logits = logits.float()
    if targets.dtype in (torch.int64, torch.int32):
        return F.cross_entropy(logits, targets.long())
    return -(targets.float() * F.log_softmax(logits, dim=-1)).sum(dim=-1).mean()


class _BertClassifier(nn.Module):
    """BERT encoder, pooling, dropout, linear head."""

    input_names: tuple[str, ...] = ()

    def __init__(self, bert, num_labels: int, pooling: str = "mean"):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        if num_labels < 2:
            raise ValueError(f"a classifier needs at least 2 labels, got {num_labels}")
        self.bert = bert
        self.pooling = pooling
        if pooling == "mean":
            self.bert.pooler = None  # unused: keep no parameters without gradient
        elif getattr(self.bert, "pooler", None) is None:
            raise ValueError("pooling 'cls' needs a BERT with a pooler layer")
        freeze_word_embeddings(self.bert)
        self.dropout = nn.Dropout(getattr(bert.config, "hidden_dropout_prob", 0.1))
        self.head = nn.Linear(bert.config.hidden_size, num_labels)
        self.num_labels = num_labels

    def _logits(self, out, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.pooling == "mean":
            pooled = mean_pool(out.last_hidden_state, attention_mask)
        else:  # BERT's own [CLS] pooler, as BertForSequenceClassification
            pooled = out.pooler_output
        return self.head(self.dropout(pooled))


class TokenClassifier(_BertClassifier):
    """BERT over token ids ``[CLS] ids [SEP] (ids [SEP])``."""

    input_names = ("input_ids", "attention_mask", "token_type_ids")

    def forward(self, input_ids, attention_mask, token_type_ids) -> torch.Tensor:
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                        token_type_ids=token_type_ids)
        return self._logits(out, attention_mask)


class EmbeddingClassifier(_BertClassifier):
    """BERT over perturbed token embeddings; special rows from the frozen table."""

    input_names = ("input_ids", "token_rows", "row_mask", "attention_mask", "token_type_ids")

    def forward(self, input_ids, token_rows, row_mask, attention_mask,
                token_type_ids) -> torch.Tensor:
        table_rows = self.bert.embeddings.word_embeddings(input_ids)
        embeds = torch.where(row_mask.unsqueeze(-1), token_rows.to(table_rows.dtype), table_rows)
        out = self.bert(inputs_embeds=embeds, attention_mask=attention_mask,
                        token_type_ids=token_type_ids)
        return self._logits(out, attention_mask)


class VectorMLP(nn.Module):
    """MLP over a payload vector, inputs standardised by statistics of the training payloads."""

    input_names = ("features",)
    MIN_STD = 1e-3  # below this a training coordinate counts as constant (scale 1)

    def __init__(self, in_dim: int, num_labels: int, hidden: Sequence[int] = (768, 768, 768),
                 dropout: float = 0.1):
        super().__init__()
        if num_labels < 2:
            raise ValueError(f"a classifier needs at least 2 labels, got {num_labels}")
        self.in_dim, self.num_labels, self.hidden = int(in_dim), int(num_labels), list(hidden)
        self.register_buffer("shift", torch.zeros(self.in_dim))
        self.register_buffer("scale", torch.ones(self.in_dim))
        layers: list[nn.Module] = []
        d = self.in_dim
        for h in self.hidden:
            layers += [nn.Linear(d, h), nn.ReLU(), nn.Dropout(dropout)]
            d = h
        layers.append(nn.Linear(d, self.num_labels))
        self.net = nn.Sequential(*layers)

    @torch.no_grad()
    def fit_input_scaling(self, features: torch.Tensor) -> None:
        """Set the per-coordinate mean and standard deviation from training payloads.

        A coordinate (nearly) constant in training keeps scale 1, as scikit-learn's
        StandardScaler does: dividing by a tiny deviation would multiply a value first
        seen at inference (an OME bit never set in training) by up to 1e6.
        """
        x = features.float()
        self.shift.copy_(x.mean(dim=0))
        if x.shape[0] < 2:
            self.scale.fill_(1.0)
            return
        std = x.std(dim=0)
        self.scale.copy_(torch.where(std < self.MIN_STD, torch.ones_like(std), std))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net((features.to(self.shift.dtype) - self.shift) / self.scale)


def build_classifier(mechanism: str, num_labels: int, *, bert=None, feature_dim: int | None = None,
                     pooling: str = "mean", hidden: Sequence[int] = (768, 768, 768),
                     dropout: float = 0.1) -> nn.Module:
    """The classifier for payloads of ``mechanism``: pass ``bert`` (a transformers BertModel)
    for token kinds, ``feature_dim`` for vector kinds."""
    kind = kind_of(mechanism)
    if kind == "vector":
        if not feature_dim:
            raise ValueError(f"{mechanism}: the MLP needs the payload dimension")
        return VectorMLP(feature_dim, num_labels, hidden, dropout)
    if bert is None:
        raise ValueError(f"{mechanism}: a BERT backbone is needed")
    cls = TokenClassifier if kind == "tokens" else EmbeddingClassifier
    return cls(bert, num_labels, pooling)


def architecture(module: nn.Module) -> dict:
    """What :func:`classifier_from_architecture` needs to rebuild ``module`` (no weights)."""
    if isinstance(module, VectorMLP):
        return {"class": "VectorMLP", "in_dim": module.in_dim, "num_labels": module.num_labels,
                "hidden": module.hidden, "dropout": module.net[2].p if module.hidden else 0.0}
    if isinstance(module, _BertClassifier):
        return {"class": type(module).__name__, "num_labels": module.num_labels,
                "pooling": module.pooling, "bert_config": module.bert.config.to_dict()}
    raise TypeError(f"not a privbert classifier: {type(module).__name__}")


def classifier_from_architecture(arch: dict) -> nn.Module:
    """An untrained module of the architecture ``arch`` (weights are loaded afterwards)."""
    name = arch.get("class")
    if name == "VectorMLP":
        return VectorMLP(arch["in_dim"], arch["num_labels"], arch["hidden"], arch["dropout"])
    if name in ("TokenClassifier", "EmbeddingClassifier"):
        from transformers import BertConfig, BertModel

        config = BertConfig.from_dict(dict(arch["bert_config"]))
        bert = BertModel(config, add_pooling_layer=arch["pooling"] == "cls")
        cls = TokenClassifier if name == "TokenClassifier" else EmbeddingClassifier
        return cls(bert, arch["num_labels"], arch["pooling"])
    raise ValueError(f"unknown classifier class {name!r}")
