// The real `privbert-edge` CLI (bin/privbert-edge.js, a child process) on a tiny bundle written by
// test/tiny_bundle.mjs, held to edge-agent's behaviour (issue 34, finding 7): ledger files others
// can write are refused and ones they can read warned about, in edge-agent's words; a symlinked
// --ledger charges its target and stays a link; -o files are created 0600; a per-day cap refuses
// with exit 3 and runs on the boot clock, so a wall clock moved between runs buys nothing
// (test/shift_wall_clock.mjs moves Date.now of the child only).
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { chmodSync, existsSync, lstatSync, mkdtempSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { word, writeTinyBundle } from "./tiny_bundle.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const CLI = join(HERE, "..", "bin", "privbert-edge.js");
const SHIFT = join(HERE, "shift_wall_clock.mjs");
const DAY_MS = 86_400_000;
let tmp;
let bundle;
let bundleId;

before(async () => {
  tmp = mkdtempSync(join(tmpdir(), "privbert-edge-cli-"));
  bundle = join(tmp, "bundle");
  bundleId = await writeTinyBundle(bundle); // made-up words: the app trusts it (no text floor)
});
after(() => rmSync(tmp, { recursive: true, force: true }));

/** `privbert-edge ARGS` with this test's cache; ``shiftMs`` moves the child's Date.now. */
function cli(args, { shiftMs = 0, input } = {}) {
  const env = { ...process.env, PRIVBERT_CACHE: join(tmp, "cache"), WALL_CLOCK_SHIFT_MS: String(shiftMs),
    PRIVBERT_TRUSTED_BUNDLES: bundleId };
  delete env.PRIVBERT_EDGE_LEDGER;
  const p = spawnSync(process.execPath, [...(shiftMs ? ["--import", SHIFT] : []), CLI, ...args],
    { env, encoding: "utf8", input, timeout: 120_000 });
  return { code: p.status, out: p.stdout, err: p.stderr };
}

/** The last stderr line, which must be the only error line. */
function oneError(p, code) {
  assert.equal(p.code, code, p.err);
  const errors = p.err.split("\n").filter((l) => l.includes("error:"));
  assert.equal(errors.length, 1, p.err);
  return errors[0];
}

function lines(name, texts) {
  const path = join(tmp, name);
  writeFileSync(path, texts.map((t) => `${t}\n`).join(""));
  return path;
}

/** ``n`` texts of distinct made-up words (each its own memo key), from word ``start`` on. */
const texts = (start, n) => Array.from({ length: n }, (_, i) => `${word(start + 3 * i)} ${word(start + 3 * i + 1)} ${word(start + 3 * i + 2)}`);

const budget = (ledger, ...more) => {
  const p = cli(["budget", "--ledger", ledger, ...more]);
  assert.equal(p.code, 0, p.err);
  return JSON.parse(p.out);
};

const mode = (path) => (statSync(path).mode & 0o777).toString(8);

test("a ledger others can write is refused, one they can read is warned about (edge-agent's words)", () => {
  const led = join(tmp, "modes.json");
  budget(led, "--cap", "100");
  assert.equal(mode(led), "600");
  chmodSync(led, 0o666);
  const before = readFileSync(led, "utf8");
  const bad = oneError(cli(["budget", "--ledger", led, "--cap", "1e9"]), 1);
  assert.equal(bad, `privbert-edge: error: ${led}: the privacy ledger is writable by others (mode 666): `
    + `another user could reset its spend or cap; chmod 600 ${led}`);
  assert.equal(readFileSync(led, "utf8"), before); // nothing written
  chmodSync(led, 0o620);
  assert.match(oneError(cli(["budget", "--ledger", led]), 1), /writable by others \(mode 620\)/);
  const src = lines("modes.txt", ["ba bb"]);
  assert.match(oneError(cli(["privatize", src, "--bundle", bundle, "--eta", "5", "--ledger", led]), 1),
    /writable by others/);
  chmodSync(led, 0o644);
  const warned = cli(["budget", "--ledger", led]);
  assert.equal(warned.code, 0, warned.err);
  assert.equal(warned.err.trim(), `privbert-edge: warning: ${led}: the privacy ledger is readable by others (mode 644): `
    + `they can see what this device sent and when; chmod 600 ${led}`);
  assert.equal(JSON.parse(warned.out).cap, 100);
  chmodSync(led, 0o600);
  assert.equal(cli(["budget", "--ledger", led]).err, "");
  assert.equal(oneError(cli(["budget", "--ledger", tmp]), 1),
    `privbert-edge: error: ${tmp}: is a directory, not a privacy ledger file (--ledger FILE)`);
});

test("a symlinked --ledger is resolved once: its target is charged and the link stays a link", () => {
  const target = join(tmp, "real.json");
  const link = join(tmp, "link.json");
  symlinkSync(target, link); // dangling: the ledger is made at the target
  budget(link, "--cap", "1e6");
  assert.ok(lstatSync(link).isSymbolicLink());
  assert.equal(budget(target).cap, 1e6);
  const src = lines("link.txt", texts(0, 3));
  const run = cli(["privatize", src, "--bundle", bundle, "--eta", "5", "--ledger", link]);
  assert.equal(run.code, 0, run.err);
  assert.ok(lstatSync(link).isSymbolicLink());
  const st = budget(target);
  assert.equal(st.sends, 3);
  assert.equal(st.ledger, target); // messages name the real file, as edge-agent's
  assert.ok(existsSync(`${target}.key`) && !existsSync(`${link}.key`)); // one memo key, beside the target
  const again = cli(["privatize", src, "--bundle", bundle, "--eta", "5", "--ledger", target]);
  assert.equal(again.code, 0, again.err);
  assert.equal(budget(target).sends, 3); // memoized through either name: the same key
  assert.equal(mode(target), "600");
});

test("-o files are created 0600, also an empty one", () => {
  const out = join(tmp, "out.jsonl");
  const run = cli(["privatize", lines("o.txt", texts(30, 2)), "--bundle", bundle, "--eta", "5", "--ledger", join(tmp, "o.json"), "-o", out]);
  assert.equal(run.code, 0, run.err);
  assert.equal(readFileSync(out, "utf8").trim().split("\n").length, 2);
  assert.equal(mode(out), "600");
  const empty = join(tmp, "empty.jsonl");
  const none = cli(["privatize", lines("blank.txt", ["", "  "]), "--bundle", bundle, "--eta", "5", "--ledger", join(tmp, "o.json"), "-o", empty]);
  assert.equal(none.code, 0, none.err);
  assert.equal(readFileSync(empty, "utf8"), "");
  assert.equal(mode(empty), "600");
});

test("a per-day cap refuses with exit 3, and a wall clock moved between runs buys nothing", () => {
  const led = join(tmp, "day.json");
  const common = ["--bundle", bundle, "--eta", "5", "--ledger", led];
  const first = cli(["privatize", lines("d0.txt", texts(60, 10)), ...common]);
  assert.equal(first.code, 0, first.err);
  const cost = budget(led).spent;
  const st = budget(led, "--per-day", String(1.5 * cost));
  assert.deepEqual([st.per_day.cap, st.per_day.spent_last_24h], [1.5 * cost, cost]);
  const ahead = cli(["privatize", lines("d1.txt", texts(90, 10)), ...common], { shiftMs: 2 * DAY_MS });
  assert.match(oneError(ahead, 3), /in the last 24 hours, this run needs .*per-day cap .*nothing was written or sent/);
  assert.equal(ahead.out, "");
  const back = cli(["privatize", lines("d2.txt", texts(120, 10)), ...common], { shiftMs: -2 * DAY_MS });
  assert.match(oneError(back, 3), /in the last 24 hours/);
  const small = cli(["privatize", lines("d3.txt", texts(150, 2)), ...common], { shiftMs: 2 * DAY_MS });
  assert.equal(small.code, 0, small.err); // an honest correction of the clock refuses nothing that fits
  const end = budget(led);
  assert.ok(end.per_day.spent_last_24h <= 1.5 * cost, JSON.stringify(end));
  assert.equal(end.per_day.spent_last_24h, end.spent);
  assert.equal(oneError(cli(["budget", "--ledger", led, "--per-day", "-1"]), 2),
    "privbert-edge: error: --per-day must be >= 0 or none, got -1");
  assert.equal(budget(led, "--per-day", "none").per_day, null);
});
