// The web edge's text floor (issue 42) on a bundle directory with a seeded generator, for the
// conformance tests (tests/web_edge/test_text_floor_conformance.py): prints one JSON line
// {"measure": {...}, "reason": ... | null} for each eta.
//
//   node tests/web_edge/text_floor.mjs [--policy] BUNDLE_DIR SEED ETA [ETA ...]
//
// --policy: under the bundle's token policy (its public words neither privatized nor judged).
//
// The generator is numpy's default_rng(SEED) (Pcg64Source), as the Python side passes it to
// shared.floor_text.measure_text: the same order, noise, outputs, counts and message.
import { DChiText } from "../../web_edge/dist/mechanisms/dchi.js";
import { TextTokenizer } from "../../web_edge/dist/bundle/tokenizer.js";
import { measureText, textFloorReason } from "../../web_edge/dist/floor/text_floor.js";
import { loadBundleDir } from "../../web_edge/dist/node/caches.js";
import { Pcg64Source } from "../../web_edge/dist/random/pcg64.js";

const args = process.argv.slice(2);
const underPolicy = args[0] === "--policy";
const [dir, seed, ...etas] = underPolicy ? args.slice(1) : args;
const bundle = await loadBundleDir(dir);
const policy = underPolicy ? bundle.policy : null;
if (underPolicy && policy === null) throw new Error(`${dir}: the bundle has no token policy`);
const tokenizer = new TextTokenizer(bundle.tokenizerJson);
for (const e of etas) {
  const eta = Number(e);
  const text = await DChiText.create(bundle, eta);
  try {
    const measure = await measureText(text, tokenizer, new Pcg64Source(Number(seed)), undefined, policy);
    process.stdout.write(JSON.stringify({ measure, reason: textFloorReason(bundle.bundleId, eta, measure, "--trusted-bundles") }) + "\n");
  } finally {
    await text.release();
  }
}
