// The predict length policy, written once (issue 45; src/mechanisms/specs.ts predictMaxLength,
// edge_agent.privatize.run_setup.max_length_for): --max-length when given; else, for payloads
// sent to a served model, a token payload is cut at the model's own max_length within the
// bundle's (max_length - 2 word pieces for a text, - 3 for a pair); a vector payload is not cut
// by the model. Held here on the function's every branch, on the real `privbert-edge` posting
// to a loopback service (what it posts, single and pair, with and without --max-length, and
// without --post predict), and on an EdgeSession (its info and its payloads).
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { createTar } from "nanotar";

import { predictMaxLength, readsTokens } from "../dist/mechanisms/specs.js";
import { DEFAULT_MECHANISM, mechanismNames } from "../dist/mechanisms/registry.js";
import { EdgeSession } from "../dist/session/session.js";
import { MemoryPinStore } from "../dist/service/pins.js";
import { MemoryLedgerStore } from "../dist/ledger/ledger.js";
import { Pcg64Source } from "../dist/random/pcg64.js";
import { word, writeTinyBundle } from "./tiny_bundle.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const CLI = join(HERE, "..", "bin", "privbert-edge.js");
const TOKENS = DEFAULT_MECHANISM;
const VECTOR = mechanismNames().find((n) => !readsTokens(n));
const BUNDLE_MAX = 64; // the tiny bundle's max_length
const MODEL_MAX = 12; // the served model's: 10 word pieces of a text, 9 of a pair

test("predictMaxLength: --max-length, else the served model's limit within the bundle's, for token payloads only", () => {
  assert.ok(VECTOR, "a vector mechanism in the registry");
  // --max-length wins, whatever the model and the mechanism
  assert.equal(predictMaxLength(TOKENS, 20, 512, { max_length: 128 }), 20);
  assert.equal(predictMaxLength(VECTOR, 20, 512, { max_length: 128 }), 20);
  assert.equal(predictMaxLength(TOKENS, 20, 512, null), 20);
  // no served model (no --post predict): no limit from a model
  assert.equal(predictMaxLength(TOKENS, null, 512, null), null);
  // a token payload: the model's own limit, within the bundle's
  assert.equal(predictMaxLength(TOKENS, null, 512, { max_length: 128 }), 128);
  assert.equal(predictMaxLength(TOKENS, null, 64, { max_length: 128 }), 64);
  assert.equal(predictMaxLength(TOKENS, null, 64, { max_length: 4 }), 4);
  // a vector payload has one size whatever the text's length: the model does not cut it
  assert.equal(predictMaxLength(VECTOR, null, 512, { max_length: 128 }), null);
  // a max_length that is not a length (an integer >= 4, as shared.bundle.length_for_model) is none
  for (const bad of [3, 0, -128, 12.5, Number.NaN, Infinity, "128", true, null, undefined]) {
    assert.equal(predictMaxLength(TOKENS, null, 512, { max_length: bad }), null, String(bad));
  }
  assert.equal(predictMaxLength(TOKENS, null, 512, {}), null);
});

let tmp;
let bundleDir;
let bundleId;
let tar;

before(async () => {
  tmp = mkdtempSync(join(tmpdir(), "privbert-edge-length-"));
  bundleDir = join(tmp, "bundle");
  bundleId = await writeTinyBundle(bundleDir, { maxLength: BUNDLE_MAX });
  tar = Buffer.concat([createTar(["bundle.json", "tokenizer.json", "embeddings.npy"]
    .map((name) => ({ name, data: readFileSync(join(bundleDir, name)) }))), new Uint8Array(1024)]);
});
after(() => rmSync(tmp, { recursive: true, force: true }));

/** A service on loopback: one model reading ``maxLength`` over the tiny bundle; keeps the
 * payloads posted for predictions. */
async function serve(maxLength) {
  const posted = [];
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => { body += c; });
    req.on("end", () => {
      if (req.url === "/v1/models") {
        res.writeHead(200, { "Content-Type": "application/json" });
        res.end(JSON.stringify({ models: [{ id: "m1", mechanism: TOKENS, params: { eta: 5.0 }, bundle_id: bundleId,
          max_length: maxLength, labels: ["negative", "positive"] }] }));
      } else if (req.url === `/v1/bundles/${bundleId}`) {
        res.writeHead(200, { "Content-Type": "application/x-tar" });
        res.end(tar);
      } else if (req.url === "/v1/models/m1/predict" && req.method === "POST") {
        const payloads = JSON.parse(body).payloads;
        posted.push(...payloads);
        res.writeHead(200, { "Content-Type": "application/json" });
        res.end(JSON.stringify({ predictions: payloads.map(() => ({ label: "positive", scores: { negative: 0.4, positive: 0.6 } })) }));
      } else {
        res.writeHead(404, { "Content-Type": "application/problem+json" });
        res.end(JSON.stringify({ type: "about:blank", title: "Not Found" }));
      }
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return { posted, url: `http://127.0.0.1:${server.address().port}`, close: () => new Promise((r) => server.close(r)) };
}

/** `privbert-edge ARGS` (asynchronous: the service runs in this process). */
function cli(args) {
  const env = { ...process.env, PRIVBERT_CACHE: join(tmp, "cache"), PRIVBERT_TRUSTED_BUNDLES: bundleId };
  delete env.PRIVBERT_EDGE_LEDGER;
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [CLI, ...args], { env });
    let out = "";
    let err = "";
    p.stdout.on("data", (c) => { out += c; });
    p.stderr.on("data", (c) => { err += c; });
    p.on("close", (code) => resolve({ code, out, err }));
  });
}

/** The word-piece count of a token payload (its one array's shape). */
const pieces = (payload) => {
  const arrays = Object.values(payload).filter((v) => v && typeof v === "object" && Array.isArray(v.shape));
  assert.equal(arrays.length, 1, JSON.stringify(payload));
  return arrays[0].shape[0];
};

const words = (start, n) => Array.from({ length: n }, (_, i) => word(start + i)).join(" ");

test("privbert-edge --post predict cuts a text at the served model's max_length - 2, a pair at - 3, unless --max-length", async () => {
  const srv = await serve(MODEL_MAX);
  try {
    const single = join(tmp, "single.txt");
    writeFileSync(single, `${words(0, 40)}\n${words(50, 3)}\n`);
    const pair = join(tmp, "pair.tsv");
    writeFileSync(pair, `${words(0, 20)}\t${words(60, 20)}\t1\n`);
    const run = async (file, more, post = ["--post", "predict"]) => {
      const before = srv.posted.length;
      const p = await cli(["privatize", file, "--server", srv.url, "--model", "m1", ...post, "--eta", "5",
        "--seed", "3", "--ledger", join(tmp, "ledger.json"), "--accept-bundle", bundleId, ...more]);
      assert.equal(p.code, 0, p.err);
      return { p, sent: srv.posted.slice(before).map(pieces) };
    };
    assert.deepEqual((await run(single, [])).sent, [MODEL_MAX - 2, 3]);
    assert.deepEqual((await run(pair, ["--tsv", "--header", "no"])).sent, [MODEL_MAX - 3]);
    // --max-length is the run's, not the model's (the server judges it)
    assert.deepEqual((await run(single, ["--max-length", "20"])).sent, [18, 3]);
    assert.deepEqual((await run(pair, ["--tsv", "--header", "no", "--max-length", "20"])).sent, [17]);
    // no --post predict: the payloads are for no model, the bundle's limit applies
    const out = join(tmp, "out.jsonl");
    const { p, sent } = await run(single, ["-o", out], []);
    assert.deepEqual(sent, []);
    assert.deepEqual(readFileSync(out, "utf8").trim().split("\n").map((l) => pieces(JSON.parse(l).payload)), [40, 3]);
    assert.match(p.err, /0 truncated/);
  } finally {
    await srv.close();
  }
});

test("an EdgeSession makes its payloads within the served model's max_length, itself within the bundle's", async () => {
  for (const [served, want] of [[MODEL_MAX, MODEL_MAX], [4 * BUNDLE_MAX, BUNDLE_MAX], [null, BUNDLE_MAX]]) {
    const srv = await serve(served);
    try {
      const s = await EdgeSession.open({ server: srv.url, pins: new MemoryPinStore(), ledger: new MemoryLedgerStore(),
        trustedBundles: bundleId, truncate: "first", textFloorCache: false });
      assert.equal(s.info.maxLength, want, String(served));
      const [long] = await s.privatize(words(0, 80), new Pcg64Source(1));
      assert.equal(pieces(JSON.parse(long.payload)), want - 2, String(served));
      await s.close();
    } finally {
      await srv.close();
    }
  }
});
