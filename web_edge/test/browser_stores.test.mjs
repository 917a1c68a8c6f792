// The IndexedDB ledger store (what a page uses), on fake-indexeddb's in-memory IndexedDB:
// charges commit, the cap refuses, the memo key is one non-extractable CryptoKey kept in the
// database, and a store whose transaction fails refuses the charge. The floor cache keeps its
// Float64Array.
import "fake-indexeddb/auto";
import assert from "node:assert/strict";
import { test } from "node:test";

import { IndexedDbFloorCache, IndexedDbLedgerStore } from "../dist/browser_stores.js";
import { BudgetRefused } from "../dist/errors.js";
import { Ledger, dchiCost } from "../dist/ledger.js";

const INFO = { mechanism: "dchi-text", params: { eta: 65 }, bundleId: "b".repeat(64) };
const SETTING = { mechanism: "dchi-text", params: { eta: 65 }, bundle_id: "b".repeat(64), float_dtype: "float32", max_length: 512, truncate: "first" };

test("an IndexedDB ledger charges, persists, refuses over its cap and memoizes", async () => {
  const ledger = new Ledger(new IndexedDbLedgerStore("t1"));
  await ledger.setCap("cap", 50);
  const keys = await ledger.memoKeys(SETTING);
  const k = await keys.keyOf([1, 2, 3], null);
  const got = await ledger.charge([dchiCost("dchi-text", 1, 3, 10)], ["P"], [k], INFO);
  assert.equal(got.cost.epsilon, 30);
  // a second handle on the same database sees the charge, the memo and the same key
  const again = new Ledger(new IndexedDbLedgerStore("t1"));
  const st = await again.status();
  assert.equal(st.spent, 30);
  assert.equal(st.memoized, 1);
  assert.equal(await (await again.memoKeys(SETTING)).keyOf([1, 2, 3], null), k);
  const memo = await again.charge([dchiCost("dchi-text", 1, 3, 10)], ["Q"], [k], INFO);
  assert.deepEqual(memo.payloads, ["P"]);
  assert.equal(memo.cost, null);
  await assert.rejects(again.charge([dchiCost("dchi-text", 1, 3, 10)], ["R"], [null], INFO), BudgetRefused);
  assert.equal((await again.status()).spent, 30);
  const key = await new IndexedDbLedgerStore("t1").hmacKey();
  assert.equal(key.extractable, false);
});

test("a transaction that fails refuses the charge: nothing is sent uncharged", async () => {
  const store = new IndexedDbLedgerStore("t2");
  const ledger = new Ledger(store);
  const db = await store["open"](); // the store's database handle, as a page's would be
  db.transaction = () => { throw new DOMException("quota exceeded", "QuotaExceededError"); };
  await assert.rejects(ledger.charge([dchiCost("dchi-text", 1, 1, 1)], ["P"], [null], INFO),
    (e) => e instanceof BudgetRefused && /cannot be written \(quota exceeded\)/.test(e.message));
});

test("the IndexedDB floor cache keeps exit distances per bundle", async () => {
  const cache = new IndexedDbFloorCache("f1");
  assert.equal(await cache.get("c".repeat(64)), null);
  await cache.put("c".repeat(64), Float64Array.of(1.5, Infinity, 0));
  assert.deepEqual(await cache.get("c".repeat(64)), Float64Array.of(1.5, Infinity, 0));
});
