"""The device ledger's part in one ``edge-agent privatize`` run.

* Before anything is written or sent: when the ledger has a cap (or for ``--dry-run``), the
  whole input is read and tokenized once (:meth:`RunBudget.plan`) to know what the run will
  cost, memoized texts aside; a run that would pass the cap is refused (exit 3).
* Each batch is then charged (:meth:`RunBudget.charge`) from the payloads themselves, in one
  transaction committed before its lines are written or posted; memoized texts get their
  stored payload, byte for byte, at no cost. A concurrent process may have spent in the
  meantime: the batch charge checks again and refuses rather than pass the cap.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from edge_agent.budget.ledger import DeviceLedger, Status
from edge_agent.errors import BudgetRefused
from edge_agent.privatize.options import PrivatizeOptions
from shared import ledger
from shared.accounting import bundle_diameter
from shared.conventions import fmt_eps as fmt
from shared.ledger import Cost


@dataclass
class Plan:
    """What a run will cost: ``cost`` of its new payloads (None: nothing to charge),
    ``records`` in all, ``memoized`` of them free."""

    cost: Cost | None
    records: int
    memoized: int


class RunBudget:
    """Charges one run's payloads to the device ledger."""

    def __init__(self, opts: PrivatizeOptions, priv, bundle):
        self.ledger = DeviceLedger.open(opts.ledger.path)
        self.priv = priv
        self.bundle_id = bundle.bundle_id
        self.family = ledger.family_of(priv.name)
        self.keys = self.legacy = None
        if opts.ledger.memo and ledger.budget_family(self.family).memo:
            self.keys = self.ledger.memo_keys({
                "mechanism": priv.name, "params": priv.params, "bundle_id": bundle.bundle_id})
            self.legacy = self.ledger.legacy_memo_keys({  # texts memoized by a version-1 ledger
                "mechanism": priv.name, "params": priv.params, "bundle_id": bundle.bundle_id,
                "float_dtype": priv.float_dtype, "max_length": priv.max_length,
                "truncate": priv.truncate})
        self.diameter = bundle_diameter(bundle) if self.family == "dchi" else None
        enc = priv.encoder
        self.vector_dim = None if enc is None else getattr(enc, "output_dim", None)
        self.charged: list[Cost] = []
        self.memoized = 0
        self.status: Status | None = None

    def close(self) -> None:
        self.ledger.close()

    @property
    def capped(self) -> bool:
        st = self.ledger.status()
        return st.cap is not None or st.per_day is not None

    def item_keys(self, items) -> list[bytes | None]:
        """Memo keys of tokenized items (what is sent: their ids), None when not memoized."""
        if self.keys is None:
            return [None] * len(items)
        return [self.keys.key(it) for it in items]

    def legacy_keys(self, lines) -> list[bytes | None] | None:
        if self.legacy is None:
            return None
        return [self.legacy.key(ln.text, ln.text_b) for ln in lines]

    def item_cost(self, item) -> Cost:
        """What the payload of a tokenized item will cost: its token count (dχ; under a
        token policy its public words are counted, not charged) or the encoder's vector size
        (the payload's r)."""
        return ledger.cost(self.priv.name, self.priv.params, tokens=item.n_tokens,
                           dim=self.vector_dim, diameter=self.diameter,
                           public=self.priv.public_count(item) if self.priv.tokens else 0)

    # -- before the run ------------------------------------------------------------------------
    def plan(self, batches: Iterable) -> Plan:
        """The cost of the tokenized batches (``batches.Prepared``) up to the first error,
        memoized texts (stored, or repeated in the input) free."""
        costs: list[Cost] = []
        seen: set[bytes] = set()
        records = memoized = 0
        for ready in batches:
            keys = self.item_keys(ready.items)
            stored = self.ledger.lookup([k for k in keys if k is not None])
            old = self.legacy_keys(ready.lines) or [None] * len(keys)
            have_old = self.ledger.lookup([k for k in old if k is not None], "memo_text")
            for item, k, lk in zip(ready.items, keys, old, strict=True):
                records += 1
                if k is not None and (k in stored or k in seen or lk in have_old):
                    seen.add(k)
                    memoized += 1
                    continue
                if k is not None:
                    seen.add(k)
                costs.append(self.item_cost(item))
            if ready.error is not None:
                break
        return Plan(ledger.total(costs), records, memoized)

    def check(self, plan: Plan) -> Status:
        """BudgetRefused (exit 3) if the plan does not fit now; nothing is spent."""
        try:
            self.status = self.ledger.check(plan.cost, "this run")
        except BudgetRefused as exc:
            raise BudgetRefused(f"{exc}; nothing was written or sent") from None
        return self.status

    def describe(self, plan: Plan) -> str:
        """One line: what the run would cost and whether it fits (for --dry-run)."""
        st = self.ledger.status()
        c = plan.cost
        new = plan.records - plan.memoized
        head = (f"dry run: {plan.records} record(s), {new} new payload(s), {plan.memoized} "
                "memoized (free); ")
        if c is None:
            cost = "cost nothing"
        elif c.epsilon is None:
            cost = f"{c.family}: {c.sends} send(s) without a differential-privacy epsilon"
        else:
            cost = f"cost worst-case epsilon {fmt(c.epsilon)}"
            if c.family == "dchi":
                cost += f" (dchi: eta*n = {fmt(c.metric)} over {c.tokens} tokens)"
        why = None if c is None else self.ledger.refusal(st, c, "this run")
        cap = "no cap" if st.cap is None else f"cap {fmt(st.cap)}"
        verdict = "fits" if why is None else "would be refused"
        return f"{head}{cost}; spent {fmt(st.spent)}, {cap}: {verdict}; nothing was spent"

    # -- during the run ------------------------------------------------------------------------
    def charge(self, lines, items, payloads: list, jsons: list[bytes]) -> list[bytes]:
        """Charge one batch (costs read from ``payloads``) before it is written or sent;
        the payload JSON to use for each item (stored ones for memoized texts)."""
        costs = [ledger.payload_cost(p, self.diameter) for p in payloads]
        return self._charge(lines, items, costs, jsons)

    def charge_rows(self, lines, items, rows) -> list[bytes]:
        """:meth:`charge` for the JSON rows of a token mechanism
        (``edge_agent.privatize.record_lines.TokenRows``): each cost from the mechanism and
        params of the rows' validated payload and each payload's own token count."""
        mech = rows.payload.mechanism
        params = rows.payload.params.model_dump(exclude_none=True)
        by_size: dict[tuple[int, int], Cost] = {}
        costs = []
        for n, item in zip(rows.n_tokens, items, strict=True):
            size = (n, self.priv.public_count(item))  # public words: counted, not charged
            if size not in by_size:
                by_size[size] = ledger.cost(mech, params, tokens=n, diameter=self.diameter,
                                            public=size[1])
            costs.append(by_size[size])
        return self._charge(lines, items, costs, rows.jsons)

    def _charge(self, lines, items, costs: list[Cost], jsons: list[bytes]) -> list[bytes]:
        got = self.ledger.charge(costs, jsons, self.item_keys(items),
                                 mechanism=self.priv.name, params=self.priv.params,
                                 bundle_id=self.bundle_id, legacy=self.legacy_keys(lines))
        if got.cost is not None:
            self.charged.append(got.cost)
        self.memoized += got.memoized
        return got.payloads

    def summary(self) -> str:
        """For the run's summary line: what it charged, and the ledger after it."""
        st = self.ledger.status()
        c = ledger.total(self.charged)
        if c is None:
            spent = "charged nothing"
        elif c.epsilon is None:
            spent = f"counted {c.sends} {c.family} send(s) (no epsilon)"
        else:
            spent = f"charged worst-case epsilon {fmt(c.epsilon)} for {c.sends} payload(s)"
        memo = f", {self.memoized} memoized (free)" if self.keys is not None else ""
        cap = "no cap" if st.cap is None else f"cap {fmt(st.cap)}"
        return f"ledger: {spent}{memo}; spent {fmt(st.spent)}, {cap}"
