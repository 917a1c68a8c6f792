"""Token policies: the public words a bundle may send as they are (SanText+, Yue et al. 2021).

dχ-privacy spends the same noise on every token, so "the" costs as much as a name. SanText+
(Yue et al., Findings of ACL 2021, §3.3) splits the vocabulary: words that carry no secret
(stop words, punctuation) are sent unchanged with probability 1 − p and privatized otherwise;
every other word is privatized always. The guarantee then covers the words outside the public
list only: public words have none, between themselves or against any other word.

A policy is part of the edge bundle (``bundle.json``'s ``policy`` block: its name, source,
size, the list of tokens and their SHA-256; the bundle id covers it), so a payload's bundle id
names its policy. The payload's parameters say that it was applied (``public_p``, the
probability that a public word is privatized anyway).

A list is public by construction: every token of a bundle's list must be one of
:data:`REFERENCE` (function words of a well-kept package's stop list, and ASCII punctuation),
which the edge ships; a list with any other word -- a content word, or anything fitted on
private data -- is refused in one line. Which word pieces are public in a text is decided
word by word: a piece is public only when it is a whole word (no ``##`` piece follows it), so
"the" of "the ##a" (a rare word split into pieces) is privatized like the rest of its word.

Pure numpy, no I/O: :mod:`shared.bundle` stores and verifies the block, the dχ mechanisms
(:mod:`shared.mechanisms.dchi`) apply it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shared import messages as msg

# scikit-learn's ENGLISH_STOP_WORDS (sklearn/feature_extraction/_stop_words.py, the Glasgow
# Information Retrieval Group's list, BSD-3-Clause), verbatim; tests/shared/test_policy.py
# compares it with the installed package.
SKLEARN_STOP_WORDS = (
    "a about above across after afterwards again against all almost alone along already also "
    "although always am among amongst amoungst amount an and another any anyhow anyone "
    "anything anyway anywhere are around as at back be became because become becomes "
    "becoming been before beforehand behind being below beside besides between beyond bill "
    "both bottom but by call can cannot cant co con could couldnt cry de describe detail do "
    "done down due during each eg eight either eleven else elsewhere empty enough etc even "
    "ever every everyone everything everywhere except few fifteen fifty fill find fire first "
    "five for former formerly forty found four from front full further get give go had has "
    "hasnt have he hence her here hereafter hereby herein hereupon hers herself him himself "
    "his how however hundred i ie if in inc indeed interest into is it its itself keep last "
    "latter latterly least less ltd made many may me meanwhile might mill mine more moreover "
    "most mostly move much must my myself name namely neither never nevertheless next nine "
    "no nobody none noone nor not nothing now nowhere of off often on once one only onto or "
    "other others otherwise our ours ourselves out over own part per perhaps please put "
    "rather re same see seem seemed seeming seems serious several she should show side since "
    "sincere six sixty so some somehow someone something sometime sometimes somewhere still "
    "such system take ten than that the their them themselves then thence there thereafter "
    "thereby therefore therein thereupon these they thick thin third this those though three "
    "through throughout thru thus to together too top toward towards twelve twenty two un "
    "under until up upon us very via was we well were what whatever when whence whenever "
    "where whereafter whereas whereby wherein whereupon wherever whether which while whither "
    "who whoever whole whom whose why will with within without would yet you your yours "
    "yourself yourselves").split()

# Words of that list that can carry content, and so a secret (Nothman, Qin & Yurchak 2018,
# "Stop Word Lists in Free Open-source Software Packages", name most of them): numbers (an
# age, a count), nouns, verbs and adjectives, abbreviations and misspellings.
CONTENT_WORDS = frozenset(
    "eight eleven fifteen fifty first five forty four hundred last nine one six sixty ten "
    "third three twelve twenty two "
    "amount back bill bottom call cry describe detail empty fill find fire found front full "
    "get give go interest keep made mill mine move name part put see serious show side "
    "sincere system take thick thin top well whole "
    "co con de eg etc ie inc ltd re un amoungst cant couldnt hasnt noone thru".split())

# Negations and intensifiers carry meaning, and can carry a secret ("not pregnant"): a list
# may leave them out (the default does: docs/privacy.md and bench/results/frontier.md say why).
NEGATIONS_AND_INTENSIFIERS = frozenset(
    "not no nor never nothing none nobody neither nowhere cannot without against but however "
    "although though yet very too so much more most less least few only enough even rather "
    "still already again".split())

PUNCTUATION = tuple(".,!?'\"()-:;")  # ASCII punctuation that names nothing ($, @, # may)

FUNCTION_WORDS = tuple(w for w in SKLEARN_STOP_WORDS if w not in CONTENT_WORDS)
# the most any bundle's list may hold: what an edge accepts as public
REFERENCE = frozenset(FUNCTION_WORDS) | frozenset(PUNCTUATION)
SOURCE = ("scikit-learn's English stop words (ENGLISH_STOP_WORDS) less the words that can "
          "carry content (numbers, nouns, verbs, abbreviations: shared.policy.CONTENT_WORDS), "
          "and ASCII punctuation")

# the named lists a bundle can be built with (``cloud-api export-bundle --policy NAME``)
POLICIES: dict[str, tuple[str, ...]] = {
    "function-words": tuple(sorted(
        {w for w in FUNCTION_WORDS if w not in NEGATIONS_AND_INTENSIFIERS} | set(PUNCTUATION))),
    "function-words+negations": tuple(sorted(REFERENCE)),
}
NO_POLICY = "none"  # today's behaviour, by name: every token privatized
DEFAULT_P = 0.3  # SanText+'s default p (Yue et al. 2021 §4.1)
# what new dchi-text models on the packaged MiniLM get (bench/results/frontier.md decides: at
# matched privacy by token class it keeps more accuracy than every token privatized; the
# negations and intensifiers stay privatized, since they can carry a secret: "not pregnant")
DEFAULT_POLICY = "function-words"


def policy_for_new_model(mechanism: str, policy: str | None, bundle_given: bool) -> str:
    """The token policy a new model is trained under: ``policy`` when one is asked for;
    :data:`DEFAULT_POLICY` for ``dchi-text`` on the packaged MiniLM (no bundle or base model
    given); else none."""
    if policy is not None:
        return policy
    if not bundle_given and mechanism == "dchi-text":
        return DEFAULT_POLICY
    return NO_POLICY


def policy_name(text: str) -> str:
    """A ``--policy`` value: one of :data:`POLICIES` or "none" (PolicyError otherwise)."""
    name = text.strip()
    if name != NO_POLICY and name not in POLICIES:
        raise PolicyError(f"unknown token policy {text!r}: one of {', '.join(POLICIES)} or "
                          f"{NO_POLICY}")
    return name
CONTINUATION_PREFIX = "##"  # a WordPiece that continues the word before it


class PolicyError(ValueError):
    """A token policy that cannot be used (one line: what is wrong, and what to do)."""


def tokens_digest(tokens: Sequence[str]) -> str:
    """SHA-256 of the sorted token list as compact JSON (what ``bundle.json`` records)."""
    return hashlib.sha256(json.dumps(sorted(tokens), ensure_ascii=False,
                                     separators=(",", ":")).encode()).hexdigest()


def policy_block(name: str, vocab: Mapping[str, int], regular: np.ndarray) -> dict[str, Any]:
    """``bundle.json``'s ``policy`` block for the named list on a tokenizer's ``vocab``: the
    listed words that are regular tokens of this vocabulary (whole words of one piece)."""
    if name not in POLICIES:
        raise PolicyError(f"unknown token policy {name!r}: one of {', '.join(POLICIES)} "
                          f"(or {NO_POLICY})")
    is_regular = np.zeros(max(vocab.values(), default=-1) + 1, dtype=bool)
    is_regular[np.asarray(regular, dtype=np.int64)] = True
    tokens = sorted(t for t in POLICIES[name]
                    if t in vocab and vocab[t] < is_regular.size and is_regular[vocab[t]])
    if not tokens:
        raise PolicyError(f"token policy {name}: none of its words is a token of this vocabulary")
    return {"name": name, "source": SOURCE, "size": len(tokens), "tokens": tokens,
            "sha256": tokens_digest(tokens)}


@dataclass(frozen=True)
class TokenPolicy:
    """A bundle's public words, as token masks over its vocabulary."""

    name: str
    size: int
    digest: str
    public: np.ndarray        # (V,) bool: the listed tokens
    continuation: np.ndarray  # (V,) bool: the "##" pieces (never a whole word)

    @classmethod
    def from_block(cls, block: object, vocab: Mapping[str, int], regular: np.ndarray,
                   where: str = "bundle.json") -> TokenPolicy:
        """The policy of a ``policy`` block, checked whole: its digest, every token a regular
        token of ``vocab`` and one of :data:`REFERENCE`. PolicyError otherwise."""
        if not isinstance(block, dict):
            raise PolicyError(msg.POLICY_NOT_OBJECT.format(where=where))
        tokens, digest, name = block.get("tokens"), block.get("sha256"), block.get("name")
        if not isinstance(name, str) or not isinstance(digest, str) or not isinstance(
                tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise PolicyError(msg.POLICY_FIELDS.format(where=where))
        if tokens != sorted(set(tokens)) or block.get("size") != len(tokens):
            raise PolicyError(msg.POLICY_ORDER.format(where=where))
        if tokens_digest(tokens) != digest:
            raise PolicyError(msg.POLICY_DIGEST.format(where=where))
        outside = [t for t in tokens if t not in REFERENCE]
        if outside:
            raise PolicyError(msg.POLICY_NOT_PUBLIC.format(
                where=where, name=name, count=len(outside), example=repr(outside[0])))
        size = max(vocab.values(), default=-1) + 1
        is_regular = np.zeros(size, dtype=bool)
        is_regular[np.asarray(regular, dtype=np.int64)] = True
        public = np.zeros(size, dtype=bool)
        for t in tokens:
            i = vocab.get(t)
            if i is None or not is_regular[i]:
                raise PolicyError(msg.POLICY_NOT_REGULAR.format(where=where, name=name,
                                                                token=repr(t)))
            public[i] = True
        continuation = np.zeros(size, dtype=bool)
        for t, i in vocab.items():
            if t.startswith(CONTINUATION_PREFIX):
                continuation[i] = True
        public.setflags(write=False)
        continuation.setflags(write=False)
        return cls(name, len(tokens), digest, public, continuation)

    def public_mask(self, ids: np.ndarray, cut: bool = False) -> np.ndarray:
        """Which of ``ids`` (one text's word pieces, in order) are public: a listed token that
        is a whole word -- not a "##" piece and not followed by one. ``cut``: the text was
        truncated right after its last piece and the first piece dropped was a "##" piece
        (that last piece is then part of a longer word, never public)."""
        a = np.asarray(ids, dtype=np.int64)
        pub = self.public[a].copy()
        if a.size > 1:
            pub[:-1] &= ~self.continuation[a[1:]]
        if cut and a.size:
            pub[-1] = False
        return pub

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "sha256": self.digest}


def public_masks(policy: TokenPolicy, parts: Iterable[np.ndarray],
                 cuts: Iterable[bool] | None = None) -> np.ndarray:
    """:meth:`TokenPolicy.public_mask` of each text (segment) in ``parts``, concatenated."""
    parts = list(parts)
    cuts = list(cuts) if cuts is not None else [False] * len(parts)
    if not parts:
        return np.zeros(0, dtype=bool)
    return np.concatenate([policy.public_mask(p, c) for p, c in zip(parts, cuts, strict=True)])


def kept_public(public: np.ndarray, p: float, rng: np.random.Generator) -> np.ndarray:
    """Which tokens are sent as they are: each public token with probability 1 − p (one
    uniform double per public token, in order, from ``rng``: both edges draw the same), the
    others never."""
    public = np.asarray(public, dtype=bool)
    keep = np.zeros(public.shape, dtype=bool)
    n = int(public.sum())
    if n:
        keep[public] = rng.random(n) >= p
    return keep


# -- token classes: where recovery is measured ---------------------------------------------------
RARE_FROM = 4096  # a rare token: not among this many most frequent of public text


def stop_mask(vocab: Mapping[str, int], words: Iterable[str] = REFERENCE) -> np.ndarray:
    """(V,) bool: the tokens of ``vocab`` that are among ``words`` (by default the reference
    list: the standard stop list against which content tokens are told apart)."""
    size = max(vocab.values(), default=-1) + 1
    mask = np.zeros(size, dtype=bool)
    for w in words:
        if w in vocab:
            mask[vocab[w]] = True
    return mask


def rare_mask(counts: np.ndarray, regular: np.ndarray, top: int = RARE_FROM) -> np.ndarray:
    """(V,) bool: regular tokens outside the ``top`` most frequent by ``counts`` (token counts
    of public text; ties broken by id, as ``np.argsort(kind='stable')`` does)."""
    counts = np.asarray(counts)
    order = np.argsort(-counts, kind="stable")
    rare = np.zeros(counts.size, dtype=bool)
    rare[np.asarray(regular, dtype=np.int64)] = True
    rare[order[:top]] = False
    return rare
