// The privacy floor's cheap upper bound (floor.ts: DChiFloor.bound, and checkDchiFloor's path
// through it) on a table large enough to take that path (400 regular rows > 128): each pair's
// bound is at least its exit distance and often equal to it; an η well inside the floor is settled
// by the bound alone (no full floor computed); an η past it is refused with the full floor's
// figures; and near the floor, every verdict is the full floor's. Numbers follow floor.ts as it
// is today (THRESHOLD, BOUND_ROWS are imported, not repeated).
import assert from "node:assert/strict";
import { test } from "node:test";

import { EdgeBundle } from "../dist/bundle.js";
import { WeakPrivacyError } from "../dist/errors.js";
import { BOUND_ROWS, DChiFloor, THRESHOLD, checkDchiFloor, dchiWeakReason } from "../dist/floor.js";
import { ExactNearest } from "../dist/nearest.js";
import { Pcg64Source } from "../dist/pcg64.js";
import { choiceWithoutReplacement, standardNormal } from "../dist/samplers.js";

const DIM = 16;
const VOCAB = 405; // 5 special tokens, 400 regular rows
const src = new Pcg64Source(21);
const bundle = new EdgeBundle({
  bundle_id: "c".repeat(64), vocab_size: VOCAB, dim: DIM, max_length: 64,
  special_ids: { pad: 0, unk: 1, cls: 2, sep: 3, mask: 4 }, unused_ids: [], encoder: null, files: {},
}, Float32Array.from({ length: VOCAB * DIM }, () => 0.5 * standardNormal(src)), "{}", null);
const reg = bundle.regularIds;
const makeIndex = (t, rows) => ExactNearest.create(t, rows, DIM, null, { backend: "loop" });

/** A floor cache in memory (the FloorCache interface); ``keys`` says what was put. */
class MapCache {
  map = new Map();
  async get(k) { return this.map.get(k) ?? null; }
  async put(k, v) { this.map.set(k, v); }
  get keys() { return [...this.map.keys()].sort(); }
}

let fullFloor = null;
async function full() {
  if (fullFloor === null) {
    const index = await makeIndex(bundle.regularTable, reg.length);
    fullFloor = await DChiFloor.compute(bundle.regularTable, reg.length, DIM, index);
    await index.release();
  }
  return fullFloor;
}

async function check(eta, cache = new MapCache(), allowWeak = false) {
  const index = await makeIndex(bundle.regularTable, reg.length);
  try {
    return { why: await checkDchiFloor("dchi-text", eta, bundle, index, { cache, makeIndex, allowWeak }), cache };
  } finally {
    await index.release();
  }
}

test("the table takes the cheap path: more regular rows than the first bound's", () => {
  assert.ok(reg.length > BOUND_ROWS[0] && reg.length <= BOUND_ROWS[1]);
});

test("the bound from 128 rows is at least every pair's exit distance, and equal where it can be", async () => {
  const f = await full();
  const subset = choiceWithoutReplacement(new Pcg64Source(1), reg.length, BOUND_ROWS[0]).sort();
  const sub = new Float32Array(subset.length * DIM);
  subset.forEach((r, j) => sub.set(bundle.regularTable.subarray(r * DIM, (r + 1) * DIM), j * DIM));
  const small = await makeIndex(sub, subset.length);
  const { exit, done } = await DChiFloor.bound(bundle.regularTable, reg.length, DIM, small, subset);
  await small.release();
  assert.equal(done, f.exit.length);
  let equal = 0;
  for (let i = 0; i < exit.length; i++) {
    assert.ok(exit[i] * (1 + 1e-4) >= f.exit[i], `pair ${i}: bound ${exit[i]} under the exit distance ${f.exit[i]}`);
    if (Math.abs(exit[i] - f.exit[i]) <= 1e-5 * f.exit[i]) equal++;
  }
  // the rows that bind a pair are in the subset about 128/400 of the time: then the bound is exact
  assert.ok(equal >= 0.15 * exit.length, `${equal} of ${exit.length} bounds exact`);
  const bound = new DChiFloor(DIM, exit, f.tMax);
  const eta0 = f.floorEta();
  for (const k of [0.25, 0.5, 1, 2]) assert.ok(bound.unchanged(k * eta0) >= f.unchanged(k * eta0));
});

test("an η well inside the floor is settled by the bound: no full floor is computed", async () => {
  const eta = 0.25 * (await full()).floorEta();
  const { why, cache } = await check(eta);
  assert.equal(why, null);
  assert.deepEqual(cache.keys, []); // settled part-way: neither the bound nor the floor was kept
});

test("an η past the floor is refused there, with the full floor's figures", async () => {
  const f = await full();
  const eta = 2 * f.floorEta();
  const cache = new MapCache();
  const index = await makeIndex(bundle.regularTable, reg.length);
  try {
    await assert.rejects(checkDchiFloor("dchi-text", eta, bundle, index, { cache, makeIndex }),
      (e) => e instanceof WeakPrivacyError && e.message === dchiWeakReason("dchi-text", eta, f));
  } finally {
    await index.release();
  }
  assert.deepEqual(cache.keys, [bundle.bundleId, `${bundle.bundleId}.bound${BOUND_ROWS[0]}`]);
  // allowWeak: the same reason, returned instead of thrown (from the cached floor)
  const again = await check(eta, cache, true);
  assert.equal(again.why, dchiWeakReason("dchi-text", eta, f));
});

test("near the floor every verdict is the full floor's", async () => {
  const f = await full();
  const eta0 = f.floorEta();
  for (const k of [0.5, 0.8, 0.9, 0.97, 0.995, 1.005, 1.03, 1.1, 1.5]) {
    const eta = k * eta0;
    const { why } = await check(eta).catch((e) => ({ why: e instanceof WeakPrivacyError ? e.message : String(e) }));
    const passes = f.unchanged(eta) <= THRESHOLD;
    assert.equal(why === null, passes, `eta = ${k} x the floor's ${eta0}: ${why}`);
  }
});
