// Bundle pinning (edge_agent/service/pins.py): the first bundle a device accepts for a served
// model is pinned; another one is refused in one line naming both ids until accepted, and so is
// a renamed model's new bundle; trusted ids replace a pin, --refuse-unverified refuses a bundle
// neither known nor trusted; the Node store is the Python edge's pins.json (same text, mode 0600,
// replaced atomically) and a damaged file is an error, never a fresh start.
import assert from "node:assert/strict";
import { chmodSync, lstatSync, mkdtempSync, readFileSync, statSync, symlinkSync, writeFileSync, readdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { FilePinStore } from "../dist/node/pins.js";
import { BundleChanged, MemoryPinStore, checkPin, checkVouched, parseIds, serverKey } from "../dist/service/pins.js";
import { KNOWN } from "../dist/bundle/trust.js";

const A = "a".repeat(64);
const B = "b".repeat(64);

test("the pin key is pins.server_key's (urllib.parse.urlsplit)", () => {
  assert.equal(serverKey("http://127.0.0.1:8000", "m1"), "http://127.0.0.1:8000|m1");
  assert.equal(serverKey(" HTTPS://API.Example.com/base/ ", "sst2"), "https://api.example.com/base|sst2");
  assert.equal(serverKey("http://user:pw@Host:0080/x//", "m"), "http://host:80/x|m");
  assert.equal(serverKey("http://h:0/", "m"), "http://h|m"); // port 0 is falsy in Python
  assert.equal(serverKey("http://[::1]:9000/v", "m"), "http://::1:9000/v|m");
  assert.equal(serverKey("http://h", "m"), "http://h|m");
});

test("bundle ids are parsed as pins.parse_ids parses them", () => {
  assert.deepEqual([...parseIds(` ${A.toUpperCase()} ,, ${B}`, "--trusted-bundles")].sort(), [A, B]);
  assert.deepEqual([...parseIds([A, A], "--accept-bundle")], [A]);
  assert.equal(parseIds(undefined, "x").size, 0);
  assert.throws(() => parseIds("abc", "--accept-bundle"), { message: "--accept-bundle: 'abc' is not a bundle id (64 hex digits)" });
});

test("pinned on first use, the same again, a change refused until accepted, trusted ids", async () => {
  const store = new MemoryPinStore();
  assert.equal(await checkPin(store, "http://s", "m1", A, { record: false }), "pinned");
  assert.equal(store.pins.size, 0); // the check before the fetch writes nothing
  assert.equal(await checkPin(store, "http://s", "m1", A), "pinned");
  assert.equal(await checkPin(store, "http://s/", "m1", A), "same");
  const changed = `model m1 at http://s now names bundle ${B.slice(0, 12)}…, not the bundle ${A.slice(0, 12)}… this `
    + "device accepted for it first; a bundle decides what privatization means, so it never changes silently ";
  await assert.rejects(checkPin(store, "http://s", "m1", B, { audience: "cli" }), (e) => e instanceof BundleChanged
    && e.message === changed + `(accept it with --accept-bundle ${B})`);
  // a page is told its option, not a command-line flag (the default audience)
  await assert.rejects(checkPin(store, "http://s", "m1", B), (e) => e instanceof BundleChanged
    && e.message === changed + `(accept it with the acceptBundle option: acceptBundle: ["${B}"])`);
  assert.equal(await checkPin(store, "http://s", "m2", B), "pinned"); // another model: its own pin
  assert.equal(await checkPin(store, "http://s", "m1", B, { accept: new Set([B]) }), "accepted");
  assert.equal(await checkPin(store, "http://s", "m1", B), "same");
  const unverified = `bundle ${B.slice(0, 12)}… is unverified (not one privbert builds from public sources, nor one this `
    + "app trusts) and ";
  await assert.rejects(checkPin(store, "http://s", "m3", B, { refuseUnverified: true, audience: "cli" }), (e) => e instanceof BundleChanged
    && e.message === unverified + `--refuse-unverified refuses it; trust it with --trusted-bundles ${B} once you have checked it`);
  // a page is told its options (the default audience)
  await assert.rejects(checkPin(store, "http://s", "m3", B, { refuseUnverified: true }), (e) => e instanceof BundleChanged
    && e.message === unverified + `the refuseUnverified option refuses it; trust it with the trustedBundles option ${B} once you have checked it`);
  assert.equal(await checkPin(store, "http://s", "m3", B, { refuseUnverified: true, trusted: new Set([B]) }), "pinned");
  assert.equal(await checkPin(store, "http://s", "m4", KNOWN.none, { refuseUnverified: true }), "pinned"); // known
  // trusted ids add to the known ones: a trusted list alone refuses nothing
  assert.equal(await checkPin(store, "http://s", "m5", B, { trusted: new Set([A]) }), "pinned");
  assert.equal(await checkPin(store, "http://s", "m1", A, { trusted: new Set([A]) }), "accepted"); // a trusted id replaces the pin
  assert.equal(checkVouched(B, new Set(), false).kind, "unverified");
});

test("a renamed model's new bundle is refused until accepted; the same bundle renamed is not a change", async () => {
  const store = new MemoryPinStore();
  assert.equal(await checkPin(store, "http://s", "sst2", A, { served: ["sst2"] }), "pinned");
  const renamed = `http://s no longer serves model sst2, which this device pinned to bundle ${A.slice(0, 12)}…, and now `
    + `serves sst2-v2 with bundle ${B.slice(0, 12)}…; a renamed model never gets a new bundle silently (accept it with `;
  await assert.rejects(checkPin(store, "http://s", "sst2-v2", B, { served: ["sst2-v2"], audience: "cli" }),
    (e) => e instanceof BundleChanged && e.message === renamed + `--accept-bundle ${B})`);
  await assert.rejects(checkPin(store, "http://s", "sst2-v2", B, { served: ["sst2-v2"] }),
    (e) => e instanceof BundleChanged && e.message === renamed + `the acceptBundle option: acceptBundle: ["${B}"])`);
  assert.equal(await checkPin(store, "http://other", "sst2-v2", B, { served: ["sst2-v2"] }), "pinned"); // another server
  assert.equal(await checkPin(store, "http://s", "sst2-v2", A, { served: ["sst2-v2"] }), "pinned"); // same bundle
  assert.equal(await checkPin(store, "http://s", "sst2-v3", B, { served: ["sst2-v3"], accept: new Set([B]) }), "pinned");
  // a server that keeps its models and adds one: no rename
  assert.equal(await checkPin(store, "http://t", "a", A, { served: ["a"] }), "pinned");
  assert.equal(await checkPin(store, "http://t", "b", B, { served: ["a", "b"] }), "pinned");
});

test("pins.json under the ledger's rules: others may not write it, reading is warned, a symlink is resolved once", async () => {
  const dir = mkdtempSync(join(tmpdir(), "privbert-pins-rules-"));
  const target = join(dir, "real-pins.json");
  const warnings = [];
  const store = new FilePinStore(target, (m) => warnings.push(m));
  await checkPin(store, "http://s", "m1", A);
  chmodSync(target, 0o666);
  await assert.rejects(store.get("k"), { message: `${target}: the bundle pins are writable by others (mode 666): another user `
    + `could pin a bundle of theirs; chmod 600 ${target}` });
  chmodSync(target, 0o644);
  assert.equal(await store.get("http://s|m1"), A);
  assert.match(warnings[0], /readable by others \(mode 644\)/);
  chmodSync(target, 0o600);
  const link = join(dir, "pins.json");
  symlinkSync(target, link);
  const viaLink = new FilePinStore(link);
  await checkPin(viaLink, "http://s", "m2", B);
  assert.ok(lstatSync(link).isSymbolicLink(), "the link stays a link");
  assert.equal(JSON.parse(readFileSync(target, "utf-8")).pins["http://s|m2"], B);
});

test("pins.json is the Python edge's file: its text, mode 0600, atomic, damage is an error", async () => {
  const dir = mkdtempSync(join(tmpdir(), "privbert-pins-"));
  const path = join(dir, "cache", "pins.json");
  const store = new FilePinStore(path);
  assert.equal(await store.get("k"), null);
  await checkPin(store, "http://127.0.0.1:8000", "m1", A);
  await checkPin(store, "http://127.0.0.1:8000", "m0", B);
  // json.dump({"version": 1, "pins": pins}, f, indent=1, sort_keys=True)
  assert.equal(readFileSync(path, "utf-8"), `{\n "pins": {\n  "http://127.0.0.1:8000|m0": "${B}",\n`
    + `  "http://127.0.0.1:8000|m1": "${A}"\n },\n "version": 1\n}`);
  assert.equal(statSync(path).mode & 0o777, 0o600);
  assert.deepEqual(readdirSync(join(dir, "cache")), ["pins.json"]); // no temporary file left
  for (const bad of ["{not json", '{"version": 2, "pins": {}}', `{"version": 1, "pins": {"k": "short"}}`, "[]"]) {
    writeFileSync(path, bad);
    await assert.rejects(store.get("k"), { message: `${path}: not a privbert pins file; move it away to pin bundles afresh `
      + "(the next bundle each server names is accepted)" });
  }
});
