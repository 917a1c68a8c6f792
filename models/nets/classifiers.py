"""One classifier per payload kind (ARCHITECTURE.md "Models"; Qu et al. 2021 §3.3).

* :class:`TokenClassifier`: BERT over privatized token ids (``dchi-text``, ``none``).
* :class:`EmbeddingClassifier`: BERT over perturbed ``inputs_embeds`` (``dchi-embedding``):
  the payload rows replace the word embeddings; [CLS]/[SEP] rows come from the frozen
  table, and BERT adds its own position and segment embeddings and LayerNorm.
* :class:`VectorMLP`: an MLP over the sentence vector (``laplace``, ``texthide``) or the
  bits as 0/1 floats (``ome``); hidden sizes (768, 768, 768) as in TextHide §4.

The word-embedding table is the edge's: frozen (no gradient) in both BERT classifiers.
Every module's ``forward`` takes the keys of :func:`models.training.data.collate` by name
(``input_names``) and returns logits (B, C).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from models.nets.backbone import freeze_word_embeddings
from models.training.data import kind_of

if TYPE_CHECKING:
    from transformers import BertModel

POOLINGS = ("mean", "cls")


class ContextDenoiser(Protocol):
    """What a classifier reads of ``models.attacks.denoiser.Denoiser`` (named here by what
    it offers: that module imports this room)."""

    def describe(self) -> dict[str, Any]: ...

    def is_text(self, input_ids: torch.Tensor) -> torch.Tensor: ...

    def soft_embedding(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                       token_type_ids: torch.Tensor | None = None) -> torch.Tensor: ...


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
    bert: BertModel

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
    """BERT over token ids ``[CLS] ids [SEP] (ids [SEP])``.

    With a channel posterior (``models.training.posterior``, ``dchi-text``): each id y is read as
    φ(y) + a ⊙ (E[φ(x) | y] − φ(y)), the posterior-mean embedding mixed in by a learned gate
    a = sigmoid(g) per dimension (g starts at ``gate_init``). The table is a frozen buffer
    saved with the weights.

    ``contextual``: the same gate over E[φ(x) | y, context] of a frozen
    ``models.attacks.denoiser.Denoiser`` (:meth:`attach_denoiser`), which shares the word table and
    is saved beside the weights (``denoiser.safetensors``), not in them.
    """

    input_names = ("input_ids", "attention_mask", "token_type_ids")
    posterior_table: torch.Tensor  # a buffer, with a posterior
    denoiser: ContextDenoiser | None

    def __init__(self, bert, num_labels: int, pooling: str = "mean",
                 posterior_table=None, gate_init: float = 0.0, contextual: bool = False):
        super().__init__(bert, num_labels, pooling)
        if contextual and posterior_table is not None:
            raise ValueError("a classifier reads either the context-free posterior table or "
                             "a contextual denoiser, not both")
        self.has_posterior = posterior_table is not None
        self.contextual = bool(contextual)
        self.denoiser = None
        if self.contextual:
            self.posterior_gate = nn.Parameter(torch.full(
                (bert.embeddings.word_embeddings.weight.shape[1],), float(gate_init)))
        if self.has_posterior:
            table = torch.as_tensor(posterior_table, dtype=torch.float32)
            if table.shape != bert.embeddings.word_embeddings.weight.shape:
                raise ValueError(f"posterior table {tuple(table.shape)} does not match the "
                                 f"word embeddings {tuple(bert.embeddings.word_embeddings.weight.shape)}")
            self.register_buffer("posterior_table", table)
            self.posterior_gate = nn.Parameter(torch.full((table.shape[1],), float(gate_init)))

    def attach_denoiser(self, denoiser) -> None:
        """Read through ``denoiser`` (frozen, eval mode, sharing this model's word table)."""
        if not self.contextual:
            raise ValueError("this classifier was not built to read a denoiser")
        mine = self.bert.embeddings.word_embeddings
        theirs = denoiser.bert.embeddings.word_embeddings
        if theirs is not mine:
            if theirs.weight.shape != mine.weight.shape or not torch.equal(
                    theirs.weight.detach().cpu(), mine.weight.detach().cpu()):
                raise ValueError("the denoiser was trained on another word-embedding table")
            denoiser.bert.embeddings.word_embeddings = mine
        for p in denoiser.parameters():
            if p is not mine.weight:
                p.requires_grad_(False)
        denoiser.frozen = True
        self.denoiser = denoiser.eval()

    def input_embeddings(self, input_ids: torch.Tensor, attention_mask=None,
                         token_type_ids=None) -> torch.Tensor | None:
        """The rows BERT reads for ``input_ids`` (None: its own word embeddings)."""
        if self.contextual:
            if self.denoiser is None:
                raise RuntimeError("the classifier reads a contextual denoiser; none attached")
            own = self.bert.embeddings.word_embeddings(input_ids)
            with torch.no_grad():
                post = self.denoiser.soft_embedding(input_ids, attention_mask,
                                                    token_type_ids).to(own.dtype)
                text = self.denoiser.is_text(input_ids).unsqueeze(-1)
            mixed = own + torch.sigmoid(self.posterior_gate) * (post - own)
            return torch.where(text, mixed, own)
        if not self.has_posterior:
            return None
        own = self.bert.embeddings.word_embeddings(input_ids)
        post = F.embedding(input_ids, self.posterior_table)
        return own + torch.sigmoid(self.posterior_gate) * (post - own)

    def encode(self, input_ids, attention_mask, token_type_ids):
        embeds = self.input_embeddings(input_ids, attention_mask, token_type_ids)
        if embeds is None:
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids)
        return self.bert(inputs_embeds=embeds, attention_mask=attention_mask,
                         token_type_ids=token_type_ids)

    def forward(self, input_ids, attention_mask, token_type_ids) -> torch.Tensor:
        return self._logits(self.encode(input_ids, attention_mask, token_type_ids),
                            attention_mask)


class EmbeddingClassifier(_BertClassifier):
    """BERT over perturbed token embeddings; special rows from the frozen table.

    With a channel prior (``models.training.posterior``, ``dchi-embedding``): each payload row z is
    read as z + a ⊙ (E[φ(x) | z] − z), with the exact posterior
    P(x | z) ∝ P(x)·exp(−η‖z − φ(x)‖) over the regular tokens (Qu et al. §3.2.3's density)
    and a = sigmoid(g) a learned gate per dimension.
    """

    input_names = ("input_ids", "token_rows", "row_mask", "attention_mask", "token_type_ids")
    log_prior: torch.Tensor  # a buffer, with a posterior

    def __init__(self, bert, num_labels: int, pooling: str = "mean", log_prior=None,
                 eta: float | None = None, gate_init: float = 0.0):
        super().__init__(bert, num_labels, pooling)
        self.has_posterior = log_prior is not None
        if self.has_posterior:
            if eta is None or not eta > 0:
                raise ValueError("the embedding posterior needs the mechanism's eta")
            lp = torch.as_tensor(log_prior, dtype=torch.float32)
            if lp.shape != (bert.embeddings.word_embeddings.weight.shape[0],):
                raise ValueError("the log prior needs one value per vocabulary id")
            self.register_buffer("log_prior", lp)
            self.eta = float(eta)
            self.posterior_gate = nn.Parameter(torch.full((bert.config.hidden_size,),
                                                          float(gate_init)))

    def posterior_mean(self, rows: torch.Tensor) -> torch.Tensor:
        """E[φ(x) | z] for rows z (..., n): the exact posterior over the tokens with a
        finite log prior, computed in float32 (distances by the expanded square)."""
        table = self.bert.embeddings.word_embeddings.weight
        keep = torch.isfinite(self.log_prior)
        t, lp = table[keep].detach().float(), self.log_prior[keep]
        z = rows.reshape(-1, rows.shape[-1]).float()
        d2 = (z * z).sum(-1, keepdim=True) - 2 * z @ t.T + (t * t).sum(-1)
        logits = lp - self.eta * d2.clamp(min=0).sqrt()
        mean = torch.softmax(logits, dim=-1) @ t
        return mean.reshape(rows.shape).to(rows.dtype)

    def encode(self, input_ids, token_rows, row_mask, attention_mask, token_type_ids):
        table_rows = self.bert.embeddings.word_embeddings(input_ids)
        rows = token_rows.to(table_rows.dtype)
        if self.has_posterior:
            with torch.no_grad():  # nothing to learn in it: the table and prior are frozen
                post = self.posterior_mean(rows)
            rows = rows + torch.sigmoid(self.posterior_gate) * (post - rows)
        embeds = torch.where(row_mask.unsqueeze(-1), rows, table_rows)
        return self.bert(inputs_embeds=embeds, attention_mask=attention_mask,
                         token_type_ids=token_type_ids)

    def forward(self, input_ids, token_rows, row_mask, attention_mask,
                token_type_ids) -> torch.Tensor:
        out = self.encode(input_ids, token_rows, row_mask, attention_mask, token_type_ids)
        return self._logits(out, attention_mask)


class VectorMLP(nn.Module):
    """MLP over a payload vector, inputs standardised by statistics of the training payloads."""

    input_names = ("features",)
    shift: torch.Tensor  # buffers: the training payloads' mean and deviation
    scale: torch.Tensor
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
                     dropout: float = 0.1, posterior=None, regular_ids=None,
                     denoiser=None) -> nn.Module:
    """The classifier for payloads of ``mechanism``: pass ``bert`` (a transformers BertModel)
    for token kinds, ``feature_dim`` for vector kinds. ``posterior``: a
    ``models.training.posterior.ChannelPosterior`` of the same mechanism (dχ only), read as input;
    ``dchi-embedding`` then needs the bundle's ``regular_ids`` (the posterior's support).
    ``denoiser``: a ``models.attacks.denoiser.Denoiser`` read instead of the posterior table."""
    kind = kind_of(mechanism)
    if kind == "vector":
        if not feature_dim:
            raise ValueError(f"{mechanism}: the MLP needs the payload dimension")
        return VectorMLP(feature_dim, num_labels, hidden, dropout)
    if bert is None:
        raise ValueError(f"{mechanism}: a BERT backbone is needed")
    if posterior is not None and posterior.mechanism != mechanism:
        raise ValueError(f"a {posterior.mechanism} posterior cannot read {mechanism} payloads")
    if denoiser is not None and mechanism != denoiser.meta.get("mechanism"):
        raise ValueError(f"a {denoiser.meta.get('mechanism')} denoiser cannot read "
                         f"{mechanism} payloads")
    if kind == "tokens" and denoiser is not None:
        model = TokenClassifier(bert, num_labels, pooling, contextual=True)
        model.attach_denoiser(denoiser)
        return model
    if kind == "tokens":
        table = None if posterior is None else posterior.mean_table(
            bert.embeddings.word_embeddings.weight.detach().cpu().numpy())
        return TokenClassifier(bert, num_labels, pooling, posterior_table=table)
    if posterior is None:
        return EmbeddingClassifier(bert, num_labels, pooling)
    if regular_ids is None:
        raise ValueError("the dchi-embedding posterior needs the bundle's regular token ids")
    return EmbeddingClassifier(bert, num_labels, pooling, posterior.log_prior(regular_ids),
                               posterior.eta)


def architecture(module: nn.Module) -> dict[str, Any]:
    """What :func:`classifier_from_architecture` needs to rebuild ``module`` (no weights)."""
    if isinstance(module, VectorMLP):
        return {"class": "VectorMLP", "in_dim": module.in_dim, "num_labels": module.num_labels,
                "hidden": module.hidden, "dropout": module.net[2].p if module.hidden else 0.0}
    if isinstance(module, _BertClassifier):
        arch: dict[str, Any] = {"class": type(module).__name__, "num_labels": module.num_labels,
                "pooling": module.pooling, "bert_config": module.bert.config.to_dict()}
        if getattr(module, "has_posterior", False):
            arch["posterior"] = {"eta": getattr(module, "eta", None)}
        if isinstance(module, TokenClassifier) and module.contextual:
            d = module.denoiser
            arch["denoiser"] = None if d is None else {
                k: d.describe()[k] for k in ("file", "mechanism", "eta", "bundle_id", "layers",
                                             "candidates")}
        return arch
    raise TypeError(f"not a privbert classifier: {type(module).__name__}")


def classifier_from_architecture(arch: dict[str, Any]) -> nn.Module:
    """An untrained module of the architecture ``arch`` (weights are loaded afterwards)."""
    name = arch.get("class")
    if name == "VectorMLP":
        return VectorMLP(arch["in_dim"], arch["num_labels"], arch["hidden"], arch["dropout"])
    if name in ("TokenClassifier", "EmbeddingClassifier"):
        from transformers import BertConfig, BertModel

        config = BertConfig.from_dict(dict(arch["bert_config"]))
        bert = BertModel(config, add_pooling_layer=arch["pooling"] == "cls")
        post = arch.get("posterior")
        if name == "TokenClassifier":  # the buffers' values come with the weights
            table = None if post is None else torch.zeros(
                config.vocab_size, config.hidden_size)
            return TokenClassifier(bert, arch["num_labels"], arch["pooling"], table,
                                   contextual="denoiser" in arch)
        if post is None:
            return EmbeddingClassifier(bert, arch["num_labels"], arch["pooling"])
        return EmbeddingClassifier(bert, arch["num_labels"], arch["pooling"],
                                   torch.zeros(config.vocab_size), post["eta"])
    raise ValueError(f"unknown classifier class {name!r}")
