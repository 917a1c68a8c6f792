"""The text floor: what a server can decode from dχ-text on text as text is (issue 42).

The privacy floor (:mod:`shared.floor`) draws tokens uniformly from the vocabulary and counts
those that come back unchanged. A server chooses both the tokenizer and the table, so it can
make the few rows that text actually uses safe for itself (isolate the frequent word pieces,
split words into isolated characters, or group rows so that every output names its input)
while the vocabulary as a whole looks honest. For a bundle the edge does not know
(:mod:`shared.trust`), both edges therefore also measure the mechanism on a small sample of
public text shipped with the edge (``shared/public_text/``), tokenized by the bundle's own
tokenizer:

* **pieces per word**: the bundle's word pieces per whitespace word of the sample, against
  the public model's (``PUBLIC_PIECES_PER_WORD``): a tokenizer that splits words far finer
  (more than ``PIECES_RATIO`` times) is refused (its pieces are what the server reads back);
* **unchanged**: the share of the sample's tokens (special tokens such as [UNK] aside: they
  say nothing of the word) that the mechanism returns unchanged;
* **decoded**: the share a context-free Bayes decoder recovers (the context-free attack of
  ``bench/results/frontier.md``): y ↦ argmax_x P(x)·P̂(y|x), P(x) the token's share of the
  sample and the channel P̂(y|x) estimated from the mechanism's own outputs, drawn with OS
  entropy on the sample at every check. The occurrences are privatized in a random order
  (the whole sample up to ``ROUNDS`` times), ``TEXT_FIRST`` at first, then as many as were
  drawn; each draw is scored by the decoder estimated from every *other* draw (leave-one-out:
  a decoder is never scored on the draw it learnt from); an output no other draw produced
  is decoded as itself. It stops when the Wilson interval (z = 5, as the floor's) lies on
  one side of the line. The server, which knows its table, decodes at least this much.

A bundle whose decoded or unchanged share passes ``DECODE_LINE`` is refused. The line is far
from both sides of what is measured (docs/privacy.md gives the figures and the error rates):
the genuine tables at their matched η leave about a third decodable, the crafted layouts of
the issue 55–97%.

Under a token policy (:mod:`shared.policy`, issue 41) only the sample's tokens outside the
policy's public list are privatized and judged, as the privacy floor judges them
(:func:`shared.floor.floor_tokens`): a public word may go out as typed by design (with
probability 1 − p) and carries no guarantee, so counting it would refuse a genuine table for
what the policy does, and would say nothing of how the table treats the other words.

The sample is public (a server can fit a table to it): this floor bounds what a server
decodes on text like the sample; the bundles the edge knows are the defence against a
server that fits its table to the sample (docs/privacy.md). Pure numpy and tokenizers.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from shared import messages as msg
from shared.floor import MEASURE_Z, wilson_interval
from shared.rng import resolve_rng

if TYPE_CHECKING:
    from shared.bundle import EdgeBundle
    from shared.mechanisms.dchi import DChiText

SAMPLE_FILE = Path(__file__).resolve().parent / "public_text" / "sentences.txt"
DECODE_LINE = 0.5  # decoded (or unchanged) share of the sample's tokens above which it refuses
PIECES_RATIO = 1.5  # word pieces per word, against the public model's, above which it refuses
ROUNDS = 2  # at most this many privatizations of each occurrence of the sample
TEXT_FIRST = 1024  # draws of the first step (the decoder needs them to learn); each next
# step draws as many as were drawn
MIN_TOKENS = 200  # fewer readable tokens in the sample: the bundle cannot be measured
PUBLIC_PIECES_PER_WORD = 1.1269  # the packaged MiniLM tokenizer on the sample (tests/shared/test_trust.py)


@cache
def sample_sentences() -> tuple[str, ...]:
    """The public sample: one plain sentence per line (ASCII; written for privbert, CC0:
    ``shared/public_text/SOURCE.md``)."""
    text = SAMPLE_FILE.read_text(encoding="ascii")
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def sample_digest() -> str:
    """SHA-256 of the sample's file (the spec publishes it; the web edge's copy must match)."""
    return hashlib.sha256(SAMPLE_FILE.read_bytes()).hexdigest()


def sample_words() -> int:
    """Whitespace words of the sample (what pieces per word divides by)."""
    return sum(len(s.split()) for s in sample_sentences())


def sample_ids(bundle: EdgeBundle) -> np.ndarray:
    """The sample's word pieces under the bundle's tokenizer, sentence after sentence (no
    [CLS]/[SEP]; special tokens typed in text read as text, as the edge reads user text)."""
    tok = bundle.text_tokenizer()
    enc = tok.encode_batch(list(sample_sentences()), add_special_tokens=False)
    return np.array([i for e in enc for i in e.ids], dtype=np.int64)


def pieces_per_word(bundle: EdgeBundle) -> float:
    return int(sample_ids(bundle).size) / sample_words()


@dataclass(frozen=True)
class TextMeasure:
    """What the text floor measured on one bundle at one η."""

    pieces: int  # word pieces of the sample under the bundle's tokenizer
    words: int
    tokens: int  # readable (non-special) pieces: the occurrences privatized
    draws: int  # privatizations scored (at most tokens x ROUNDS)
    unchanged: int
    decoded: int

    @property
    def pieces_per_word(self) -> float:
        return self.pieces / self.words

    @property
    def unchanged_share(self) -> float:
        return self.unchanged / self.draws if self.draws else 0.0

    @property
    def decoded_share(self) -> float:
        return self.decoded / self.draws if self.draws else 0.0


def leave_one_out(x: np.ndarray, y: np.ndarray, prior: dict[int, int]) -> int:
    """How many draws (x[i] -> y[i]) the context-free Bayes decoder returns to their input
    when it is estimated from every *other* draw (leave-one-out: never scored on the draw it
    was estimated from): y ↦ argmax over x' of P(x')·P̂(y|x') = c(x')·n(x', y)/n(x'), c the
    sample's counts, n the draws' (without draw i); ties to x' == y, then the smaller id.
    An output no other draw produced is decoded as itself."""
    n_x: dict[int, int] = {}
    n_xy: dict[int, dict[int, int]] = {}  # y -> {x: draws of x that gave y}
    xs, ys = x.tolist(), y.tolist()
    for a, b in zip(xs, ys, strict=True):
        n_x[a] = n_x.get(a, 0) + 1
        row = n_xy.setdefault(b, {})
        row[a] = row.get(a, 0) + 1
    hits = 0
    for a, b in zip(xs, ys, strict=True):
        best: tuple[float, int, int] | None = None
        for c, n in n_xy[b].items():
            m, k = (n - 1, n_x[c] - 1) if c == a else (n, n_x[c])
            if m <= 0:
                continue
            key = ((prior[c] * m) / k, int(c == b), -c)
            if best is None or key > best:
                best = key
        hits += (b if best is None else -best[2]) == a
    return hits


def measure_text(mech: DChiText, rng: np.random.Generator | None = None, *,
                 line: float = DECODE_LINE) -> TextMeasure:
    """Privatize the sample's readable tokens with ``mech`` in an order drawn from ``rng``
    (OS entropy unless given), in steps of ``TEXT_FIRST`` then as many as were drawn, and
    score them, until the Wilson interval (z = ``MEASURE_Z``) of the larger of the decoded
    and unchanged shares lies on one side of ``line``, or the whole sample was drawn
    ``ROUNDS`` times (then the estimate decides). Under ``mech``'s token policy its public
    words are neither privatized nor judged."""
    rng = resolve_rng(rng)
    bundle = mech.bundle
    ids = sample_ids(bundle)
    special = np.array(sorted(set(bundle.special_ids.values())), dtype=np.int64)
    readable = ~np.isin(ids, special)
    policy = getattr(mech, "policy", None)
    if policy is not None:
        readable &= ~policy.public[ids]
    tokens = ids[readable]
    words = sample_words()
    if tokens.size < MIN_TOKENS or ids.size / words / PUBLIC_PIECES_PER_WORD > PIECES_RATIO:
        return TextMeasure(int(ids.size), words, int(tokens.size), 0, 0, 0)  # refused as it is
    prior: dict[int, int] = {}
    for a in tokens.tolist():
        prior[a] = prior.get(a, 0) + 1
    order = np.concatenate([rng.permutation(tokens.size) for _ in range(ROUNDS)])
    x = tokens[order]
    y = np.empty_like(x)
    drawn = decoded = unchanged = 0
    while drawn < x.size:
        size = min(max(drawn, TEXT_FIRST), x.size - drawn)
        chunk = x[drawn : drawn + size]
        # under a policy every token drawn is outside its list: privatized (no coin, as the
        # privacy floor's draws)
        y[drawn : drawn + size] = mech.privatize_ids(chunk, rng) if policy is None else \
            mech.privatize_ids(chunk, rng, public=np.zeros(size, dtype=bool))
        drawn += size
        unchanged = int((y[:drawn] == x[:drawn]).sum())
        decoded = leave_one_out(x[:drawn], y[:drawn], prior)
        lo, hi = wilson_interval(max(decoded, unchanged), drawn, MEASURE_Z)
        if lo > line or hi <= line:
            break
    return TextMeasure(int(ids.size), words, int(tokens.size), drawn, unchanged, decoded)


def text_floor_reason(mech: DChiText, rng: np.random.Generator | None = None,
                      measured: TextMeasure | None = None, *,
                      trust: str = "--trusted-bundles") -> str | None:
    """None if dχ-text at the mechanism's η passes the text floor on its bundle, else one
    line saying why (the bundle's tokenizer, or what a server decodes). ``trust``: how
    this edge trusts a bundle (the refusal names it)."""
    bundle = mech.bundle
    m = measured if measured is not None else measure_text(mech, rng)
    head = msg.TEXT_FLOOR_HEAD.format(bundle_id12=bundle.bundle_id[:12], eta=mech.eta)
    tail = msg.TEXT_FLOOR_TAIL.format(trust=trust)
    ratio = m.pieces_per_word / PUBLIC_PIECES_PER_WORD
    if ratio > PIECES_RATIO:
        return msg.TEXT_FLOOR_PIECES.format(head=head, ppw=m.pieces_per_word,
                                            public=PUBLIC_PIECES_PER_WORD, ratio=ratio,
                                            limit=PIECES_RATIO, tail=tail)
    if m.tokens < MIN_TOKENS:
        return msg.TEXT_FLOOR_UNREAD.format(head=head, tokens=m.tokens, pieces=m.pieces,
                                            least=MIN_TOKENS, tail=tail)
    share = max(m.decoded_share, m.unchanged_share)
    if share > DECODE_LINE:
        return msg.TEXT_FLOOR_DECODED.format(head=head, decoded=msg.pct(m.decoded_share),
                                             unchanged=msg.pct(m.unchanged_share),
                                             draws=m.draws, line=msg.pct(DECODE_LINE),
                                             tail=tail)
    return None


def spec_section() -> dict[str, Any]:
    """The text floor's constants as the mechanism spec publishes them."""
    return {"DECODE_LINE": DECODE_LINE, "PIECES_RATIO": PIECES_RATIO, "ROUNDS": ROUNDS,
            "TEXT_FIRST": TEXT_FIRST, "MIN_TOKENS": MIN_TOKENS, "PUBLIC_PIECES_PER_WORD": PUBLIC_PIECES_PER_WORD,
            "sample_sha256": sample_digest(), "sample_words": sample_words()}
