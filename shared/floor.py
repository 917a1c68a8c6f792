"""The privacy floor: parameters that leave the output (nearly) the raw input are refused.

One rule for every mechanism, with one threshold τ (default 0.97, ``docs/privacy.md`` says
why): a mechanism is *weaker than the floor* when, with probability above τ, a unit of its
output is a fixed function of the input -- the noise does not change it beyond rounding -- or
when its worst-case ε is not finite (some output then certifies the input).

* dχ-privacy (Qu et al. 2021 §3.2, §5.4), unit = token: the probability that the regular
  token nearest to φ(x) + N is x itself, for x uniform over the bundle's regular tokens. That
  is what ``dchi-text`` sends, and the nearest-token guess of an attacker reading
  ``dchi-embedding``. The bundle comes from a server the device need not trust, so the floor
  trusts nothing about its table:

  - it **measures the output directly** (:func:`measure_unchanged`): the mechanism itself
    privatizes regular tokens (under a token policy, the tokens outside its public list:
    :func:`floor_tokens`) drawn uniformly with OS entropy at each check (never a fixed
    seed a hostile table could be fitted to), 128 at a time, until a Wilson score interval
    at z = 5 puts the share that comes back unchanged clearly on one side of τ, or 2,048
    have been drawn (then the estimate decides; its standard error is at most 0.011);
  - it refuses a **degenerate table** (:func:`table_problem`): identical or nearly identical
    regular rows, which no honest projection produces;
  - the analytic estimate (:class:`DChiFloor`: along a direction u the nearest-token cell
    of x is left at s*(x, u) = min over t with u·(t-x) > 0 of ||t-x||² / (2 u·(t-x)), so
    Pr[unchanged | x, u] = Pr[Gamma(n, 1) <= η s*]) only says, in a refusal and in the
    privacy report, near which η the floor starts; its pairs too are drawn afresh.
* Laplace (DPNR, Lyu et al. 2020 §3.3), unit = sentence vector: the probability that every
  coordinate's noise stays within one float32 step at 1 (2^-23, the coarsest rounding of a
  value in [0, 1] on the wire): (1 - e^(-2^-23/b))^r.
* Bit mechanisms (OME, Lyu et al. 2020 SIGIR §3.1; SUE, OUE), unit = bit vector: a lower
  bound on the probability that every bit is its most likely value given the input bit,
  Π_i min(max(p_i, 1-p_i), max(q, 1-q)). OME with a huge λ keeps the even bits and zeroes
  the odd ones: deterministic although no bit is "unchanged".
* TextHide has no ε to judge (no differential-privacy guarantee): no floor.

Parameters the float arithmetic cannot carry are refused by :func:`check_computable`
with a plain ValueError naming the parameter. Pure numpy, no I/O.

Each mechanism's floor (and computability check) is in its own module
(``shared/mechanisms/``), registered in the registry's ``FLOOR`` (``COMPUTABLE``) table;
this module holds the rule, the measurements they share and the dχ measurement.
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from shared import messages as msg
from shared.accounting import sentence_vector_dim
from shared.mechanisms.registry import as_mechanism
from shared.rng import resolve_rng

if TYPE_CHECKING:
    from shared.bundle import EdgeBundle

THRESHOLD = 0.97
FLOOR_TOKENS = 1000  # (token, direction) pairs of the dχ analytic estimate
MEASURE_FIRST = 32  # tokens of the direct measurement's first step; each next step draws
MEASURE_BATCH = 128  # as many as were drawn so far, at most this many
MEASURE_MAX = 2048  # at most this many, then the estimate decides
MEASURE_Z = 5.0  # the Wilson interval's z: each look errs with probability < 3e-7 (18 at most)
NEAR_DUPLICATE = 1e-3  # rows nearer than this share of the median nearest-row distance
DUPLICATE_SAMPLE = 256  # rows whose nearest other row is measured (drawn afresh)
DIRECTIONS = 256  # distinct directions among them on a large table
SHARED_DIRECTIONS_ABOVE = 5e8  # table values x pairs above which the pairs share DIRECTIONS
ESTIMATE_TOKENS = 256  # (token, direction) pairs of the estimate a dχ refusal quotes
ESTIMATE_RTOL = 1e-4  # relative precision of the η the estimate quotes
LAPLACE_STEP = float(np.finfo(np.float32).eps)  # 2^-23: the float32 step at 1


class WeakPrivacyError(ValueError):
    """The mechanism's parameters are weaker than the privacy floor (one-line message)."""


# -- dχ: probability a token comes back unchanged ---------------------------------------------
def gamma_cdf(n: int, z: np.ndarray) -> np.ndarray:
    """Pr[Gamma(n, 1) <= z] for an integer shape n >= 1: 1 - Pr[Poisson(z) <= n - 1]."""
    z = np.asarray(z, dtype=np.float64)
    out = np.where(z > 0, 1.0, 0.0)
    mid = np.flatnonzero((z > 0) & np.isfinite(z))
    if mid.size:
        k = np.arange(n, dtype=np.float64)
        log_fact = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n, dtype=np.float64)))])
        zm = z.reshape(-1)[mid]
        terms = k[None, :] * np.log(zm)[:, None] - zm[:, None] - log_fact[None, :]
        top = terms.max(axis=1)
        log_q = top + np.log(np.exp(terms - top[:, None]).sum(axis=1))
        out.reshape(-1)[mid] = -np.expm1(np.minimum(log_q, 0.0))
    return out


class DChiFloor:
    """Exit distances s*(x, u) of ``tokens`` (regular token, uniform direction) pairs of a
    bundle's table; :meth:`unchanged` and :meth:`floor_eta` read them for any η. The pairs
    are drawn from ``rng`` (OS entropy unless a generator or an int seed is given)."""

    def __init__(self, table: np.ndarray, tokens: int = FLOOR_TOKENS,
                 rng: np.random.Generator | int | None = None, chunk: int = 256):
        t = np.ascontiguousarray(table, dtype=np.float32)
        v, dim = t.shape
        self.dim: int = dim
        rng = np.random.default_rng(rng) if isinstance(rng, int) else resolve_rng(rng)
        rows = (np.resize(rng.permutation(v), tokens) if tokens >= v
                else rng.choice(v, size=tokens, replace=False))
        # directions: a pool of uniform unit vectors, pair i uses direction i mod pool (each
        # pair is still a uniform token with a uniform direction). A large table gets
        # DIRECTIONS of them (one GEMM of that many rows instead of one per pair); a small
        # one a direction per pair, as the shared directions would dominate its variance.
        ndir = rows.size if t.size * rows.size <= SHARED_DIRECTIONS_ABOVE else min(rows.size, DIRECTIONS)
        u = rng.standard_normal((ndir, self.dim))
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        u = u.astype(np.float32)
        which = np.arange(rows.size) % u.shape[0]
        self.rows, self.directions, self.which = rows, u, which  # pair i: rows[i], u[which[i]]
        ut_all = u @ t.T  # (directions, V)
        # identical rows: the exact search returns the lowest row, the others never
        inverse, counts = identical_groups(t)
        dup = np.flatnonzero(counts[inverse] > 1)  # ascending
        same: dict[int, list[int]] = {}  # row -> all rows equal to it (ascending)
        for g in np.unique(inverse[dup]):
            members = dup[inverse[dup] == g].tolist()
            same.update(dict.fromkeys(members, members))
        norms = np.einsum("ij,ij->i", t, t)
        self.t_max = float(np.sqrt(norms.max()))  # max ||phi(x)||: the worst case eta x 2 t_max
        t_aug = np.concatenate([-2.0 * t, norms[:, None], np.ones((v, 1), np.float32)], axis=1)
        self.exit = np.empty(rows.size, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            for s in range(0, rows.size, chunk):
                r = rows[s : s + chunk]
                c, w, x = r.size, which[s : s + chunk], t[r]
                x_aug = np.concatenate([x, np.ones((c, 1), np.float32), norms[r][:, None]],
                                       axis=1)
                d = x_aug @ t_aug.T  # ||t - x||^2
                np.maximum(d, 0.0, out=d)
                a = np.take(ut_all, w, axis=0)
                a -= np.einsum("ij,ij->i", u[w], x)[:, None]  # u.(t - x)
                d[np.arange(c), r] = np.inf  # not its own neighbour
                for k, i in enumerate(r):
                    if int(i) in same:
                        d[k, same[int(i)]] = np.inf
                # min over a > 0 of d/(2a) = 1/(2 max a/d): rows with a <= 0 never win. A
                # near-duplicate whose d and a both round to 0 gives 0/0: fmax skips that NaN
                # (max would return it and make the pair's exit inf, hiding every other row)
                a /= d
                best = np.fmax.reduce(a, axis=1).astype(np.float64)
                ex = np.where(best > 0, 0.5 / best, np.inf)
                for k, i in enumerate(r):  # a duplicate with a lower row wins every tie
                    if int(i) in same and same[int(i)][0] < i:
                        ex[k] = 0.0
                self.exit[s : s + c] = ex

    def unchanged(self, eta: float) -> float:
        """Estimated Pr[the nearest regular token of φ(x) + N is x] at ``eta``."""
        with np.errstate(over="ignore", invalid="ignore"):
            z = float(eta) * self.exit
        return float(gamma_cdf(self.dim, z).mean())

    def floor_eta(self, threshold: float = THRESHOLD, rtol: float = ESTIMATE_RTOL) -> float:
        """The smallest η (to ``rtol``) at which :meth:`unchanged` exceeds ``threshold``;
        inf if none does, 0 if every η does."""
        if float(np.mean(self.exit > 0)) <= threshold:
            return math.inf
        if float(np.mean(np.isinf(self.exit))) > threshold:
            return 0.0
        finite = self.exit[np.isfinite(self.exit) & (self.exit > 0)]
        lo = hi = self.dim / float(np.median(finite))
        while self.unchanged(hi) <= threshold:
            lo, hi = hi, hi * 2.0
        while lo > 1e-300 and self.unchanged(lo) > threshold:
            lo, hi = lo / 2.0, lo
        while hi / lo > 1.0 + rtol:
            mid = math.sqrt(lo * hi)
            if self.unchanged(mid) > threshold:
                hi = mid
            else:
                lo = mid
        return hi


def dchi_floor(bundle: EdgeBundle, tokens: int = FLOOR_TOKENS,
               rng: np.random.Generator | int | None = None) -> DChiFloor:
    """The analytic :class:`DChiFloor` of a bundle's privatization table (``bundle.table``:
    the model's embeddings or a designed table), its pairs drawn afresh from ``rng``."""
    reg = np.asarray(bundle.regular_ids)
    return DChiFloor(bundle.table[reg], tokens, rng)


def dchi_floor_eta(bundle: EdgeBundle, threshold: float = THRESHOLD,
                   rng: np.random.Generator | int | None = None) -> float:
    """The η at which dχ-privacy on this bundle starts to be weaker than the floor (an
    estimate: the analytic floor on pairs drawn from ``rng``)."""
    return dchi_floor(bundle, rng=rng).floor_eta(threshold)


# -- dχ: the table itself ------------------------------------------------------------------------
_IDENTICAL: dict[tuple[str | None, str | None, str], str | None] = {}  # table key -> answer


def table_problem(bundle: EdgeBundle, rng: np.random.Generator | None = None) -> str | None:
    """None for a usable privatization table, else why it is degenerate (one clause):
    identical regular rows (all of them compared; the answer is kept per table content in
    this process, as the table is verified against its hash when the bundle is loaded), or a
    regular row nearer to another than ``NEAR_DUPLICATE`` of the median nearest-row distance
    (``DUPLICATE_SAMPLE`` rows drawn from ``rng`` at every call, OS entropy by default: the
    web edge draws the same rows from the same generator)."""
    reg = np.asarray(bundle.regular_ids, dtype=np.int64)
    files = bundle.meta.get("files") or {}
    key = (files.get("table.npy") or files.get("embeddings.npy"), files.get("table_scale.npy"),
           hashlib.sha256(reg.tobytes()).hexdigest())
    table = np.ascontiguousarray(bundle.table[reg], dtype=np.float32)
    if key not in _IDENTICAL:
        _IDENTICAL[key] = _identical_rows(table)
    return _IDENTICAL[key] or _near_duplicates(table, resolve_rng(rng))


def identical_groups(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(inverse, counts): the group of bit-identical rows each row of ``t`` belongs to, and
    each group's size (``np.unique`` over the rows' bytes, -0.0 read as 0.0: the same point)."""
    t = np.ascontiguousarray(t)
    if np.signbit(t[t == 0]).any():
        t = np.where(t == 0, np.zeros((), t.dtype), t)
    rows = t.view(np.dtype((np.void, t.dtype.itemsize * t.shape[1]))).ravel()
    _, inverse, counts = np.unique(rows, return_inverse=True, return_counts=True)
    return inverse.ravel(), counts


def _identical_rows(t: np.ndarray) -> str | None:
    """Bit-identical rows of ``t``: how many regular tokens share how many rows."""
    if not np.all(np.isfinite(t)):
        return msg.TABLE_NON_FINITE
    subnormal = int(np.count_nonzero((t != 0) & (np.abs(t) < np.finfo(np.float32).tiny)))
    if subnormal:  # distances between such rows round to nothing (a table scaled by 1e-39)
        return msg.TABLE_SUBNORMAL.format(values=subnormal)
    _, counts = identical_groups(t)
    groups = counts[counts > 1]
    if groups.size:
        return msg.TABLE_IDENTICAL.format(tokens=int(groups.sum()), rows=t.shape[0],
                                          groups=int(groups.size))
    return None


def _near_duplicates(t: np.ndarray, rng: np.random.Generator) -> str | None:
    n = min(DUPLICATE_SAMPLE, t.shape[0])
    if n < 2:
        return None
    picked = rng.choice(t.shape[0], size=n, replace=False)
    norms = np.einsum("ij,ij->i", t, t)
    d2 = norms[picked][:, None] + norms[None, :] - 2.0 * (t[picked] @ t.T)  # float32: which
    d2[np.arange(n), picked] = np.inf
    nearest = d2.argmin(axis=1)
    diff = t[picked].astype(np.float64) - t[nearest].astype(np.float64)  # exact: how near
    dist = np.sqrt(np.einsum("ij,ij->i", diff, diff))
    median = float(np.median(dist))
    close = int((dist < NEAR_DUPLICATE * median).sum())
    if median > 0 and close:
        return msg.TABLE_NEAR_DUPLICATES.format(close=close, n=n, near=NEAR_DUPLICATE)
    return None


# -- dχ: the output, measured ----------------------------------------------------------------------
def wilson_interval(k: int, n: int, z: float = MEASURE_Z) -> tuple[float, float]:
    """The Wilson score interval of a binomial share k/n at ``z`` (both edges compute it so)."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def measure_unchanged(mech: Any, bundle: EdgeBundle, *,
                      threshold: float = THRESHOLD, rng: np.random.Generator | None = None,
                      first: int = MEASURE_FIRST, batch: int = MEASURE_BATCH,
                      most: int = MEASURE_MAX) -> tuple[int, int]:
    """(unchanged, drawn): regular tokens drawn uniformly from ``rng`` (OS entropy by
    default) and privatized by the mechanism at its η, until the Wilson interval lies on
    one side of ``threshold`` or ``most`` were drawn. ``mech``: a dχ mechanism, measured
    through its ``floor_text(bundle)`` (``dchi-embedding``: whether the nearest regular
    token of the noisy row is the token, the attacker's guess).

    Steps of ``first``, then as many as were drawn, at most ``batch`` (32, 32, 64, 128,
    128, ...): an η far from the line, as every usable one is, is decided by 32 tokens
    (the Wilson bound at z = 5 for a third unchanged is 0.72), the page's first
    privatization waits for no more."""
    rng = resolve_rng(rng)
    text = mech.floor_text(bundle)
    reg = floor_tokens(mech, bundle)
    same = drawn = 0
    while drawn < most:
        # distinct within a step, independent between steps (numpy's choice: the web edge
        # draws the same tokens from the same generator)
        size = min(max(drawn, first), batch, most - drawn, reg.size)
        x = reg[rng.choice(reg.size, size=size, replace=False)]
        same += int((text.privatize_ids(x, rng, public=np.zeros(x.size, dtype=bool)) == x
                     ).sum())
        drawn += x.size
        lo, hi = wilson_interval(same, drawn)
        if hi <= threshold or lo > threshold:
            break
    return same, drawn


def floor_tokens(mech: Any, bundle: EdgeBundle) -> np.ndarray:
    """The tokens the dχ floor draws from: the bundle's regular tokens, less the public words
    of the mechanism's token policy (which carry no guarantee: the floor judges the others)."""
    reg = np.asarray(bundle.regular_ids, dtype=np.int64)
    policy = getattr(mech, "policy", None)
    if policy is not None:
        reg = reg[~policy.public[reg]]
    return reg


# -- the floor ----------------------------------------------------------------------------------
def vector_dim(mechanism: Any, bundle: EdgeBundle | None, dim: int | None) -> int:
    """r, the sentence-vector size a vector mechanism's floor is judged at: ``dim``, else
    the bundle's (ValueError without either)."""
    if dim is None and bundle is not None:
        dim = sentence_vector_dim(bundle)
    if dim is None:
        raise ValueError(f"{mechanism.name}: pass the bundle (or dim) to check the privacy floor")
    return int(dim)


# -- the floor of a mechanism (its own module registers it) ----------------------------------


def weak_privacy_reason(mechanism: Any, bundle: EdgeBundle | None = None, *,
                        threshold: float = THRESHOLD, dim: int | None = None,
                        rng: np.random.Generator | None = None) -> str | None:
    """None if ``mechanism`` (a ``shared.mechanisms`` object, or the name "none") passes the
    floor on ``bundle``, else one line saying why: ``mechanism.weak_privacy_reason(...)``.
    ``dim``: the sentence-vector size r for Laplace when no bundle is given. ``rng``: what
    the dχ measurement draws from (OS entropy by default; a seeded generator only for
    reproducible tests)."""
    if not (isinstance(threshold, (int, float)) and 0.0 < threshold < 1.0):
        raise ValueError(f"threshold must be in (0, 1), got {threshold!r}")
    return as_mechanism(mechanism).weak_privacy_reason(bundle, threshold=threshold, dim=dim,
                                                       rng=rng)


def require_privacy_floor(mechanism: Any, bundle: EdgeBundle | None = None, *,
                          allow_weak: bool = False, threshold: float = THRESHOLD,
                          dim: int | None = None,
                          rng: np.random.Generator | None = None) -> str | None:
    """Raise :class:`WeakPrivacyError` if ``mechanism`` is weaker than the floor, unless
    ``allow_weak``; return the reason (None if it passes) so a caller can say that its
    output is close to the raw text."""
    reason = weak_privacy_reason(mechanism, bundle, threshold=threshold, dim=dim, rng=rng)
    if reason is not None and not allow_weak:
        raise WeakPrivacyError(reason)
    return reason


# -- parameters the arithmetic cannot carry ------------------------------------------------------
def check_computable(mechanism: Any, bundle: EdgeBundle | None = None, *,
                     dim: int | None = None, float_dtype: str = "float32") -> None:
    """ValueError (one line naming the parameter) if ``mechanism``'s parameters make the
    noise or the output non-finite in the arithmetic the edge uses. ``float_dtype``: the
    dtype of dχ-embedding payloads. ``mechanism.check_computable(...)``."""
    as_mechanism(mechanism).check_computable(bundle, dim=dim, float_dtype=float_dtype)


