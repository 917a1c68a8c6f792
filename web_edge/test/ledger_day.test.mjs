// The JS ledger's per-day cap: a window of exactly 24 hours on the ledger's time (the latest time
// seen plus what a monotonic clock says has passed), never on the wall clock alone, so that
// Date.now moved forward buys nothing and moved back reopens nothing (issue 34, finding 5).
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { BudgetRefused } from "../dist/errors.js";
import { DAY_MS, Ledger, MemoryLedgerStore, dchiCost, ledgerTime } from "../dist/ledger/ledger.js";
import { nodeClock } from "../dist/node/clock.js";
import { FileLedgerStore } from "../dist/node/file_ledger.js";

const INFO = { mechanism: "dchi-text", params: { eta: 1 }, bundleId: "a".repeat(64) };
const HOUR = 3_600_000;

/** A cost of ``eps`` worst-case epsilon (eta 1, ``eps`` tokens, D 1). */
const cost = (eps) => dchiCost("dchi-text", 1, eps, 1);

/** Charge ``eps``: true when admitted, false when the budget refuses. */
async function charge(ledger, eps) {
  try {
    await ledger.charge([cost(eps)], ["{}"], [null], INFO);
    return true;
  } catch (exc) {
    if (!(exc instanceof BudgetRefused)) throw exc;
    return false;
  }
}

/** A monotonic clock the test moves by hand (ms). */
function handClock(epoch = "test-epoch", sinceBoot = false) {
  const c = { epoch, sinceBoot, ms: 1_000, read: () => c.ms };
  return c;
}

/** Run ``fn`` with Date.now moved by what ``shift()`` says (restored after). */
async function withWallClock(fn) {
  const real = Date.now;
  let offset = 0;
  Date.now = () => real() + offset;
  try {
    return await fn((ms) => { offset += ms; });
  } finally {
    Date.now = real;
  }
}

test("the per-day window is exactly 24 hours of the ledger's clock", async () => {
  const clock = handClock();
  const ledger = new Ledger(new MemoryLedgerStore(), clock);
  await ledger.setCap("per_day", 100);
  assert.equal(await charge(ledger, 60), true);
  await assert.rejects(ledger.charge([cost(50)], ["{}"], [null], INFO, "this batch"),
    (e) => e instanceof BudgetRefused && /spent 60 in the last 24 hours, this batch needs 50, per-day cap 100/.test(e.message));
  clock.ms += HOUR;
  assert.equal(await charge(ledger, 40), true); // 100 <= 100: the cap itself is admitted
  assert.equal((await ledger.status()).daySpent, 100);
  clock.ms += DAY_MS - HOUR - 1; // 1 ms before the first charge leaves the window
  assert.equal(await charge(ledger, 1), false);
  assert.equal((await ledger.status()).daySpent, 100);
  clock.ms += 1; // exactly 24 hours after it: out
  assert.equal((await ledger.status()).daySpent, 40);
  assert.equal(await charge(ledger, 60), true);
  assert.equal(await charge(ledger, 1), false);
  clock.ms += HOUR; // the 40 leaves
  assert.equal(await charge(ledger, 40), true);
  const st = await ledger.status();
  assert.equal(st.spent, 200); // the lifetime total counts everything
  assert.equal(st.cap, null);
});

test("the per-day cap and the lifetime cap each refuse on their own", async () => {
  const clock = handClock();
  const ledger = new Ledger(new MemoryLedgerStore(), clock);
  await ledger.setCap("per_day", 50);
  await ledger.setCap("cap", 120);
  assert.equal(await charge(ledger, 50), true);
  assert.equal(await charge(ledger, 1), false);
  clock.ms += DAY_MS;
  assert.equal(await charge(ledger, 50), true);
  clock.ms += DAY_MS;
  await assert.rejects(ledger.charge([cost(30)], ["{}"], [null], INFO),
    /spent 100.0, this batch needs 30, cap 120.0 /); // the day has room, the lifetime cap has not
  assert.equal(await charge(ledger, 20), true);
  await ledger.setCap("per_day", null);
  assert.equal((await ledger.status()).daySpent, 0); // no per-day cap: not summed
});

test("Date.now moved +25 h a 'day' admits no more than the per-day cap (issue 34: 4,404 of 1,000)", async () => {
  const ledger = new Ledger(new MemoryLedgerStore()); // the default clock: performance.now
  await ledger.setCap("per_day", 1_000);
  let admitted = 0;
  await withWallClock(async (shift) => {
    for (let day = 0; day < 5; day++) {
      shift(25 * HOUR);
      for (let i = 0; i < 20; i++) if (await charge(ledger, 100)) admitted += 100;
    }
  });
  console.log(`# Date.now +25 h a day for 5 days: admitted ${admitted} against a per-day cap of 1,000`);
  assert.equal(admitted, 1_000); // the first day's cap, and nothing more
});

test("Date.now moved back counts in the latest window; moved forward it refuses nothing that fits", async () => {
  const ledger = new Ledger(new MemoryLedgerStore());
  await ledger.setCap("per_day", 100);
  await withWallClock(async (shift) => {
    assert.equal(await charge(ledger, 70), true);
    shift(-3 * DAY_MS);
    assert.equal(await charge(ledger, 40), false); // no window of three days ago to spend in
    assert.equal(await charge(ledger, 30), true);
    shift(10 * DAY_MS); // an honest correction: nothing is blocked that fits
    assert.equal(await charge(ledger, 1), false);
    assert.equal((await ledger.status()).daySpent, 100);
  });
  const st = await ledger.status();
  assert.deepEqual([st.spent, st.daySpent], [100, 100]);
});

test("two runs on one file ledger share the boot clock: a wall clock moved between them buys nothing", async () => {
  const dir = mkdtempSync(join(tmpdir(), "ledger-day-"));
  try {
    const path = join(dir, "ledger.json");
    const first = new Ledger(new FileLedgerStore(path), nodeClock());
    await first.setCap("per_day", 100);
    assert.equal(await charge(first, 80), true);
    await withWallClock(async (shift) => {
      shift(2 * DAY_MS);
      const second = new Ledger(new FileLedgerStore(path), nodeClock()); // another run, same boot
      assert.equal(await charge(second, 30), false);
      assert.equal(await charge(second, 20), true);
    });
    const saved = JSON.parse(readFileSync(path, "utf8"));
    assert.equal(Object.keys(saved.clock.anchors).length, 1);
    assert.ok(saved.charges.every((c) => Math.abs(c.at - Date.now()) < HOUR)); // timed on the boot clock
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a ledger saved before its clock: the latest time is its last charge's", async () => {
  const store = new MemoryLedgerStore();
  const ledger = new Ledger(store, handClock());
  await ledger.setCap("per_day", 100);
  await store.update((s) => { // a charge of 90 an hour ago, as a ledger of the last version saved it
    s.charges.push({ at: Date.now() - HOUR, family: "dchi", mechanism: "dchi-text", params: { eta: 1 },
      bundle_id: INFO.bundleId, epsilon: 90, metric: 90, tokens: 90, sends: 1 });
    s.spend.dchi = { epsilon: 90, metric: 90, tokens: 90, sends: 1 };
    delete s.clock;
    return { state: s, result: undefined };
  });
  await withWallClock(async (shift) => {
    shift(-2 * DAY_MS); // a clock set back cannot move the time before that charge
    assert.equal(await charge(ledger, 20), false);
    assert.equal(await charge(ledger, 10), true);
  });
  const s = await store.read();
  assert.equal(s.clock.latest, s.charges[1].at);
  assert.ok(s.charges[1].at >= s.charges[0].at);
});

test("the rule: a known epoch reads its anchor and the monotonic clock; a new one trusts the wall clock forward", () => {
  const t0 = 1.7e12;
  const anchors = { a: { at: t0, reading: 100 } };
  for (const wall of [t0 - 5 * DAY_MS, t0, t0 + 5 * DAY_MS]) assert.equal(ledgerTime(t0, anchors, "a", 160, true, wall), t0 + 60);
  assert.equal(ledgerTime(t0 + DAY_MS, anchors, "a", 160, true, t0), t0 + DAY_MS); // never before the latest
  assert.equal(ledgerTime(t0, anchors, "a", 50, true, t0 + DAY_MS), t0); // a clock gone back counts nothing
  assert.equal(ledgerTime(t0, anchors, "b", 3_600, true, t0 - DAY_MS), t0 + 3_600); // after a reboot: its uptime passed
  assert.equal(ledgerTime(t0, anchors, "b", 3_600, true, t0 + DAY_MS), t0 + DAY_MS);
  assert.equal(ledgerTime(t0, anchors, "page:x", 9e8, false, t0 - DAY_MS), t0); // a page's clock: nothing surely passed
  assert.equal(ledgerTime(t0, {}, "b", 3_600, true, t0 - DAY_MS), t0); // no anchor: no credit
  assert.equal(ledgerTime(null, {}, "b", 3_600, true, t0), t0);
});
