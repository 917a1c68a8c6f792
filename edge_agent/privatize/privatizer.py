"""Texts -> privatized payloads, on the device (ARCHITECTURE.md "Payloads"; docs/python-api.md).

Token kinds (``dchi-text``, ``dchi-embedding``, ``none``): word pieces of the
bundle's tokenizer without [CLS]/[SEP] (the server adds them), then the dχ
mechanism of Qu et al. 2021 §3.2 on all tokens of a batch at once.
Vector kinds (``laplace``, ``ome``, ``texthide``): the bundle's frozen ONNX
encoder on ``[CLS] a [SEP] (b [SEP])``, after DPNR word dropout (Lyu et al.
2020, §3.3: each word, with all its word pieces, is removed with probability μ),
then the mechanism on the (b, r) vectors.

Truncation policy at the model's length limit: at most ``max_length - 2`` word
pieces for a single text, ``max_length - 3`` for a pair; "first" keeps the
first ones (a pair trims its longer segment first, the second on a tie),
"error" refuses the text.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from edge_agent.privatize.encoder import SentenceEncoder
from edge_agent.privatize.record_lines import token_rows
from edge_agent.service.known_bundles import text_floor
from edge_agent.service.pins import trusted_from_env
from shared.floor import WeakPrivacyError, require_privacy_floor
from shared.mechanisms.registry import as_mechanism
from shared.payload import Record, make_payload, make_payloads
from shared.policy import public_masks
from shared.rng import resolve_rng

if TYPE_CHECKING:
    from edge_agent.privatize.encoder import SentenceEncoder
    from shared.bundle import EdgeBundle

TRUNCATE_POLICIES = ("first", "error")


class TextError(ValueError):
    """A text that cannot be privatized; ``index`` is its position in the batch."""

    def __init__(self, index: int, reason: str, detail: str):
        super().__init__(f"text {index + 1} {detail}")
        self.index = index
        self.reason = reason  # "empty" or "too_long"
        self.detail = detail


@dataclass(frozen=True)
class TokenizedText:
    """Word-piece ids of one text (or pair) after truncation; with word dropout also the
    word of each piece (0, 1, ... within its segment)."""

    ids_a: np.ndarray
    ids_b: np.ndarray | None
    n_before: int  # word pieces before truncation
    words_a: np.ndarray | None = None
    words_b: np.ndarray | None = None
    # truncation cut a word: the first piece dropped from segment a (b) was a "##" piece, so
    # the last piece kept is part of a longer word (a token policy never sends it as public)
    cut_a: bool = False
    cut_b: bool = False

    @property
    def n_tokens(self) -> int:
        return len(self.ids_a) + (0 if self.ids_b is None else len(self.ids_b))

    @property
    def truncated(self) -> bool:
        return self.n_tokens < self.n_before

    @property
    def segments(self) -> list[int] | None:
        return None if self.ids_b is None else [len(self.ids_a), len(self.ids_b)]

    def parts(self) -> tuple[tuple[np.ndarray, bool], ...]:
        """Each segment's word pieces and whether truncation cut its last word."""
        if self.ids_b is None:
            return ((self.ids_a, self.cut_a),)
        return ((self.ids_a, self.cut_a), (self.ids_b, self.cut_b))


def trim_pair(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """Lengths after removing tokens from the longer segment first (the second on a tie)."""
    excess = len_a + len_b - budget
    if excess <= 0:
        return len_a, len_b
    gap = abs(len_a - len_b)
    if excess <= gap:
        return (len_a - excess, len_b) if len_a > len_b else (len_a, len_b - excess)
    rest = excess - gap
    even = min(len_a, len_b)
    return even - rest // 2, even - (rest + 1) // 2


def word_index(word_ids: list[int | None]) -> np.ndarray:
    """0, 1, ... per word piece: pieces of one word (the tokenizer's ``word_ids``) share
    an index; a piece without a word (None) is a word of its own."""
    w = np.array(word_ids, dtype=np.float64)  # None -> nan, never equal to a neighbour
    if w.size == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.empty(w.size, dtype=bool)
    starts[0] = True
    np.not_equal(w[1:], w[:-1], out=starts[1:])
    return np.cumsum(starts) - 1


class Privatizer:
    """``Privatizer(bundle, mechanism)``: texts -> payloads of that mechanism and bundle."""

    def __init__(self, bundle: EdgeBundle, mechanism: Any, *, max_length: int | None = None,
                 truncate: str = "first", float_dtype: str = "float32", encoder=None,
                 allow_weak_privacy: bool = False, trusted_bundles: frozenset[str] | None = None):
        """Parameters the float arithmetic cannot carry raise ValueError, and parameters
        weaker than the privacy floor (``shared.floor``) raise ``WeakPrivacyError`` unless
        ``allow_weak_privacy``; then :attr:`weak_privacy` holds the reason. ``NoPrivacy``
        (or the name "none") is the explicitly named Null-privacy baseline and is not
        judged. A bundle that is neither known (``shared.trust``) nor one of
        ``trusted_bundles`` (default: ``$PRIVBERT_TRUSTED_BUNDLES``) must also pass the text
        floor (``shared.floor_text``); :attr:`trust` says which it is."""
        mechanism = as_mechanism(mechanism)
        name = mechanism.name
        if truncate not in TRUNCATE_POLICIES:
            raise ValueError(f"truncate must be one of {TRUNCATE_POLICIES}, got {truncate!r}")
        if float_dtype not in ("float16", "float32"):
            raise ValueError(f"float_dtype must be float16 or float32, got {float_dtype!r}")
        if getattr(mechanism, "bundle", bundle).bundle_id != bundle.bundle_id:  # DChiText's
            raise ValueError(f"the {type(mechanism).__name__} mechanism was built for another "
                             "bundle")
        self.bundle = bundle
        self.mechanism = mechanism
        self.name = name
        self.tokens = mechanism.payload_kind.reads_tokens  # else sentence vectors
        self.params = dict(mechanism.params)
        self.truncate = truncate
        self.float_dtype = float_dtype
        self.word_dropout = float(getattr(mechanism, "word_dropout", 0.0) or 0.0)
        self.encoder = None
        limit = bundle.max_length
        if not self.tokens:
            if encoder is None:

                encoder = SentenceEncoder.from_bundle(bundle)
            self.encoder = encoder
            limit = min(limit, getattr(encoder, "max_length", None) or limit)
            dim = getattr(mechanism, "dim", None)
            out_dim = getattr(encoder, "output_dim", None)
            if dim is not None and out_dim is not None and dim != out_dim:
                raise ValueError(f"{name} was built for dim={dim} but the encoder returns "
                                 f"{out_dim} values")

        vec_dim = getattr(self.encoder, "output_dim", None) if self.encoder is not None else None
        mechanism.check_computable(bundle, dim=vec_dim, float_dtype=float_dtype)
        self.weak_privacy: str | None = None if not mechanism.private else \
            require_privacy_floor(mechanism, bundle, allow_weak=allow_weak_privacy, dim=vec_dim)
        self.trust = self._text_floor(trusted_bundles, allow_weak_privacy)
        if max_length is None:
            max_length = limit
        if not isinstance(max_length, int) or not 4 <= max_length <= limit:
            raise ValueError(f"max_length must be an integer in [4, {limit}], got {max_length!r}")
        self.max_length = max_length
        self.special = bundle.special_ids
        # reads "[CLS]", "[SEP]" ... in user text as plain text
        self.tokenizer = bundle.text_tokenizer()
        # the token policy the mechanism applies (its bundle's public words), or None
        self.policy = getattr(mechanism, "policy", None) if self.tokens else None

    def _text_floor(self, trusted: frozenset[str] | None, allow_weak: bool):
        """The bundle's trust (issue 42); an unverified bundle's text floor, refused as the
        privacy floor is (``WeakPrivacyError`` unless ``allow_weak``)."""

        t, reason = text_floor(self.bundle, self.mechanism,
                               trusted_from_env() if trusted is None else trusted)
        if reason is not None and not allow_weak:
            raise WeakPrivacyError(reason)
        self.weak_privacy = self.weak_privacy or reason
        return t

    # -- tokenization ----------------------------------------------------------------------
    def budget(self, pair: bool) -> int:
        """Word pieces allowed: max_length - 2 (single) or - 3 (pair)."""
        return self.max_length - (3 if pair else 2)

    def tokenize(self, texts: list[str], pairs: list[str] | None = None,
                 allow_empty: bool = False) -> list[TokenizedText | None]:
        """Word pieces of each text (pair), truncated by the policy.

        A text without word pieces is None with ``allow_empty``, else a TextError.
        With word dropout each item also keeps the word index of each piece.
        """
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"pairs must have one entry per text ({len(texts)}), got {len(pairs)}")
        enc_a = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        enc_b = (self.tokenizer.encode_batch(list(pairs), add_special_tokens=False)
                 if pairs is not None else [None] * len(texts))
        budget = self.budget(pairs is not None)
        words = self.word_dropout > 0
        out: list[TokenizedText | None] = []
        for i, (ea, eb) in enumerate(zip(enc_a, enc_b, strict=True)):
            a = ea.ids
            b = None if eb is None else eb.ids
            la, lb = len(a), (0 if b is None else len(b))
            if not a or (b is not None and not b):
                if allow_empty:
                    out.append(None)
                    continue
                raise TextError(i, "empty", "has no tokens"
                                + (" in one of its two segments" if b is not None else ""))
            n = len(a) + (0 if b is None else len(b))
            if n > budget:
                if self.truncate == "error":
                    raise TextError(i, "too_long", f"has {n} tokens; the model takes at most "
                                    f"{budget} (truncation 'first' keeps the first {budget})")
                if b is None:
                    la = budget
                else:
                    la, lb = trim_pair(len(a), len(b), budget)
                cut_a, cut_b = self._cut(a, la), self._cut(b, lb)
                a, b = a[:la], (None if b is None else b[:lb])
            else:
                cut_a = cut_b = False
            wa = wb = None
            if words:  # the word of each kept piece, after the same truncation
                wa = word_index(ea.word_ids[:la])
                wb = None if eb is None else word_index(eb.word_ids[:lb])
            out.append(TokenizedText(np.asarray(a, dtype=np.int64),
                                     None if b is None else np.asarray(b, dtype=np.int64), n,
                                     wa, wb, cut_a, cut_b))
        return out

    def _cut(self, ids: list[int] | None, kept: int) -> bool:
        """Whether keeping the first ``kept`` of ``ids`` cuts a word (the next is a "##"
        piece); only a token policy asks."""
        if self.policy is None or ids is None or kept >= len(ids):
            return False
        return bool(self.policy.continuation[ids[kept]])

    # -- the token policy ------------------------------------------------------------------
    def public_mask(self, items: list[TokenizedText]) -> np.ndarray | None:
        """The token policy's public words of a batch, in the order :meth:`privatize_data`
        privatizes them (None without a policy)."""
        if self.policy is None:
            return None
        return public_masks(self.policy, [ids for it in items for ids, _ in it.parts()],
                            [cut for it in items for _, cut in it.parts()])

    def public_count(self, item: TokenizedText) -> int:
        """How many of an item's tokens are public words under the token policy (0 without
        one): they are sent as they are with probability 1 − p and carry no guarantee, so the
        device ledger counts them apart from the tokens it charges."""
        if self.policy is None:
            return 0
        return int(sum(int(self.policy.public_mask(ids, cut).sum()) for ids, cut in item.parts()))

    # -- privatization ---------------------------------------------------------------------
    def privatize(self, texts: list[str], rng=None, *,
                  pairs: list[str] | None = None) -> list:
        """One payload per text (``pairs[i]`` is the second sentence of pair i)."""
        return self.privatize_tokenized(cast(list[TokenizedText], self.tokenize(texts, pairs)),
                                        rng)  # without allow_empty: no None

    def privatize_records(self, texts: list[str], labels: list, rng=None, *,
                          pairs: list[str] | None = None,
                          num_labels: int | None = None) -> list[Record]:
        """Labelled records; TextHide with k > 1 mixes labels into soft vectors."""
        return self.records_tokenized(cast(list[TokenizedText], self.tokenize(texts, pairs)),
                                      labels, num_labels, rng)

    def privatize_tokenized(self, items: list[TokenizedText], rng=None) -> list:
        """Payloads for already tokenized texts (no None entries)."""
        return self.payloads(items, self.privatize_data(items, rng))

    def privatize_data(self, items: list[TokenizedText], rng=None) -> np.ndarray:
        """The mechanism's output for tokenized texts, before payloads are built (the
        CLI builds them in another thread): token kinds (ΣL,) ids or (ΣL, n) embeddings
        of all items in order; vector kinds (b, r) vectors, OME (b, r·l) bits."""
        if not items:
            return np.empty(0)
        with _float_errors(self):
            return self._privatize_data(items, resolve_rng(rng))

    def _privatize_data(self, items: list[TokenizedText], rng) -> np.ndarray:
        if self.tokens:
            parts = [p for it in items for p in ((it.ids_a,) if it.ids_b is None
                                                   else (it.ids_a, it.ids_b))]
            # all tokens of the batch at once (dχ-text: one exact search per batch)
            ids = np.concatenate(parts)
            if self.policy is None:
                return self.mechanism.privatize_tokens(ids, self.bundle, rng)
            return self.mechanism.privatize_tokens(ids, self.bundle, rng,
                                                   public=self.public_mask(items))
        return self._mechanism_on_vectors(items, None, rng)[0]

    def payloads(self, items: list[TokenizedText], data: np.ndarray) -> list:
        """One payload per item around :meth:`privatize_data`'s output."""
        if not items:
            return []
        if not self.tokens:
            return self._vector_payloads(items, data)
        return make_payloads(self.name, self.params, self.bundle.bundle_id, data,
                             [it.n_tokens for it in items], [it.segments for it in items],
                             float_dtype=self.float_dtype)

    def record_lines(self, items: list[TokenizedText], data: np.ndarray,
                     labels: list | None) -> list[bytes]:
        """JSONL lines of the records around :meth:`privatize_data`'s output for a token
        mechanism (the CLI's output; ``edge_agent.privatize.record_lines``)."""
        return self.token_rows(items, data, labels).lines() if items else []

    def token_rows(self, items: list[TokenizedText], data: np.ndarray, labels: list | None):
        """``edge_agent.privatize.record_lines.TokenRows`` (payload JSONs and labels) around
        :meth:`privatize_data`'s output for a token mechanism."""
        return token_rows(self.name, self.params, self.bundle.bundle_id, data,
                          [it.n_tokens for it in items], [it.segments for it in items],
                          labels, float_dtype=self.float_dtype)

    def records_tokenized(self, items: list[TokenizedText], labels: list,
                          num_labels: int | None = None, rng=None) -> list[Record]:
        """Records for already tokenized texts with their labels."""
        if len(labels) != len(items):
            raise ValueError(f"labels must have one entry per text ({len(items)}), "
                             f"got {len(labels)}")
        if not items:
            return []
        rng = resolve_rng(rng)
        if self.mechanism.mixes:
            if len(items) < self.mechanism.k:
                raise ValueError(f"TextHide k={self.mechanism.k} mixes {self.mechanism.k} "
                                 f"labelled texts; got only {len(items)}")
            onehot = one_hot(labels, num_labels)
            with _float_errors(self):
                vecs, mixed = self._mechanism_on_vectors(items, onehot, rng)
            payloads = self._vector_payloads(items, vecs)
            return [Record(payload=p, label=[float(x) for x in row])
                    for p, row in zip(payloads, cast(np.ndarray, mixed), strict=True)]
        payloads = self.privatize_tokenized(items, rng)
        return labelled(payloads, labels)

    def _vector_payloads(self, items: list[TokenizedText], vecs: np.ndarray) -> list:
        return [make_payload(self.name, self.params, self.bundle.bundle_id, v)
                for v in vecs]

    def sequences(self, items: list[TokenizedText], rng
                  ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Encoder inputs ``[CLS] a [SEP] (b [SEP])`` and token types, after word dropout.

        DPNR word dropout (Lyu et al. 2020 §3.3, Theorem 2 is about neighbouring
        texts that differ in one word): each word is removed independently with
        probability μ, all its word pieces together; [CLS]/[SEP] never are.
        """
        mu = self.word_dropout
        cls, sep = self.special["cls"], self.special["sep"]
        seqs, types = [], []
        for it in items:
            a, b = it.ids_a, it.ids_b
            if mu > 0:
                a = _drop_words(a, it.words_a, mu, rng)
                b = None if b is None else _drop_words(b, it.words_b, mu, rng)
            first = np.concatenate([[cls], a, [sep]]).astype(np.int64)
            if b is None:
                seqs.append(first)
                types.append(np.zeros(first.size, dtype=np.int64))
            else:
                second = np.concatenate([b, [sep]]).astype(np.int64)
                seqs.append(np.concatenate([first, second]))
                types.append(np.concatenate([np.zeros(first.size, dtype=np.int64),
                                             np.ones(second.size, dtype=np.int64)]))
        return seqs, types

    def _mechanism_on_vectors(self, items: list[TokenizedText], onehot: np.ndarray | None,
                              rng) -> tuple[np.ndarray, np.ndarray | None]:
        seqs, types = self.sequences(items, rng)
        encoder = cast("SentenceEncoder", self.encoder)  # vector kinds have one
        return self.mechanism.privatize_vectors(encoder.encode(seqs, types), onehot, rng)


@contextmanager
def _float_errors(priv: Privatizer) -> Iterator[None]:
    """numpy overflow / invalid / divide-by-zero in the mechanism become one ValueError,
    never a RuntimeWarning on stderr (per thread: the CLI's workers call this too)."""
    try:
        with np.errstate(over="raise", invalid="raise", divide="raise", under="ignore"):
            yield
    except FloatingPointError as exc:
        raise ValueError(f"{priv.name} {priv.params}: the computation is not finite in "
                         f"floating point ({exc})") from None


def _drop_words(ids: np.ndarray, words: np.ndarray | None, mu: float, rng) -> np.ndarray:
    """``ids`` without the pieces of the words dropped: one draw per word."""
    if words is None or len(words) != len(ids):
        raise ValueError("word dropout needs the word of each piece: tokenize the texts with "
                         "this Privatizer")
    if ids.size == 0:
        return ids
    keep = rng.random(int(words[-1]) + 1) >= mu
    return ids[keep[words]]


def labelled(payloads: list, labels: list | None) -> list[Record]:
    """Records of payloads and their labels (None: unlabelled records)."""
    if labels is None:
        return [Record(payload=p) for p in payloads]
    return [Record(payload=p, label=lab) for p, lab in zip(payloads, labels, strict=True)]


def one_hot(labels: list, num_labels: int | None) -> np.ndarray:
    """(b, c) one-hot rows of integer labels in [0, c); c defaults to max(2, max + 1)."""
    if any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) for x in labels):
        raise ValueError("TextHide with k > 1 mixes labels: labels must be integers")
    lab = np.asarray(labels, dtype=np.int64)
    c = int(num_labels) if num_labels is not None else max(2, int(lab.max()) + 1)
    if lab.min() < 0 or lab.max() >= c:
        raise ValueError(f"labels must be in [0, {c}) (num_labels={c}), got "
                         f"{int(lab.min())}..{int(lab.max())}")
    return np.eye(c)[lab]
