// The IndexedDB ledger store (what a page uses), on fake-indexeddb's in-memory IndexedDB:
// charges commit, the cap refuses, the memo key is one non-extractable CryptoKey kept in the
// database, and a store whose transaction fails refuses the charge. The pin store keeps the
// bundle first accepted for a model, and a changed bundle is refused until accepted.
import "fake-indexeddb/auto";
import assert from "node:assert/strict";
import { test } from "node:test";

import { IndexedDbLedgerStore, IndexedDbPinStore } from "../dist/session/browser_stores.js";
import { BudgetRefused } from "../dist/errors.js";
import { BundleChanged, checkPin } from "../dist/service/pins.js";
import { Ledger, dchiCost } from "../dist/ledger/ledger.js";

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

test("an IndexedDB ledger counts a token policy's public words beside what it charges", async () => {
  // shared.ledger: 7 tokens of which 3 public: ε = η·4·D; the family's spend and the charge
  // record the 3 (edge_agent's ledger: spend.public, charges.public); a charge without public
  // words writes no field (a ledger as before the policy)
  const ledger = new Ledger(new IndexedDbLedgerStore("t3"));
  const info = { ...INFO, params: { eta: 2, public_p: 0.3 } };
  const got = await ledger.charge([dchiCost("dchi-text", 2, 7, 10, 3), dchiCost("dchi-text", 2, 2, 10, 2)],
    ["P", "Q"], [null, null], info);
  assert.deepEqual([got.cost.epsilon, got.cost.tokens, got.cost.public], [80, 4, 5]);
  await ledger.charge([dchiCost("dchi-text", 2, 1, 10)], ["R"], [null], INFO);
  const st = await new Ledger(new IndexedDbLedgerStore("t3")).status();
  assert.deepEqual(st.families.dchi, { epsilon: 100, metric: 10, tokens: 5, sends: 3, public: 5 });
  const state = await new IndexedDbLedgerStore("t3").read();
  assert.deepEqual(state.charges.map((c) => c.public), [5, undefined]);
});

test("a transaction that fails refuses the charge: nothing is sent uncharged", async () => {
  const store = new IndexedDbLedgerStore("t2");
  const ledger = new Ledger(store);
  const db = await store["open"](); // the store's database handle, as a page's would be
  db.transaction = () => { throw new DOMException("quota exceeded", "QuotaExceededError"); };
  await assert.rejects(ledger.charge([dchiCost("dchi-text", 1, 1, 1)], ["P"], [null], INFO),
    (e) => e instanceof BudgetRefused && /cannot be written \(quota exceeded\)/.test(e.message));
});

test("the IndexedDB pin store pins the first bundle and refuses a silent change", async () => {
  const [a, b] = ["a".repeat(64), "b".repeat(64)];
  const store = new IndexedDbPinStore("p1");
  assert.equal(await checkPin(store, "https://api.example/", "m1", a), "pinned");
  // another handle on the same database (a reload of the page) holds the pin
  const again = new IndexedDbPinStore("p1");
  assert.equal(await again.get("https://api.example|m1"), a);
  assert.equal(await checkPin(again, "https://API.example", "m1", a), "same");
  await assert.rejects(checkPin(again, "https://api.example", "m1", b),
    (e) => e instanceof BundleChanged && e.message.includes(a.slice(0, 12)) && e.message.includes(b.slice(0, 12)));
  assert.equal(await again.get("https://api.example|m1"), a); // refused: the pin stands
  assert.equal(await checkPin(again, "https://api.example", "m1", b, { accept: new Set([b]) }), "accepted");
  assert.equal(await new IndexedDbPinStore("p1").get("https://api.example|m1"), b);
});
