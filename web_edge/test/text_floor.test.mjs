// The text floor of issue 42 in the web edge (src/floor/text_floor.ts, shared/floor_text.py): its
// leave-one-out decoder (the Python edge's cases), its sample (the spec's digest), the crafted
// layouts refused and the genuine table passed through the real Privatizer, and the signed
// cache: a kept pass is used, a poisoned or foreign entry is measured afresh and refused.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { test } from "node:test";

import { EdgeBundle } from "../dist/bundle/bundle.js";
import { TextTokenizer } from "../dist/bundle/tokenizer.js";
import { trust, trustNote, KNOWN } from "../dist/bundle/trust.js";
import { WeakPrivacyError } from "../dist/errors.js";
import { PUBLIC_TEXT } from "../dist/generated/public_text.js";
import { KNOWN_BUNDLES, TEXT_FLOOR } from "../dist/generated/spec.js";
import { Privatizer } from "../dist/mechanisms/privatizer.js";
import { DChiText } from "../dist/mechanisms/dchi.js";
import { leaveOneOut, measureText, sampleIds, sampleWords, textFloorReason, TEXT_FIRST } from "../dist/floor/text_floor.js";
import { Pcg64Source } from "../dist/random/pcg64.js";
import { MemoryTextFloorCache, entryKey, rememberPass } from "../dist/floor/text_floor_cache.js";
import { craftedLayouts, reader } from "./bundles.mjs";

const ETA = 12;
const LAYOUTS = craftedLayouts();
const open = (name) => EdgeBundle.fromFiles(reader(LAYOUTS[name]), name, LAYOUTS[name].id);

function loo(x, y, prior = null) {
  const p = prior ?? new Map(x.map((a) => [a, x.filter((b) => b === a).length]));
  return leaveOneOut(x, y, p instanceof Map ? p : new Map(Object.entries(p).map(([k, v]) => [Number(k), v])));
}

test("the decoder is scored leave-one-out, weighs prior and channel, and breaks ties as shared.floor_text", () => {
  assert.equal(loo([1, 2, 3, 4], [9, 8, 7, 4]), 1); // resubstitution would say 4
  assert.equal(loo([1, 1, 1, 2], [5, 5, 1, 5], { 1: 3, 2: 1 }), 3);
  assert.equal(loo([3, 3, 3, 4, 4, 4, 4], [6, 6, 6, 6, 4, 4, 4], { 3: 2, 4: 4 }), 6);
  assert.equal(loo([3, 8, 3], [9, 9, 9], { 3: 1, 8: 1 }), 2); // a tie: the smaller id
  assert.equal(loo([9, 4, 9], [9, 9, 9], { 9: 1, 4: 1 }), 2); // a tie: the output itself
});

test("the sample is the spec's: its digest and its words", () => {
  assert.equal(createHash("sha256").update(PUBLIC_TEXT, "ascii").digest("hex"), TEXT_FLOOR.sample_sha256);
  assert.equal(sampleWords(), TEXT_FLOOR.sample_words);
});

test("the known bundles are the spec's, and the notes name what the edge knows", () => {
  assert.deepEqual(KNOWN, KNOWN_BUNDLES.bundles);
  const id = KNOWN["pca32-int8"];
  assert.deepEqual(trust(id), { bundleId: id, kind: "known", name: "pca32-int8" });
  const other = `6be7${"0".repeat(60)}`;
  assert.equal(trustNote(trust(other)), "bundle 6be700000000… unverified: checked by the floor only");
  assert.equal(trust(other, new Set([other])).kind, "trusted");
  assert.equal(trustNote(trust(other, new Set([other])), "the trustedBundles option"),
    "bundle 6be700000000… trusted by this app (the trustedBundles option)");
});

test("the crafted layouts are refused and the genuine table passes, through the real Privatizer", async () => {
  const genuine = await Privatizer.create(await open("genuine"), { mechanism: "dchi-text", eta: ETA });
  assert.equal(genuine.trust.kind, "unverified");
  assert.equal(genuine.textFloor.reason, null);
  assert.ok(genuine.textFloor.measure.decoded / genuine.textFloor.measure.draws < 0.35);
  await genuine.release();
  for (const [name, why] of [["frequentIsolated", /a context-free decoder recovers \d+\.\d\d% of [\d,]+ tokens/],
    ["charTokenizer", /cuts the public sample into 4\.\d+ pieces per word/],
    ["groupsOfFour", /a context-free decoder recovers/]]) {
    const b = await open(name);
    await assert.rejects(Privatizer.create(b, { mechanism: "dchi-text", eta: ETA, trustHow: "the trustedBundles option" }),
      (e) => e instanceof WeakPrivacyError && why.test(e.message)
        && e.message.startsWith(`bundle ${b.bundleId.slice(0, 12)}… is unverified and weaker than the text floor at eta=12: `)
        && e.message.endsWith("trust this one with the trustedBundles option once checked"), name);
    // trusted, it is used as it is (the app vouches for it)
    const p = await Privatizer.create(b, { mechanism: "dchi-text", eta: ETA, trustedBundles: [b.bundleId] });
    assert.equal(p.trust.kind, "trusted");
    assert.equal(p.textFloor, null);
    await p.release();
  }
});

test("a kept pass is used; a poisoned, foreign or other-eta entry is measured afresh, and refused", async () => {
  const cache = new MemoryTextFloorCache();
  const g = await open("genuine");
  const first = await Privatizer.create(g, { mechanism: "dchi-text", eta: ETA, textFloorCache: cache });
  assert.equal(first.textFloor.cached, false);
  await first.release();
  assert.ok(cache.entries.has(entryKey(g.bundleId, ETA)));
  const again = await Privatizer.create(g, { mechanism: "dchi-text", eta: ETA, textFloorCache: cache });
  assert.equal(again.textFloor.cached, true);
  assert.deepEqual(again.textFloor.measure, first.textFloor.measure);
  await again.release();

  const hostile = await open("groupsOfFour");
  const key = entryKey(hostile.bundleId, ETA);
  const pass = { pieces: 3214, words: TEXT_FLOOR.sample_words, tokens: 3214, draws: 1024, unchanged: 0, decoded: 0 };
  // 1. the genuine bundle's signed entry copied to the hostile bundle's name: it names another bundle
  cache.entries.set(key, cache.entries.get(entryKey(g.bundleId, ETA)));
  // 2. a pass signed with another device's key
  const other = new MemoryTextFloorCache();
  await rememberPass(other, hostile.bundleId, ETA, pass);
  // 3. a pass signed with this key, its figures edited afterwards
  const mine = new MemoryTextFloorCache();
  mine.signingKey = () => cache.signingKey();
  await rememberPass(mine, hostile.bundleId, ETA, pass);
  const edited = JSON.parse(mine.entries.get(key));
  edited.body = edited.body.replace('"measure":[3214', '"measure":[3215');
  // 4. a genuine pass at another eta
  await rememberPass(mine, hostile.bundleId, 1, pass);
  for (const poison of [cache.entries.get(key), other.entries.get(key), JSON.stringify(edited),
    mine.entries.get(entryKey(hostile.bundleId, 1)), "not json"]) {
    cache.entries.set(key, poison);
    await assert.rejects(Privatizer.create(hostile, { mechanism: "dchi-text", eta: ETA, textFloorCache: cache }),
      (e) => e instanceof WeakPrivacyError && /a context-free decoder recovers/.test(e.message));
  }
  // a signed pass of this device for this bundle and eta is believed: the key is the device's secret
  cache.entries.set(key, mine.entries.get(key));
  const kept = await Privatizer.create(hostile, { mechanism: "dchi-text", eta: ETA, textFloorCache: cache });
  assert.equal(kept.textFloor.cached, true);
  await kept.release();
});

test("it draws in steps: a clear case stops at the first, and the whole sample is the most", async () => {
  const g = await open("genuine");
  const tok = new TextTokenizer(g.tokenizerJson);
  const clear = await measureText(await DChiText.create(g, ETA), tok);
  assert.equal(clear.draws, TEXT_FIRST);
  // at eta 17 about half is decoded: a Wilson interval at z = 5 of 1,024 draws cannot leave
  // the line (a wrong side only 5 standard deviations away)
  const near = await measureText(await DChiText.create(g, 17), tok);
  assert.ok(near.draws > TEXT_FIRST, JSON.stringify(near));
  assert.ok(near.draws <= near.tokens * TEXT_FLOOR.ROUNDS);
  assert.equal(textFloorReason(g.bundleId, ETA, clear, "x"), null);
});

test("the line holds exactly at the pieces ratio, and a bundle is refused for what it sends unchanged", () => {
  assert.equal((33807 / 20000) / TEXT_FLOOR.PUBLIC_PIECES_PER_WORD, TEXT_FLOOR.PIECES_RATIO);
  const m = (pieces, words, unchanged, decoded) => ({ pieces, words, tokens: 900, draws: 1024, unchanged, decoded });
  assert.equal(textFloorReason("a".repeat(64), 1, m(33807, 20000, 0, 0), "x"), null);
  assert.match(textFloorReason("a".repeat(64), 1, m(33808, 20000, 0, 0), "x"), /pieces per word/);
  assert.match(textFloorReason("a".repeat(64), 1, m(3232, 2868, 600, 400), "x"),
    /recovers 39\.06% of 1,024 tokens of public text privatized with it \(58\.59% sent unchanged; line 50\.00%\)/);
});

test("the steps double to the whole sample, twice (a channel that never leaves the line)", async () => {
  const g = await open("genuine");
  const tok = new TextTokenizer(g.tokenizerJson);
  const seen = new Set(sampleIds(tok));
  const fresh = [...g.regularIds].filter((i) => !seen.has(i))[Symbol.iterator]();
  const sizes = [];
  // every other token unchanged, the rest a token never seen before (decoded as itself: wrong)
  const halves = { bundle: g, eta: 1, privatizeIds: async (x) => {
    sizes.push(x.length);
    return Int32Array.from(x, (v, i) => (i % 2 ? fresh.next().value : v));
  } };
  const got = await measureText(halves, tok, new Pcg64Source(0));
  const total = 2 * got.tokens;
  assert.deepEqual(sizes, [1024, 1024, 2048, total - 4096]);
  assert.equal(got.draws, total);
});
