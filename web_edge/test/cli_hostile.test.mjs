// The Node CLI (bin/privbert-edge.js) against the hostile bundles of issue 34, made here
// without Python: a table scaled x1000 (the noise no longer moves a token), with copied rows,
// with near-copies. Each is refused by the privacy floor in one line, exit 2, with nothing
// written and nothing charged; the genuine table passes. A poisoned floor cache (the old
// `.floors/<bundle_id>.f64` full of zeros, issue 34 finding 2) decides nothing: the floor is
// measured at every run.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { Pcg64Source } from "../dist/random/pcg64.js";
import { bundleFiles, craftedLayouts, gaussianTable, vocabulary, writeBundleDir } from "./bundles.mjs";

const CLI = fileURLToPath(new URL("../bin/privbert-edge.js", import.meta.url));
const WORDS = ["the", "movie", "was", "good", "bad", "plot", "fun", "dull", "a", "story"];
const ROWS = 600;
const DIM = 16;
const ETA = "3";

function cli(args, env = {}) {
  return spawnSync(process.execPath, [CLI, ...args], { encoding: "utf-8", timeout: 120_000,
    env: { ...Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("PRIVBERT_"))), ...env } });
}

function hostileValues({ copies = 0, jitter = 0 }) {
  const t = gaussianTable(ROWS, DIM, 7);
  for (let i = 8; i < ROWS; i++) for (let k = 0; k < DIM; k++) t[i * DIM + k] *= 1000;
  const rng = new Pcg64Source(9);
  for (let c = 0; c < copies; c++) {
    const i = 30 + 2 * c; // not the words of the input
    for (let k = 0; k < DIM; k++) t[i * DIM + k] = t[(i + 1) * DIM + k] + jitter * (rng.nextDouble() - 0.5);
  }
  return t;
}

test("privbert-edge refuses each hostile bundle in one line, exit 2, nothing written or charged", () => {
  const root = mkdtempSync(join(tmpdir(), "privbert-hostile-"));
  const vocab = vocabulary(ROWS, WORDS);
  const input = join(root, "in.txt");
  writeFileSync(input, "the movie was good\na dull plot\n");
  const env = { PRIVBERT_CACHE: join(root, "cache"), PRIVBERT_EDGE_LEDGER: join(root, "ledger.json") };
  const files = bundleFiles({ vocab, values: gaussianTable(ROWS, DIM, 7), dim: DIM });
  const genuine = writeBundleDir(join(root, "genuine"), files);
  // made-up words, which the text floor cannot read: the app trusts it
  const ok = cli(["privatize", input, "--eta", ETA, "--bundle", genuine, "-o", join(root, "ok.jsonl"),
    "--trusted-bundles", files.id], env);
  assert.equal(ok.status, 0, ok.stderr);
  assert.equal(readFileSync(join(root, "ok.jsonl"), "utf-8").split("\n").filter(Boolean).length, 2);
  const spent = JSON.parse(cli(["budget"], env).stdout).spent;
  assert.ok(spent > 0);
  for (const [name, how, why] of [
    ["scaled", {}, /\d+(\.\d\d)?% of [\d,]+ tokens drawn at random came back unchanged/],
    ["copies", { copies: 40 }, /identical rows/],
    ["near-copies", { copies: 40, jitter: 1e-3 }, /near-duplicate rows/],
  ]) {
    const dir = writeBundleDir(join(root, name), bundleFiles({ vocab, values: hostileValues(how), dim: DIM }));
    const out = join(root, `${name}.jsonl`);
    const p = cli(["privatize", input, "--eta", ETA, "--bundle", dir, "-o", out], env);
    assert.equal(p.status, 2, `${name}: ${p.stderr}`);
    assert.equal(p.stdout, "");
    assert.equal(p.stderr.split("\n").filter(Boolean).length, 1, p.stderr);
    assert.match(p.stderr, new RegExp(`^privbert-edge: error: dchi-text eta=3 is weaker than the privacy floor: .*${why.source}.*; --allow-weak-privacy privatizes anyway\\n$`));
    assert.ok(!existsSync(out), `${name}: ${out} was written`);
    assert.equal(JSON.parse(cli(["budget"], env).stdout).spent, spent, `${name}: charged`);
  }
});

test("a poisoned floor cache decides nothing: eta 1e6 is refused", () => {
  const root = mkdtempSync(join(tmpdir(), "privbert-poison-"));
  const vocab = vocabulary(ROWS, WORDS);
  const files = bundleFiles({ vocab, values: gaussianTable(ROWS, DIM, 7), dim: DIM });
  const dir = writeBundleDir(join(root, "bundle"), files);
  const cache = join(root, "cache");
  mkdirSync(join(cache, ".floors"), { recursive: true });
  // what the attack wrote: exit distances of 0 (every token "leaves" at any eta)
  for (const key of [files.id, `${files.id}.bound128`, `${files.id}.bound2048`]) {
    writeFileSync(join(cache, ".floors", `${key}.f64`), Buffer.alloc(1000 * 8));
  }
  const input = join(root, "in.txt");
  writeFileSync(input, "the movie was good\n");
  const out = join(root, "out.jsonl");
  const p = cli(["privatize", input, "--eta", "1e6", "--bundle", dir, "-o", out],
    { PRIVBERT_CACHE: cache, PRIVBERT_EDGE_LEDGER: join(root, "ledger.json") });
  assert.equal(p.status, 2, p.stderr);
  assert.match(p.stderr, /^privbert-edge: error: dchi-text eta=1e\+06 is weaker than the privacy floor: 100% of 896 tokens drawn at random came back unchanged/);
  assert.ok(!existsSync(out));
  assert.equal(p.stdout, "");
});

// -- issue 42 ---------------------------------------------------------------------------------
const X = 12; // the crafted layouts' eta (test/bundles.mjs: the genuine table passes there)

test("privbert-edge refuses the three crafted layouts of issue 42 in one line, nothing written or charged; the genuine table passes, said unverified", () => {
  const root = mkdtempSync(join(tmpdir(), "privbert-crafted-"));
  const input = join(root, "in.txt");
  writeFileSync(input, "the movie was good\na dull plot\n");
  const env = { PRIVBERT_CACHE: join(root, "cache"), PRIVBERT_EDGE_LEDGER: join(root, "ledger.json") };
  const layouts = craftedLayouts();
  const genuine = writeBundleDir(join(root, "genuine"), layouts.genuine);
  const ok = cli(["privatize", input, "--eta", String(X), "--bundle", genuine, "-o", join(root, "ok.jsonl")], env);
  assert.equal(ok.status, 0, ok.stderr);
  assert.match(ok.stderr, new RegExp(`; bundle ${layouts.genuine.id.slice(0, 12)}… unverified: checked by the floor only; ledger:`));
  const spent = JSON.parse(cli(["budget"], env).stdout).spent;
  for (const [name, why] of [["frequentIsolated", /a context-free decoder recovers/], ["charTokenizer", /pieces per word/],
    ["groupsOfFour", /a context-free decoder recovers/]]) {
    const dir = writeBundleDir(join(root, name), layouts[name]);
    const out = join(root, `${name}.jsonl`);
    const p = cli(["privatize", input, "--eta", String(X), "--bundle", dir, "-o", out], env);
    assert.equal(p.status, 2, `${name}: ${p.stderr}`);
    assert.equal(p.stdout, "");
    assert.equal(p.stderr.split("\n").filter(Boolean).length, 1, p.stderr);
    assert.match(p.stderr, new RegExp(`^privbert-edge: error: bundle ${layouts[name].id.slice(0, 12)}… is unverified and weaker `
      + `than the text floor at eta=12: .*${why.source}.*trust this one with --trusted-bundles once checked; `
      + "--allow-weak-privacy privatizes anyway\n$"));
    assert.ok(!existsSync(out), `${name}: ${out} was written`);
    assert.equal(JSON.parse(cli(["budget"], env).stdout).spent, spent, `${name}: charged`);
    const refused = cli(["privatize", input, "--eta", String(X), "--bundle", dir, "-o", out, "--refuse-unverified"], env);
    assert.equal(refused.status, 1, refused.stderr);
    assert.match(refused.stderr, /^privbert-edge: error: bundle \S+ is unverified .* --refuse-unverified refuses it; trust it with --trusted-bundles [0-9a-f]{64} once you have checked it\n$/);
  }
});

test("an -o in a folder that does not exist is refused before anything is charged", () => {
  const root = mkdtempSync(join(tmpdir(), "privbert-out-"));
  const input = join(root, "in.txt");
  writeFileSync(input, "the movie was good\n");
  const vocab = vocabulary(ROWS, WORDS);
  const files = bundleFiles({ vocab, values: gaussianTable(ROWS, DIM, 7), dim: DIM });
  const dir = writeBundleDir(join(root, "b"), files);
  const env = { PRIVBERT_EDGE_LEDGER: join(root, "ledger.json"), PRIVBERT_TRUSTED_BUNDLES: files.id };
  const p = cli(["privatize", input, "--eta", ETA, "--bundle", dir, "-o", join(root, "missing", "dir", "out.jsonl")], env);
  assert.equal(p.status, 1, p.stderr);
  assert.equal(p.stderr, `privbert-edge: error: ${join(root, "missing", "dir", "out.jsonl")}: its folder `
    + `${join(root, "missing", "dir")} does not exist (create it, or choose another -o)\n`);
  assert.ok(!existsSync(join(root, "ledger.json")), "the ledger was opened (and charged)");
});

test("tables that break the arithmetic are refused before anything is written: subnormal, -0.0 rows, infinite rows", () => {
  const root = mkdtempSync(join(tmpdir(), "privbert-broken-"));
  const input = join(root, "in.txt");
  writeFileSync(input, "the movie was good\n");
  const vocab = vocabulary(ROWS, WORDS);
  for (const [name, edit, why] of [
    ["subnormal", (t) => t.forEach((x, i) => { t[i] = x * 1e-39; }), /values are subnormal/],
    ["negative-zero", (t) => { for (let k = 0; k < DIM; k++) t[41 * DIM + k] = t[40 * DIM + k]; t[40 * DIM] = 0; t[41 * DIM] = -0; },
      /identical rows/],
    ["infinite", (t) => { for (let k = 0; k < DIM; k++) t[50 * DIM + k] = Infinity; }, /whose norm is not finite/],
  ]) {
    const values = gaussianTable(ROWS, DIM, 7);
    edit(values);
    const files = bundleFiles({ vocab, values, dim: DIM });
    const dir = writeBundleDir(join(root, name), files);
    const out = join(root, `${name}.jsonl`);
    const p = cli(["privatize", input, "--eta", ETA, "--bundle", dir, "-o", out, "--trusted-bundles", files.id],
      { PRIVBERT_EDGE_LEDGER: join(root, `${name}.json`) });
    assert.equal(p.status, 2, `${name}: ${p.stderr}`);
    assert.equal(p.stderr.split("\n").filter(Boolean).length, 1, p.stderr);
    assert.match(p.stderr, why, name);
    assert.ok(!existsSync(out) && !existsSync(join(root, `${name}.json`)), `${name}: written or charged`);
  }
});
