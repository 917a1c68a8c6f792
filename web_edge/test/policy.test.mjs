// The token policy (issue 41) against the Python edge's golden vectors (tests/golden/policy.json,
// written by `python -m tests.golden.make_golden`): a bundle's policy block read and checked as
// shared.policy.TokenPolicy.from_block (same refusals, word for word); the public words of a text,
// whole words only, with the cut of a truncation; SanText+'s coin and the samplers for a seed; the
// payload bytes of `privbert-edge privatize --public-p` equal to edge-agent's, and the ledger's
// public words counted apart from what it charges; the floor drawn from the words outside the
// list; the guarantee's policy clause.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { TokenPolicy, keptPublic, tokenizerVocab } from "../dist/bundle/policy.js";
import { DChiText } from "../dist/mechanisms/dchi.js";
import { dchiWeakReason, floorTokens, measureUnchanged } from "../dist/floor/floor.js";
import { parseRaw } from "../dist/format/pyjson.js";
import { summary } from "../dist/ledger/accounting.js";
import { dchiCost, total } from "../dist/ledger/ledger.js";
import { Privatizer } from "../dist/mechanisms/privatizer.js";
import { loadBundleDir } from "../dist/node/caches.js";
import { Pcg64Source } from "../dist/random/pcg64.js";
import { npy } from "./bundles.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const CLI = join(HERE, "..", "bin", "privbert-edge.js");
const gold = JSON.parse(readFileSync(join(HERE, "..", "..", "tests", "golden", "policy.json"), "utf8"));
const run = promisify(execFile);

/** The golden policy bundle as the directory shared/bundle.py saves. */
function writeBundle(dir) {
  const b = gold.bundle;
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "tokenizer.json"), gold.tokenizer_json);
  writeFileSync(join(dir, "embeddings.npy"), npy("<f4", [b.table.length / b.dim, b.dim], Float32Array.from(b.table)));
  writeFileSync(join(dir, "bundle.json"), JSON.stringify({ ...b.meta, bundle_id: b.bundle_id }));
}

const work = mkdtempSync(join(tmpdir(), "policy-golden-"));
process.on("exit", () => rmSync(work, { recursive: true, force: true }));
const bundleDir = join(work, "bundle");
writeBundle(bundleDir);
const bundle = await loadBundleDir(bundleDir, gold.bundle.bundle_id);
const policy = bundle.policy;
const seeded = (seed) => new Pcg64Source(seed);
// the golden bundle is a tiny one made for these vectors, too small for the text floor (issue
// 42): trusted, as the app that made it would
const TRUSTED = [bundle.bundleId];

test("the bundle's policy block is read and checked: the bundle id covers it", () => {
  assert.ok(policy !== null);
  const block = gold.bundle.meta.policy;
  assert.equal(policy.name, block.name);
  assert.equal(policy.size, block.size);
  assert.equal(policy.digest, block.sha256);
  const vocab = tokenizerVocab(gold.tokenizer_json);
  const listed = [...vocab].filter(([, i]) => policy.publicIds[i] === 1).map(([t]) => t).sort();
  assert.deepEqual(listed, [...block.tokens].sort());
  assert.ok(!block.tokens.includes("not") && !block.tokens.includes("very")); // negations: not public
});

test("a policy block a server could sign: TokenPolicy.from_block's refusal, word for word", async () => {
  const vocab = tokenizerVocab(gold.tokenizer_json);
  assert.ok(gold.blocks.length >= 10);
  for (const c of gold.blocks) {
    const raw = parseRaw(JSON.stringify(c.block));
    let got;
    try {
      got = { error: null, size: (await TokenPolicy.fromBlock(raw, vocab, bundle.regularIds, "bundle.json")).size };
    } catch (exc) {
      assert.equal(exc.name, "BundleError");
      got = { error: exc.message };
    }
    assert.deepEqual(got, c.error === null ? { error: null, size: c.size } : { error: c.error }, JSON.stringify(c.block));
  }
});

test("public words: whole words only, per segment, with the cut of a truncation; counts and costs", async () => {
  const priv = await Privatizer.create(bundle, { mechanism: "dchi-text", params: { eta: 8, public_p: 0.3 },
    trustedBundles: TRUSTED, floorSource: seeded(1) });
  try {
    const singles = gold.tokenize.filter((t) => !t.pair);
    const pairs = gold.tokenize.filter((t) => t.pair);
    const a = priv.tokenize(gold.input.lines);
    const p = priv.tokenize(gold.input.pairs.slice(1).map((x) => x.split("\t")[0]),
      gold.input.pairs.slice(1).map((x) => x.split("\t")[1]));
    assert.ok(singles.some((t) => t.cut_a) && pairs.some((t) => t.cut_a), "the golden cases cut a word");
    for (const [items, want] of [[a, singles], [p, pairs]]) {
      assert.equal(items.length, want.length);
      items.forEach((it, i) => {
        const w = want[i];
        assert.deepEqual([it.idsA, it.idsB, it.cutA ?? false, it.cutB ?? false], [w.ids_a, w.ids_b, w.cut_a, w.cut_b]);
        const mask = [...policy.publicMask(it.idsA, it.cutA), ...(it.idsB ? policy.publicMask(it.idsB, it.cutB) : [])];
        assert.deepEqual(mask, w.public);
        const c = priv.cost(it);
        assert.deepEqual([c.epsilon, c.metric, c.tokens, c.public ?? 0], [w.cost.epsilon, w.cost.metric, w.cost.tokens,
          w.public_count]);
      });
    }
  } finally {
    await priv.release();
  }
});

test("SanText+'s coin: one uniform double per public token, kept when u >= p (numpy's draws)", () => {
  for (const c of gold.coins) {
    assert.deepEqual(Array.from(keptPublic(Uint8Array.from(c.public), c.p, seeded(c.seed))), c.kept, `p ${c.p}`);
  }
});

test("the samplers under a policy: the coins first, then the noise of the privatized tokens", async () => {
  for (const s of gold.samplers) {
    const priv = await Privatizer.create(bundle, { mechanism: s.mechanism, params: { eta: s.eta, public_p: s.public_p },
      trustedBundles: TRUSTED, floorSource: seeded(2) });
    try {
      const out = await priv.privatizeData([{ idsA: s.ids, idsB: null, nBefore: s.ids.length }], seeded(s.seed));
      const got = s.mechanism === "dchi-embedding" ? Array.from(out, Math.fround) : Array.from(out);
      assert.deepEqual(got, s.output, `${s.mechanism} p ${s.public_p}`);
    } finally {
      await priv.release();
    }
  }
});

test("costs: public words counted, not charged (ε = η·(n − public)·D)", () => {
  assert.equal(bundle.diameter, gold.diameter);
  for (const c of gold.costs) {
    const got = dchiCost(c.mechanism, c.params.eta, c.tokens, c.diameter, c.public);
    assert.deepEqual([got.epsilon, got.metric, got.tokens, got.public ?? 0],
      [c.cost.epsilon, c.cost.metric, c.cost.tokens, c.cost.public ?? 0]);
  }
  const t = total([[5, 2], [3, 0], [4, 4]].map(([n, k]) => dchiCost("dchi-text", 8, n, gold.diameter, k)));
  assert.deepEqual([t.epsilon, t.metric, t.tokens, t.public], [gold.total.epsilon, gold.total.metric,
    gold.total.tokens, gold.total.public]);
  assert.throws(() => dchiCost("dchi-text", 8, 3, 1, 4), /cannot exceed/);
});

test("the floor under a policy draws from the words outside the public list", async () => {
  assert.deepEqual(Array.from(floorTokens(bundle, policy)), gold.floor_tokens);
  for (const f of gold.floors) {
    const text = await DChiText.create(bundle, f.eta);
    try {
      const why = await dchiWeakReason(f.mechanism, f.eta, bundle, text, { source: seeded(f.seed), policy });
      assert.equal(why, f.reason, `${f.mechanism} eta ${f.eta}`);
      const [same, drawn] = await measureUnchanged(text, seeded(f.seed), undefined, policy);
      assert.deepEqual({ unchanged: same, drawn }, f.measured);
    } finally {
      await text.release();
    }
  }
});

test("the guarantee says what it covers: the policy clause of its summary line", async () => {
  for (const g of gold.guarantees) {
    const priv = await Privatizer.create(bundle, { mechanism: g.mechanism, params: { eta: g.eta, public_p: g.public_p },
      trustedBundles: TRUSTED, floorSource: seeded(3) });
    try {
      const got = priv.guarantee();
      assert.deepEqual(got.policy, g.policy);
      assert.equal(got.worst_case.epsilon_scope, g.epsilon_scope);
      assert.equal(summary(got), g.summary);
      assert.equal(summary(got, 5.5), g.summary_5_5);
    } finally {
      await priv.release();
    }
  }
});

// -- the command line: edge-agent's bytes, and its ledger's counts ---------------------------------
for (const r of gold.runs) {
  test(`privbert-edge privatize ${r.args.join(" ")} --seed ${r.seed} (${r.input}): edge-agent's JSONL and ledger`, async () => {
    const dir = mkdtempSync(join(work, "run-"));
    const input = join(dir, r.input === "pairs" ? "in.tsv" : "in.txt");
    writeFileSync(input, gold.input[r.input].join("\n") + "\n");
    const ledger = join(dir, "ledger.json");
    const env = { ...process.env, PRIVBERT_CACHE: join(dir, "cache"), PRIVBERT_TRUSTED_BUNDLES: bundle.bundleId };
    const { stdout, stderr } = await run(process.execPath, [CLI, "privatize", input, ...r.args, "--seed", String(r.seed),
      "--bundle", bundleDir, "--ledger", ledger], { env });
    assert.deepEqual(stdout.split("\n").filter((x) => x), r.lines);
    const pol = r.args.includes("--public-p");
    assert.equal(/public words of policy function-words are sent unchanged/.test(stderr), pol, stderr);
    const budget = JSON.parse((await run(process.execPath, [CLI, "budget", "--ledger", ledger], { env })).stdout);
    assert.deepEqual(budget.families, r.budget);
  });
}
