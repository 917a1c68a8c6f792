// The web edge's privacy floor on a bundle directory with a seeded generator, for the
// conformance tests (tests/web_edge/test_floor_conformance.py): prints one JSON line
// {"reason": ... | null, "error": ... | null, "measured": [unchanged, drawn]} for each eta
// (measured: measureUnchanged with a generator of the same seed).
//
//   node tests/web_edge/floor_reason.mjs BUNDLE_DIR SEED MECHANISM ETA [ETA ...]
//
// With FLOOR_POLICY=1 in the environment, under the bundle's token policy (the floor draws the
// tokens outside its public list, as shared.floor does for a mechanism with public_p).
//
// The generator is numpy's default_rng(SEED) (Pcg64Source), as the Python side passes it to
// shared.floor.weak_privacy_reason: the same tokens, noise, decision and message.
import { DChiText } from "../../web_edge/dist/mechanisms/dchi.js";
import { dchiWeakReason, measureUnchanged } from "../../web_edge/dist/floor/floor.js";
import { loadBundleDir } from "../../web_edge/dist/node/caches.js";
import { Pcg64Source } from "../../web_edge/dist/random/pcg64.js";

const [dir, seed, mechanism, ...etas] = process.argv.slice(2);
const bundle = await loadBundleDir(dir);
const policy = process.env.FLOOR_POLICY === "1" ? bundle.policy : null;
if (process.env.FLOOR_POLICY === "1" && policy === null) throw new Error(`${dir}: the bundle has no token policy`);
for (const e of etas) {
  const eta = Number(e);
  let out;
  try {
    const text = await DChiText.create(bundle, eta);
    try {
      out = { reason: await dchiWeakReason(mechanism, eta, bundle, text, { source: new Pcg64Source(Number(seed)), policy }), error: null,
        measured: await measureUnchanged(text, new Pcg64Source(Number(seed)), undefined, policy) };
    } finally {
      await text.release();
    }
  } catch (exc) {
    out = { reason: null, error: `${exc.name}: ${exc.message}` };
  }
  process.stdout.write(JSON.stringify(out) + "\n");
}
