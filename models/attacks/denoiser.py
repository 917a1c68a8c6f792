"""Contextual channel posterior of ``dchi-text``: what a server with a model of public text
infers about each original token from the whole privatized sentence. Post-processing of the
payload (Dwork & Roth 2014, Prop. 2.1): no privacy cost, and the strongest attack we know.

Per token, dχ returns either the original or an essentially unrelated word (Asghar et al.
2024, arXiv 2411.13784): at η 65 on the MiniLM table the original of a replaced token is
rarely among the nearest neighbours of the output, so a context-free candidate list misses
it (bench/results/denoiser.md). The denoiser therefore scores, at each
position i, every token of a candidate vocabulary O (the most frequent tokens of the public
text) plus the output y_i itself ("copy"), as Tong et al. (NAACL 2025) rebuild tokens with a
language-model prior over the mechanism's candidates:

    logit_i(x) = log P̃(x | y_i)  +  ⟨u_i, φ(x)⟩ + b(x)

* log P̃(x | y) is the context-free posterior of ``models.training.posterior`` (Monte Carlo counts
  of the exact mechanism, prior = public-text frequencies), smoothed so that every pair has
  mass: P̃(y | x) = (n_xy + β_x q(y)) / (D_x + β_x), β_x = the number of outputs seen once
  from x (Good–Turing's unseen mass), q the outputs' marginal. It splits into a dense part
  in x and a sparse part on the observed pairs (at most ``MAX_SUPPORT`` per y).
* u_i reads the sentence: a few MiniLM layers over the privatized ids, then BERT's MLM
  transform with its last layer zero-initialised, so an untrained denoiser *is* the
  context-free posterior; φ is the bundle's frozen table (tied output).

The classifier reads E[φ(x) | y, context] (:meth:`Denoiser.soft_embedding`). A denoiser is
valid for one mechanism, η and bundle: :meth:`Denoiser.check_for` refuses any other.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.nets.backbone import check_same_bundle, freeze_word_embeddings, keep_layers
from models.versions.version_folder import DENOISER_FILE, check_denoiser_meta, denoiser_header
from models.versions.version_folder import DENOISER_FORMAT as FORMAT
from models.versions.version_folder import DENOISER_FORMAT_VERSION as FORMAT_VERSION
from models.versions.version_module import load_backbone
from shared.mechanisms.registry import substituting_names

MAX_SUPPORT = 64  # observed context-free pairs kept per output y (the MC table has ≤ 60 at η 65)
NEG = -1e4  # "impossible" logit (finite: fp16/ONNX-safe)
WORD_EMBEDDINGS = "bert.embeddings.word_embeddings.weight"  # the bundle's: never stored here


def candidate_vocabulary(prior_counts: np.ndarray, regular_ids: np.ndarray, size: int
                         ) -> np.ndarray:
    """The ``size`` regular tokens most frequent in the public text (only tokens it holds;
    ties by id), sorted by id."""
    counts = np.asarray(prior_counts, dtype=np.float64)
    reg = np.asarray(regular_ids, dtype=np.int64)
    seen = reg[counts[reg] > 0]
    order = np.lexsort((seen, -counts[seen]))
    return np.sort(seen[order][:size])


def channel_bias(posterior, candidates: np.ndarray, regular_ids: np.ndarray,
                 max_support: int = MAX_SUPPORT) -> dict[str, np.ndarray]:
    """The context-free log posterior log P̃(x | y) (up to a constant in x) as arrays:

    ``base`` (N,) the dense part on the candidates, ``copy`` (V,) its value at x = y,
    ``sparse_slot`` / ``sparse_val`` (V, M) the observed pairs x ≠ y, x in the candidates
    (slot = index in ``candidates``; padding: slot 0, value 0).
    """
    if posterior.mechanism not in substituting_names():
        raise ValueError(f"a contextual denoiser exists for {', '.join(substituting_names())} only, "
                         f"not {posterior.mechanism}")
    V = posterior.vocab_size
    log_prior = posterior.log_prior(regular_ids).astype(np.float64)
    x, y, n = (posterior.pair_x.astype(np.int64), posterior.pair_y.astype(np.int64),
               posterior.pair_n.astype(np.float64))
    draws = posterior.draws.astype(np.float64)
    beta = np.ones(V)
    np.add.at(beta, x[n == 1], 1.0)
    beta = np.maximum(beta - 1.0, 1.0)  # outputs seen once, at least 1
    reg = np.zeros(V, dtype=bool)
    reg[np.asarray(regular_ids, dtype=np.int64)] = True
    out_counts = np.zeros(V)
    np.add.at(out_counts, y, n)
    q = np.where(reg, out_counts + 0.5, 0.0)
    q /= q.sum()
    with np.errstate(divide="ignore"):
        dense = np.where(reg, log_prior + np.log(beta) - np.log(draws + beta), NEG)
    s = np.log1p(n / (beta[x] * np.maximum(q[y], 1e-30)))
    copy = dense.copy()
    same = x == y
    copy[y[same]] += s[same]
    slot_of = np.full(V, -1, dtype=np.int64)
    slot_of[candidates] = np.arange(len(candidates))
    keep = (~same) & (slot_of[x] >= 0)
    xk, yk, sk = x[keep], y[keep], s[keep]
    order = np.lexsort((-sk, yk))
    xk, yk, sk = xk[order], yk[order], sk[order]
    first = np.searchsorted(yk, yk, side="left")
    rank = np.arange(len(yk)) - first
    fit = rank < max_support
    slots = np.zeros((V, max_support), dtype=np.int64)
    vals = np.zeros((V, max_support), dtype=np.float32)
    slots[yk[fit], rank[fit]] = slot_of[xk[fit]]
    vals[yk[fit], rank[fit]] = sk[fit]
    return {"base": np.maximum(dense[candidates], NEG).astype(np.float32),
            "copy": np.maximum(copy, NEG).astype(np.float32),
            "sparse_slot": slots, "sparse_val": vals}


class Denoiser(nn.Module):
    """Privatized ids (B, T) -> scores over (candidates ∪ {y_i}) at every position."""

    # buffers: the candidate ids and each id's slot among them, and the channel bias
    candidates: torch.Tensor
    slot_of: torch.Tensor
    base: torch.Tensor
    copy: torch.Tensor
    sparse_val: torch.Tensor
    sparse_slot: torch.Tensor

    def __init__(self, bert, candidates, bias: dict, meta: dict):
        super().__init__()

        self.bert = bert
        self.bert.pooler = None
        freeze_word_embeddings(self.bert)
        V, dim = bert.embeddings.word_embeddings.weight.shape
        hidden = bert.config.hidden_size
        cand = torch.as_tensor(np.asarray(candidates), dtype=torch.long)
        slot_of = torch.full((V,), -1, dtype=torch.long)
        slot_of[cand] = torch.arange(len(cand))
        self.register_buffer("candidates", cand)
        self.register_buffer("slot_of", slot_of)
        for name in ("base", "copy", "sparse_val"):
            self.register_buffer(name, torch.as_tensor(np.asarray(bias[name]),
                                                       dtype=torch.float32))
        self.register_buffer("sparse_slot", torch.as_tensor(np.asarray(bias["sparse_slot"]),
                                                            dtype=torch.long))
        if self.base.shape != (len(cand),) or self.copy.shape != (V,) or \
                self.sparse_slot.shape != self.sparse_val.shape or self.sparse_slot.shape[0] != V:
            raise ValueError("the channel bias does not fit the vocabulary and candidates")
        self.dense = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=getattr(bert.config, "layer_norm_eps", 1e-12))
        self.out = nn.Linear(hidden, dim)
        nn.init.zeros_(self.out.weight)  # untrained = the context-free posterior
        nn.init.zeros_(self.out.bias)
        self.token_bias = nn.Parameter(torch.zeros(V))
        self.meta = dict(meta)
        if self.meta.get("mechanism") not in substituting_names():
            raise ValueError(f"a contextual denoiser exists for {', '.join(substituting_names())} only")

    # -- identity ------------------------------------------------------------------------------
    def check_for(self, mechanism: str, params: dict, bundle_id: str) -> None:
        """ValueError (one line) unless trained for exactly this mechanism, η and bundle."""
        check_denoiser_meta(self.meta, mechanism, params, bundle_id)

    def describe(self) -> dict:
        """What it reads and was trained on (recorded in a model version's config)."""
        return {"file": DENOISER_FILE, "layers": self.bert.config.num_hidden_layers,
                "candidates": int(self.candidates.numel()), **self.meta}

    def train(self, mode: bool = True):
        """A denoiser inside a classifier stays frozen in eval mode (``frozen`` set)."""
        return super().train(mode and not getattr(self, "frozen", False))

    # -- scores --------------------------------------------------------------------------------
    def is_text(self, input_ids) -> torch.Tensor:
        """(B, T) bool: positions holding a regular token (what the mechanism outputs)."""
        return self.copy[input_ids] > NEG / 2

    def logits(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        """(B, T, N + 1): log-scores of the N candidates (y's own slot masked) and of x = y."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        h = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                      token_type_ids=token_type_ids).last_hidden_state
        u = self.out(self.norm(F.gelu(self.dense(h))))
        table = self.bert.embeddings.word_embeddings.weight
        cand = table[self.candidates].to(u.dtype)
        scores = u @ cand.T + (self.base + self.token_bias[self.candidates])
        scores = scores.scatter_add(-1, self.sparse_slot[input_ids],
                                    self.sparse_val[input_ids].to(scores.dtype))
        own = self.slot_of[input_ids].unsqueeze(-1)
        at = own.clamp(min=0)
        kept = torch.where(own >= 0, torch.full_like(at, 0, dtype=scores.dtype) + NEG,
                           scores.gather(-1, at))
        scores = scores.scatter(-1, at, kept)
        emb_y = table[input_ids].to(u.dtype)
        copy = (u * emb_y).sum(-1) + self.copy[input_ids] + self.token_bias[input_ids]
        return torch.cat([scores, copy.unsqueeze(-1)], dim=-1)

    def context_free_ids(self, input_ids) -> torch.Tensor:
        """(B, T) the argmax of the smoothed context-free posterior alone (the bias, no
        sentence): what a server reading each token by itself would guess."""
        n = self.candidates.numel()
        scores = self.base.expand(*input_ids.shape, n).scatter_add(
            -1, self.sparse_slot[input_ids], self.sparse_val[input_ids])
        own = self.slot_of[input_ids].unsqueeze(-1)
        at = own.clamp(min=0)
        scores = scores.scatter(-1, at, torch.where(own >= 0, torch.full_like(
            scores[..., :1], NEG), scores.gather(-1, at)))
        best, arg = scores.max(-1)
        return torch.where(self.copy[input_ids] >= best, input_ids, self.candidates[arg])

    def soft_embedding(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        """(B, T, n): E[φ(x) | y, context] at every position (BERT reads it for the ids)."""
        p = torch.softmax(self.logits(input_ids, attention_mask, token_type_ids).float(), -1)
        table = self.bert.embeddings.word_embeddings.weight.float()
        n = self.candidates.numel()
        return p[..., :n] @ table[self.candidates] + p[..., n:] * table[input_ids]

    def predict_ids(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        """(B, T) the most probable original of every position."""
        best = self.logits(input_ids, attention_mask, token_type_ids).argmax(-1)
        n = self.candidates.numel()
        return torch.where(best == n, input_ids, self.candidates[best.clamp(max=n - 1)])

    def targets(self, input_ids, originals) -> torch.Tensor:
        """(B, T) the slot of each original (N = copy), −100 where it is out of reach."""
        n = self.candidates.numel()
        slot = self.slot_of[originals]
        t = torch.where(originals == input_ids, torch.full_like(slot, n), slot)
        return torch.where(t < 0, torch.full_like(t, -100), t)

    # -- files ---------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The weights and buffers (without the bundle's table) as safetensors, the metadata
        in its header."""
        from safetensors.torch import save

        state = {k: v.detach().to("cpu").contiguous() for k, v in self.state_dict().items()
                 if k != WORD_EMBEDDINGS}
        for k in ("sparse_slot", "candidates", "slot_of"):  # indices < V: int32 on disk
            state[k] = state[k].to(torch.int32)
        header = {"format": FORMAT, "format_version": FORMAT_VERSION, "meta": self.meta,
                  "bert_config": self.bert.config.to_dict()}
        return save(state, metadata={"privbert": json.dumps(header, default=_jsonable)})

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``path`` (a file, or a folder to hold denoiser.safetensors): a temporary
        name, then one rename."""
        p = Path(path)
        if p.is_dir():
            p = p / DENOISER_FILE
        tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                f.write(self.to_bytes())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, p)
        finally:
            tmp.unlink(missing_ok=True)
        return p

    @classmethod
    def load(cls, path: str | os.PathLike, word_embeddings) -> Denoiser:
        """A denoiser file; ``word_embeddings``: the bundle's table (an ``nn.Embedding`` to
        share, or an array of shape (V, n)). ValueError if it is not a complete denoiser."""
        p = Path(path)
        if p.is_dir():
            p = p / DENOISER_FILE
        if not p.is_file():
            raise ValueError(f"{p}: no such denoiser file")
        return cls.from_bytes(p.read_bytes(), word_embeddings, where=str(p))

    @classmethod
    def from_bytes(cls, data: bytes, word_embeddings, where: str = "denoiser") -> Denoiser:
        from safetensors import SafetensorError
        from safetensors.torch import load
        from transformers import BertConfig, BertModel

        header = denoiser_header(data, where)
        try:
            state = load(data)
        except (SafetensorError, ValueError) as exc:
            raise ValueError(f"{where}: not a denoiser file ({exc})") from None
        bert = BertModel(BertConfig.from_dict(header["bert_config"]), add_pooling_layer=False)
        if isinstance(word_embeddings, nn.Embedding):
            if word_embeddings.weight.shape != bert.embeddings.word_embeddings.weight.shape:
                raise ValueError(f"{where}: the denoiser's vocabulary does not match the table")
            bert.embeddings.word_embeddings = word_embeddings
        else:
            w = torch.tensor(np.asarray(word_embeddings, dtype=np.float32))
            if w.shape != bert.embeddings.word_embeddings.weight.shape:
                raise ValueError(f"{where}: the denoiser's vocabulary does not match the table")
            bert.embeddings.word_embeddings.weight.data.copy_(w)
        try:
            bias = {k: state[k].numpy() for k in ("base", "copy", "sparse_slot", "sparse_val")}
            module = cls(bert, state["candidates"].numpy(), bias, header["meta"])
        except KeyError as exc:
            raise ValueError(f"{where}: incomplete denoiser file (no {exc})") from None
        for k in ("sparse_slot", "candidates", "slot_of"):
            state[k] = state[k].long()
        missing, unexpected = module.load_state_dict(state, strict=False)
        missing = [k for k in missing if k != WORD_EMBEDDINGS and "position_ids" not in k]
        if missing or unexpected:
            raise ValueError(f"{where}: weights do not fit (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]})")
        return module.eval()


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def new_denoiser(posterior, bundle, *, layers: int = 2, candidates: int = 4096, base=None,
                 meta: dict | None = None) -> Denoiser:
    """An untrained denoiser (= the context-free posterior of ``posterior``) whose encoder
    is the first ``layers`` layers of ``base`` (None: MiniLM), checked against ``bundle``."""

    if posterior.bundle_id != bundle.bundle_id:
        raise ValueError("the posterior table was built for another bundle")
    if not 1 <= candidates:
        raise ValueError(f"candidates must be >= 1, got {candidates}")
    bert = load_backbone(base)
    check_same_bundle(bert, bundle)
    keep_layers(bert, layers)
    cand = candidate_vocabulary(posterior.prior_counts, bundle.regular_ids, candidates)
    bias = channel_bias(posterior, cand, bundle.regular_ids)
    info = {"mechanism": posterior.mechanism, "eta": posterior.eta,
            **({"public_p": posterior.public_p} if posterior.public_p is not None else {}),
            "bundle_id": bundle.bundle_id, "posterior": posterior.describe(), **(meta or {})}
    return Denoiser(bert, cand, bias, info)
