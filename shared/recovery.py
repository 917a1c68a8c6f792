"""How much of a text an attacker recovers, by token class: where privacy is judged.

Recovery averaged over all tokens hides where the noise goes: function words sit in a dense
cluster of the table and are scrambled, content words are isolated and often sent as they
are, and rare words -- names, places, numbers: the words that identify a person -- are the
least protected. So every attack's recovery is split by class (issue 41):

* ``all``: every token;
* ``content``: not a public word -- a token of the standard stop list
  (:data:`shared.policy.REFERENCE`, which holds every list a bundle may carry) that is a
  whole word; the same tokens for every mechanism, table and policy, so that figures compare;
* ``rare``: outside the :data:`shared.policy.RARE_FROM` most frequent tokens of public text.

And by measure, for an attacker's ranked guesses ``g`` (n, k) of originals ``x`` (n,):

* ``exact``: the first guess is x (the attack's recovery);
* ``top5``: x is among the first five guesses;
* ``semantic``: the first guess is x or one of x's 10 nearest neighbours in the reference
  table (MiniLM's own 384-d word embeddings), so that a mechanism which only swaps a word for
  its synonym counts as no gain;
* ``unchanged``: the privatized token is x itself (what the mechanism sends as it came).

Pure numpy, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from shared.policy import RARE_FROM, REFERENCE, TokenPolicy, public_masks, rare_mask, stop_mask

CLASSES = ("all", "content", "rare")
MEASURES = ("exact", "top5", "semantic")
SEMANTIC_K = 10  # neighbours of the true token that count as a semantic recovery


@dataclass(frozen=True)
class TokenClasses:
    """Boolean masks over one concatenation of texts' tokens, one per class."""

    masks: dict[str, np.ndarray]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.masks[name]

    def sizes(self) -> dict[str, int]:
        return {k: int(v.sum()) for k, v in self.masks.items()}


def token_classes(seqs: list[np.ndarray], vocab: Mapping[str, int], regular: np.ndarray,
                  counts: np.ndarray, rare_from: int = RARE_FROM) -> TokenClasses:
    """The classes of the tokens of ``seqs`` (each text's word pieces, concatenated in
    order): ``counts`` are token counts of public text (the rare split)."""
    stop = stop_mask(vocab, REFERENCE)
    size = stop.size
    continuation = np.zeros(size, dtype=bool)
    for t, i in vocab.items():
        if t.startswith("##"):
            continuation[i] = True
    ref = TokenPolicy("reference", int(stop.sum()), "", stop, continuation)
    x = np.concatenate(seqs) if seqs else np.zeros(0, np.int64)
    public = public_masks(ref, seqs)
    rare = rare_mask(counts, regular, rare_from)
    return TokenClasses({"all": np.ones(x.size, dtype=bool), "content": ~public,
                         "rare": rare[x]})


def neighbour_table(table: np.ndarray, ids: np.ndarray, regular: np.ndarray,
                    k: int = SEMANTIC_K, chunk: int = 512) -> dict[int, np.ndarray]:
    """For each distinct id of ``ids``: its ``k`` nearest regular tokens in ``table``
    (Euclidean, itself excluded)."""
    t = np.asarray(table, dtype=np.float32)
    reg = np.asarray(regular, dtype=np.int64)
    r = t[reg]
    n2 = np.einsum("ij,ij->i", r, r)
    uniq = np.unique(np.asarray(ids, dtype=np.int64))
    out: dict[int, np.ndarray] = {}
    for s in range(0, uniq.size, chunk):
        q = uniq[s:s + chunk]
        d = n2[None, :] - 2.0 * (t[q] @ r.T)
        d[reg[None, :] == q[:, None]] = np.inf
        near = np.argpartition(d, k, axis=1)[:, :k]
        for i, row in zip(q.tolist(), near, strict=True):
            out[i] = reg[row]
    return out


def semantic_hits(x: np.ndarray, guess: np.ndarray, neighbours: dict[int, np.ndarray]
                  ) -> np.ndarray:
    """Whether each guess is x or one of x's neighbours (:func:`neighbour_table`)."""
    hit: np.ndarray = guess == x
    for i in np.flatnonzero(~hit):
        near = neighbours.get(int(x[i]))
        if near is not None and int(guess[i]) in near:
            hit[i] = True
    return hit


def recovery_by_class(x: np.ndarray, guesses: np.ndarray, classes: TokenClasses,
                      neighbours: dict[int, np.ndarray] | None = None
                      ) -> dict[str, dict[str, float | None]]:
    """{class: {measure: share}} for ranked ``guesses`` (n, k >= 1) of originals ``x``;
    ``top5`` needs k >= 5, ``semantic`` the neighbours."""
    g = np.asarray(guesses)
    if g.ndim == 1:
        g = g[:, None]
    first = g[:, 0]
    hits = {"exact": first == x}
    if g.shape[1] >= 5:
        hits["top5"] = (g[:, :5] == x[:, None]).any(axis=1)
    if neighbours is not None:
        hits["semantic"] = semantic_hits(x, first, neighbours)
    out: dict[str, dict[str, float | None]] = {}
    for c, mask in classes.masks.items():
        n = int(mask.sum())
        out[c] = {m: (float(h[mask].mean()) if n else None) for m, h in hits.items()}
        out[c]["tokens"] = n
    return out


def unchanged_by_class(x: np.ndarray, y: np.ndarray, classes: TokenClasses) -> dict[str, float]:
    """{class: share of tokens sent as they came}."""
    same = np.asarray(y) == np.asarray(x)
    return {c: (float(same[m].mean()) if m.any() else float("nan"))
            for c, m in classes.masks.items()}
