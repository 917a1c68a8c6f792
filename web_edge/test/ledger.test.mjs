// The device ledger: costs as shared.ledger computes them, a cap that refuses before anything
// is charged, memoized repeats free and byte-identical, and a store that cannot be written
// refusing the charge.
import assert from "node:assert/strict";
import { test } from "node:test";

import { BudgetRefused } from "../dist/errors.js";
import { Ledger, MemoryLedgerStore, dchiCost, fits, fmtEps, fsum, total } from "../dist/ledger/ledger.js";

const INFO = { mechanism: "dchi-text", params: { eta: 65 }, bundleId: "a".repeat(64) };
const SETTING = { mechanism: "dchi-text", params: { eta: 65 }, bundle_id: "a".repeat(64) };

test("dχ cost: eta·n·D worst case, eta·n metric (shared.ledger.cost)", () => {
  const c = dchiCost("dchi-text", 65, 20, 3.5);
  assert.deepEqual(c, { family: "dchi", epsilon: 65 * 20 * 3.5, metric: 1300, tokens: 20, sends: 1, eta: 65 });
  const t = total([c, dchiCost("dchi-text", 65, 5, 3.5)]);
  assert.equal(t.epsilon, 65 * 25 * 3.5);
  assert.equal(t.sends, 2);
  assert.throws(() => dchiCost("laplace", 1, 1, 1), /not a dχ mechanism/);
  assert.throws(() => dchiCost("dchi-text", 1e308, 10, 1e10), /not finite/);
});

test("the filter: spent + cost <= cap; a cap of 0 admits nothing", () => {
  assert.ok(fits(1, 2, 3));
  assert.ok(!fits(1, 2.5, 3));
  assert.ok(fits(1, 2, null));
  assert.ok(!fits(0, 0, 0));
  assert.ok(!fits(0, null, 5));
  assert.throws(() => fits(Number.NaN, 1, 1));
  // exactly rounded, as math.fsum: python -c "import math; print(math.fsum([1e100, 1.0, -1e100]), math.fsum([0.1, 0.2, 0.3, -0.6]))"
  assert.equal(fsum([1e100, 1.0, -1e100]), 1); // a plain sum gives 0
  assert.equal(fsum([0.1, 0.2, 0.3, -0.6]), 2.7755575615628914e-17);
  assert.equal(fmtEps(12.34567), "12.35");
  assert.equal(fmtEps(123456.78), "123,456.8");
});

test("a cap refuses the whole batch before anything is charged", async () => {
  const ledger = new Ledger(new MemoryLedgerStore());
  await ledger.setCap("cap", 100);
  const costs = [dchiCost("dchi-text", 1, 30, 2), dchiCost("dchi-text", 1, 30, 2)]; // 60 + 60
  await assert.rejects(ledger.charge(costs, ["p1", "p2"], [null, null], INFO), (e) =>
    e instanceof BudgetRefused && /spent 0, this batch needs 120\.0, cap 100\.0 /.test(e.message));
  assert.equal((await ledger.status()).spent, 0);
  const ok = await ledger.charge(costs.slice(0, 1), ["p1"], [null], INFO);
  assert.equal(ok.cost.epsilon, 60);
  assert.equal((await ledger.status()).spent, 60);
});

test("memoized repeats are free and get the stored payload; the memo keys are of token ids", async () => {
  const ledger = new Ledger(new MemoryLedgerStore());
  const keys = await ledger.memoKeys(SETTING);
  const k1 = await keys.keyOf([7592, 2088], null);
  const k1again = await keys.keyOf([7592, 2088], null);
  const k2 = await keys.keyOf([7592], [2088]); // the same ids as a pair: another key
  assert.equal(k1, k1again);
  assert.notEqual(k1, k2);
  assert.match(k1, /^[0-9a-f]{64}$/);
  const c = dchiCost("dchi-text", 1, 2, 1);
  const first = await ledger.charge([c, c, c], ["A", "B", "C"], [k1, k1, k2], INFO);
  assert.deepEqual(first.payloads, ["A", "A", "C"]); // the repeat in the batch gets A
  assert.equal(first.cost.sends, 2);
  const again = await ledger.charge([c], ["D"], [k1], INFO);
  assert.deepEqual(again.payloads, ["A"]);
  assert.equal(again.cost, null);
  const st = await ledger.status();
  assert.equal(st.spent, 4);
  assert.equal(st.memoized, 2);
  // another ledger (another random key) gives other keys for the same ids
  const other = await new Ledger(new MemoryLedgerStore()).memoKeys(SETTING);
  assert.notEqual(await other.keyOf([7592, 2088], null), k1);
  // and another setting other keys
  const k3 = await (await ledger.memoKeys({ ...SETTING, params: { eta: 66 } })).keyOf([7592, 2088], null);
  assert.notEqual(k3, k1);
  // what only shapes the bytes (length limit, truncation, float dtype) does not: the same ids
  // never get a fresh draw
  const shaped = { ...SETTING, max_length: 128, truncate: "error", float_dtype: "float16" };
  assert.equal(await (await ledger.memoKeys(shaped)).keyOf([7592, 2088], null), k1);
});

test("a ledger that cannot be written refuses: nothing is sent uncharged", async () => {
  const store = new MemoryLedgerStore();
  store.update = async () => { throw new Error("disk full"); };
  const ledger = new Ledger(store);
  await assert.rejects(ledger.charge([dchiCost("dchi-text", 1, 2, 1)], ["A"], [null], INFO),
    (e) => e instanceof BudgetRefused && /cannot be written \(disk full\); nothing was sent/.test(e.message));
});
