"""Is a payload made for this model? Checked before it is queued; every refusal says exactly
what differs, without repeating payload data (ids, values): only mechanism, parameters,
bundle ids, shapes and counts.

    checker = PayloadChecker(config, bundle, max_tokens_setting=None)
    limits = checker.limits()      # to parse request bodies for this model
    checker.check(payloads)        # PayloadMismatch: "payloads[0]: eta 60 sent, model serves eta 65"

The same checks as ``models.versions.model_version.ModelVersion.check_payload``, plus regular token ids,
the token budget (``max_length`` less [CLS]/[SEP]), sentence pairs, and float values no
larger than :data:`MAX_ABS_VALUE` (a sound model's scores stay finite below it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cloud_api.errors import PayloadMismatch
from models.training.data import kind_of
from shared.arrays import Limits
from shared.mechanisms import registry


def _fmt(value) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, int | float):
        return format(value, "g")
    return str(value)


def _policy_difference(sent, wanted, serves: str) -> str:
    """A token policy's parameter (``shared.policy``) that differs, in words."""
    def say(p) -> str:
        return "no token policy" if p is None else f"token policy public_p {_fmt(p)}"
    return (f"payload made under {say(sent)}, {serves} {say(wanted)} (its bundle names the "
            "public words; privatize with the model's parameters)")


# The largest magnitude a float payload value may have. No mechanism sends more at a
# parameter worth using (dχ noise per coordinate is about n/(η·sqrt(n)): 2e7 at η 1e-6 on
# MiniLM's 384 dimensions; Laplace noise b = r/ε: 4e11 at ε 1e-9), and a model's float32
# arithmetic stays finite below it (BERT's first LayerNorm sums n squares: overflow needs
# about 1e17); above it a payload could make NaN scores of a sound model: a bad input (422),
# never a 500.
MAX_ABS_VALUE = 1e12


class PayloadChecker:
    """The payload contract of one model version (its ``config.json``), with the regular ids
    of its bundle when the bundle is known."""

    def __init__(self, config: dict, bundle=None, max_tokens_setting: int | None = None,
                 serves: str = "model serves", length_of: str | None = None):
        self.serves = serves  # how refusals name the other side: "model serves", "task accepts"
        self.length_of = length_of  # whose max_length it is, when not the model's own
        self.mechanism: str = config["mechanism"]
        self.kind = kind_of(self.mechanism)
        mech = registry.get(self.mechanism)
        self._compared = mech.compared_params  # TextHide: m only, predictions use k = 1
        self.params: dict = dict(config["params"])
        self._want = self._compared(self.params)
        self._bits = mech.payload_kind is registry.PayloadKind.BITS
        self.bundle_id: str = config["bundle_id"]
        self.max_length = int(config["max_length"])
        self.pairs: bool | None = (config.get("source") or {}).get("pairs")
        arch = config.get("architecture") or {}
        bert = arch.get("bert_config") or {}
        self.vocab_size: int | None = int(bert["vocab_size"]) if "vocab_size" in bert else None
        self.hidden: int | None = int(bert["hidden_size"]) if "hidden_size" in bert else None
        self.in_dim: int | None = int(arch["in_dim"]) if "in_dim" in arch else None
        self.max_tokens = max(1, self.max_length - 2)
        if max_tokens_setting is not None:
            self.max_tokens = min(self.max_tokens, int(max_tokens_setting))
        self.bits_per_value = mech.values_per_dim(self.params)  # OME: l bits a value
        vector_dim = None
        if self.kind == "vector" and self.in_dim is not None:
            vector_dim = self.in_dim // self.bits_per_value
        self._limits = Limits(max_tokens=self.max_tokens, vocab_size=self.vocab_size,
                              dim=self.hidden if self.kind == "embeddings" else None,
                              vector_dim=vector_dim)  # frozen: one per model, not per request
        self._irregular: np.ndarray | None = None
        if self.kind == "tokens" and self.vocab_size is not None:
            mask = np.zeros(self.vocab_size, dtype=bool)
            special = dict(config.get("special_ids") or {})
            if not mech.private:  # plain text may hold unknown words
                special.pop("unk", None)
            mask[[i for i in special.values() if 0 <= i < self.vocab_size]] = True
            if bundle is not None:
                unused = [i for i in bundle.meta.get("unused_ids", []) if 0 <= i < self.vocab_size]
                mask[unused] = True
            self._irregular = mask

    @classmethod
    def for_task(cls, task, bundle, max_tokens_setting: int | None = None,
                 served: tuple[int, str] | None = None) -> PayloadChecker:
        """The same checks for the records of a task (``store.tasks.Task``) made with
        ``bundle``: the task's mechanism, parameters and bundle, sentence pairs or single
        sentences as the task says, the bundle's vocabulary, special and [unused] ids,
        dimensions and ``max_length`` (less [CLS]/[SEP]), as a model trained from them reads
        them; ``served``: (max_length, model id) of the model serving the task, whose
        shorter max_length then holds (``ServedModels.length_for_task``). Records and
        predictions are held to one contract."""
        kind = kind_of(task.mechanism)
        enc = bundle.meta.get("encoder") or {}
        arch: dict = {"bert_config": {"vocab_size": bundle.vocab_size,
                                      "hidden_size": bundle.dim}}
        r = enc.get("output_dim")
        if kind == "vector" and r is not None:
            arch["in_dim"] = int(r) * registry.get(task.mechanism).values_per_dim(task.params)
        max_length, length_of = bundle.max_length, None
        if served is not None:
            max_length = bundle.length_for_model(served[0]) or max_length
            if max_length < bundle.max_length:
                length_of = f"model {served[1]}, which serves the task"
        config = {"mechanism": task.mechanism, "params": dict(task.params),
                  "bundle_id": task.bundle_id, "max_length": max_length,
                  "source": {"pairs": bool(task.pairs)}, "architecture": arch,
                  "special_ids": dict(bundle.special_ids)}
        return cls(config, bundle, max_tokens_setting, serves="task accepts",
                   length_of=length_of)

    # -- limits for parsing -----------------------------------------------------------------
    def limits(self) -> Limits:
        """``shared.arrays.Limits`` to parse this model's request bodies."""
        return self._limits

    # -- checks -----------------------------------------------------------------------------
    def check(self, payloads: Sequence) -> None:
        """PayloadMismatch naming the first payload that does not fit and what differs."""
        found = self.first_problem(payloads)
        if found is not None:
            raise PayloadMismatch(f"payloads[{found[0]}]: {found[1]}")

    def first_problem(self, payloads: Sequence) -> tuple[int, str] | None:
        """(index, what differs) of the first payload that does not fit, or None."""
        found = next(((i, why) for i, p in enumerate(payloads)
                      if (why := self.problem(p)) is not None), None)
        # the token ids of the payloads before it, in one numpy pass for the whole request
        return self._first_bad_ids(payloads[:found[0] if found else len(payloads)]) or found

    def problem(self, p) -> str | None:
        """What differs between payload ``p`` and the model, or None; token ids aside
        (:meth:`check` reads them). Shapes come from the payload's array fields: nothing
        is decoded or copied here."""
        if p.mechanism != self.mechanism:
            return f"mechanism {p.mechanism} sent, {self.serves} {self.mechanism}"
        if p.bundle_id != self.bundle_id:
            return (f"bundle {p.bundle_id[:12]}… sent, {self.serves} {self.bundle_id[:12]}… "
                    f"(fetch GET /v1/bundles/{self.bundle_id})")
        got, want = self._compared(p.params.model_dump()), self._want
        if got != want:  # equal is the common case; else compare with a tolerance
            diffs = [_policy_difference(got.get(k), want.get(k), self.serves)
                     if k == "public_p" else
                     f"{k} {a} sent, {self.serves} {k} {b}"
                     for k in registry.differing_params(got, want)
                     for a, b in [registry.param_texts(got.get(k), want.get(k), _fmt)]]
            if diffs:
                return "; ".join(diffs)
        shape = getattr(p, p.array_field).shape
        if self.kind == "vector":
            return self._vector(int(shape[-1])) or self._magnitude(p)
        n = int(shape[0])
        segs = getattr(p, "segments", None)
        pair = segs is not None and len(segs) == 2
        if self.pairs is not None and pair != self.pairs:
            who = self.serves.split()[0]  # "model" or "task"
            return (f"a sentence pair sent, {who} reads single sentences" if pair else
                    f"a single sentence sent, {who} reads sentence pairs")
        budget = self.max_tokens if not pair else min(self.max_tokens, self.max_length - 3)
        if n > budget:
            of = f" of {self.length_of}" if self.length_of else ""
            why = (f"max_length {self.max_length}{of} less [CLS] and [SEP]" if budget ==
                   self.max_length - (3 if pair else 2) else "the server's tokens-per-payload "
                   "limit")
            return f"{n} tokens sent, {self.serves} at most {budget} ({why})"
        if self.kind == "embeddings" and self.hidden is not None and shape[1] != self.hidden:
            return f"dimension {shape[1]} sent, {self.serves} {self.hidden}"
        return self._magnitude(p) if self.kind == "embeddings" else None

    def _magnitude(self, p) -> str | None:
        """Float values beyond :data:`MAX_ABS_VALUE` (float16 cannot reach it)."""
        arr = getattr(p, p.array_field)
        if arr.dtype != "float32":
            return None
        values = arr.to_numpy()
        if values.size and float(np.abs(values).max()) > MAX_ABS_VALUE:
            return (f"values of magnitude above {MAX_ABS_VALUE:g} sent, {self.serves} at most "
                    f"{MAX_ABS_VALUE:g} (no mechanism sends such values; they would overflow "
                    "the model's arithmetic)")
        return None

    def _first_bad_ids(self, payloads: Sequence) -> tuple[int, str] | None:
        """(index, what is wrong) of the first of ``payloads`` (each passed :meth:`problem`)
        whose token ids are not regular ids of the model; all of them are checked at once,
        one by one only when something is wrong."""
        if self.kind != "tokens" or self.vocab_size is None or not payloads:
            return None
        arrays = [p.data_array() for p in payloads]
        if self._ids(np.concatenate(arrays)) is None:
            return None
        return next((i, why) for i, a in enumerate(arrays) if (why := self._ids(a)) is not None)

    def _vector(self, width: int) -> str | None:
        if self.in_dim is None:
            return None
        if width == self.in_dim:
            return None
        if self._bits:
            return (f"{width} bits sent, {self.serves} {self.in_dim} bits "
                    f"(dimension {self.in_dim // self.bits_per_value} x {self.bits_per_value})")
        return f"dimension {width} sent, {self.serves} {self.in_dim}"

    def _ids(self, ids: np.ndarray) -> str | None:
        if ids.size == 0 or self.vocab_size is None:
            return None
        bad = int(np.count_nonzero((ids < 0) | (ids >= self.vocab_size)))
        if bad:
            return (f"{bad} token id(s) outside the model's vocabulary [0, {self.vocab_size}) "
                    f"(a payload of another bundle?)")
        if self._irregular is not None:
            irregular = int(np.count_nonzero(self._irregular[ids]))
            if irregular:
                return (f"{irregular} token id(s) are special or [unused] ids, not regular "
                        f"tokens ({self.mechanism} payloads carry only word pieces; the server "
                        f"adds [CLS] and [SEP])")
        return None
