// The web edge's constants and refusals come from the mechanism spec (shared/spec/mechanisms.json,
// generated from the Python registry into src/generated/spec.ts), never from a copy: the
// generated module is the committed JSON, every template the code formats exists there and
// formats with src/format/messages.ts, no sentence of a template is written anywhere else in src/, and
// the refusals come out word for word as the Python edge's golden vectors (tests/golden/floor.json).
import assert from "node:assert/strict";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { checkDchiFloor } from "../dist/floor/floor.js";
import { FLOOR, MESSAGES, SPEC } from "../dist/generated/spec.js";
import { fmtG, format, message, pct, weakHead } from "../dist/format/messages.js";
import { loadBundleDir } from "../dist/node/caches.js";
import { Pcg64Source } from "../dist/random/pcg64.js";
import { Laplace } from "../dist/mechanisms/laplace.js";
import { OME } from "../dist/mechanisms/ome.js";

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = join(HERE, "..", "..");
const SRC = join(HERE, "..", "src");
const json = (path) => JSON.parse(readFileSync(path, "utf8"));
const floor = json(join(ROOT, "tests", "golden", "floor.json"));
const pay = json(join(ROOT, "tests", "golden", "payloads.json"));

/** Every .ts file under src/ but the generated ones, as [path, text]. */
function sources(dir = SRC) {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = join(dir, e.name);
    if (e.isDirectory()) return e.name === "generated" ? [] : sources(p);
    return e.name.endsWith(".ts") ? [[relative(SRC, p), readFileSync(p, "utf8")]] : [];
  });
}

/** The fields of a template: [name, spec or undefined]. */
const fields = (t) => [...t.matchAll(/\{([A-Za-z_]\w*)(?::([^{}]*))?\}/g)].map((m) => [m[1], m[2]]);

test("src/generated/spec.ts is shared/spec/mechanisms.json (python -m shared.spec wrote both)", () => {
  assert.deepEqual(JSON.parse(JSON.stringify(SPEC)), json(join(ROOT, "shared", "spec", "mechanisms.json")));
});

test("format: Python's str.format for {name}, {name:g}, {name:.Ng}, {name:,}; anything else throws", () => {
  assert.equal(format("{a} {b}", { a: "x", b: 3 }), "x 3");
  assert.equal(format("{a} {b}", { a: 2.5, b: Infinity }), "2.5 inf"); // str(float)
  assert.equal(format("{a:g}|{b:g}|{c:g}|{d:g}", { a: 400, b: 1e12, c: 1e-5, d: 0.0001 }), "400|1e+12|1e-05|0.0001");
  assert.equal(format("{a:g}", { a: 123456789 }), "1.23457e+08");
  assert.equal(format("{a:.3g}|{b:.3g}", { a: 15.526078848563357, b: 1e-12 }), "15.5|1e-12");
  assert.equal(format("{a:,}|{b:,}|{c:,}", { a: 1968, b: 48, c: 1234567 }), "1,968|48|1,234,567");
  assert.equal(format("{{a}} ${env}", { env: "X" }), "{a} $X");
  assert.throws(() => format("{a}", {}), /no value/);
  assert.throws(() => format("{a:.2f}", { a: 1 }), /not one the web edge formats/);
  assert.throws(() => format("{a:,}", { a: 1.5 }), /integer/);
  assert.throws(() => format("{a:g}", { a: "x" }), /number/);
  assert.throws(() => format("a } b", {}), /lone/);
});

test("every template of the spec formats with the field forms the web edge knows", () => {
  for (const [name, t] of Object.entries(MESSAGES)) {
    const values = Object.fromEntries(fields(t).map(([f, spec]) => [f, spec === undefined ? "x" : 1]));
    assert.doesNotThrow(() => format(t, values), name);
  }
});

test("every template the web edge formats exists in the spec, and is formatted by name only", () => {
  const used = new Set();
  for (const [path, text] of sources()) {
    if (path === join("format", "messages.ts")
        || !/import \{[^}]*\bmessage\b[^}]*\} from "(?:\.\/|(?:\.\.\/)+)(?:format\/)?messages\.js"/.test(text)) continue;
    for (const m of text.matchAll(/\bmessage\(\s*([^,)]+)/g)) {
      const arg = m[1].trim();
      const names = [...arg.matchAll(/"([A-Z0-9_]+)"/g)].map((x) => x[1]);
      assert.ok(names.length, `${path}: message(${arg}): name the template with a string literal`);
      for (const n of names) {
        assert.ok(n in MESSAGES, `${path}: template ${n} is not in the spec (add it to shared/messages.py)`);
        used.add(n);
      }
    }
  }
  // the refusals of the floor, the tables, the computability checks, bundles and pins
  for (const n of ["WEAK_HEAD", "DCHI_WHAT", "DCHI_MEASURED", "DCHI_DEGENERATE", "DCHI_NOT_FINITE", "TABLE_IDENTICAL",
    "TABLE_NEAR_DUPLICATES", "TABLE_NON_FINITE", "LAPLACE_WHAT", "LAPLACE_ROUNDING", "BITS_WHAT", "BITS_FIXED",
    "DCHI_TOO_SMALL", "LAPLACE_TOO_SMALL", "TABLE_ONLY", "PIN_CHANGED", "PIN_RENAMED", "UNVERIFIED_REFUSED",
    "TEXT_FLOOR_HEAD", "TEXT_FLOOR_DECODED", "TEXT_FLOOR_PIECES", "TEXT_FLOOR_UNREAD", "TEXT_FLOOR_TAIL", "TABLE_SUBNORMAL",
    "DCHI_TABLE_NOT_FINITE", "BUNDLE_KNOWN", "BUNDLE_TRUSTED", "BUNDLE_UNVERIFIED"]) {
    assert.ok(used.has(n) || n === "WEAK_HEAD", `the web edge does not format ${n}`);
  }
});

/** The string literals of a TypeScript source (comments dropped first). */
function literals(text) {
  const code = text.replace(/\/\*[\s\S]*?\*\//g, "").replace(/(^|[^:"'`\\])\/\/[^\n]*/g, "$1");
  return code.match(/"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`(?:[^`\\]|\\.)*`/g) ?? [];
}

test("no part of a template is hand-copied into a string of src/ (only the generated spec holds them)", () => {
  const WINDOW = 30; // any 30 characters of a template's fixed text (shorter pieces, like "float32", are words)
  const strings = sources().map(([path, text]) => [path, literals(text).join("\n")]);
  assert.ok(strings.some(([, s]) => s.includes("privbert-edge")), "the literals of src/ are read");
  for (const [name, t] of Object.entries(MESSAGES)) {
    for (const piece of t.split(/\{[^{}]*\}/).filter((x) => x.trim().length >= WINDOW)) {
      for (let i = 0; i + WINDOW <= piece.length; i++) {
        const w = piece.slice(i, i + WINDOW);
        for (const [path, s] of strings) {
          assert.ok(!s.includes(w), `${path} copies ${JSON.stringify(w)} of ${name}: use message("${name}", ...)`);
        }
      }
    }
  }
});

test("the floor's constants are the spec's (shared.floor's) and the golden vectors'", async () => {
  const mod = await import("../dist/floor/floor.js");
  for (const k of ["THRESHOLD", "MEASURE_FIRST", "MEASURE_BATCH", "MEASURE_MAX", "MEASURE_Z", "NEAR_DUPLICATE", "DUPLICATE_SAMPLE"]) {
    assert.equal(mod[k], FLOOR[k], k);
    assert.equal(mod[k], floor.constants[k], k);
  }
  assert.equal(mod.ESTIMATE_TOKENS, FLOOR.ESTIMATE_TOKENS);
});

// -- the refusals, word for word as the Python edge's golden vectors ---------------------------------
const byReason = (pred) => floor.cases.filter((c) => c.reason !== null && pred(c));

test("the formatted refusals of the golden floor cases equal shared.floor's", () => {
  const checked = new Set();
  for (const c of byReason((c) => c.mechanism.startsWith("dchi") && c.bundle !== "degenerate")) {
    // the share, the count and the estimate are measured: read from the golden line; the words are the templates'
    const m = /: ([\d.]+%) of ([\d,]+) tokens .* starts near eta=([\d.e+-]+)\)$/.exec(c.reason);
    assert.ok(m, c.reason);
    const head = weakHead(message("DCHI_WHAT", { mechanism: c.mechanism, eta: c.params.eta }));
    const outcome = message(c.mechanism === "dchi-text" ? "DCHI_TEXT_OUTCOME" : "DCHI_EMBEDDING_OUTCOME");
    const got = message("DCHI_MEASURED", { head, share: m[1], drawn: Number(m[2].replaceAll(",", "")), outcome,
      floor: pct(FLOOR.THRESHOLD), start: Number(m[3]) });
    assert.equal(got, c.reason);
    checked.add("dchi");
  }
  for (const c of byReason((c) => c.bundle === "degenerate")) {
    const head = weakHead(message("DCHI_WHAT", { mechanism: c.mechanism, eta: c.params.eta }));
    const problem = message("TABLE_IDENTICAL", { tokens: 2, rows: 48, groups: 1 }); // rows 20 and 21 of the tiny table
    assert.equal(message("DCHI_DEGENERATE", { head, problem }), c.reason);
    checked.add("degenerate");
  }
  for (const c of byReason((c) => c.mechanism === "laplace")) {
    const p = c.params;
    assert.equal(new Laplace(p.epsilon, p.calibration, p.word_dropout).weakReason(c.dim), c.reason);
    checked.add("laplace");
  }
  for (const c of byReason((c) => c.mechanism === "ome")) {
    const p = c.params;
    assert.equal(new OME(p.epsilon, p.lam, c.dim, p.int_bits, p.frac_bits).weakReason(), c.reason);
    checked.add("ome");
  }
  for (const c of byReason((c) => c.mechanism === "none")) {
    assert.equal(message("NONE_REFUSED"), c.reason);
    checked.add("none");
  }
  assert.deepEqual([...checked].sort(), ["dchi", "degenerate", "laplace", "none", "ome"]);
});

/** The golden bundle ``name`` as the directory shared/bundle.py saves (its original layout). */
function npy(descr, shape, bytes) {
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': (${shape.join(", ")}${shape.length === 1 ? "," : ""}), }`;
  const total = Math.ceil((10 + header.length + 1) / 64) * 64;
  header = header.padEnd(total - 10 - 1, " ") + "\n";
  const out = new Uint8Array(total + bytes.length);
  out.set([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 1, 0, (total - 10) & 255, (total - 10) >> 8]);
  out.set(new TextEncoder().encode(header), 10);
  out.set(bytes, total);
  return out;
}

test("the dχ floor of the web edge refuses the golden cases of the tiny bundle word for word (same seeds)", async () => {
  const b = pay.bundles.tiny;
  assert.ok(b.embeddings_equal_table);
  const dir = mkdtempSync(join(tmpdir(), "privbert-spec-"));
  try {
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "tokenizer.json"), pay.tokenizer_json);
    const t = Float32Array.from(b.table);
    writeFileSync(join(dir, "embeddings.npy"), npy("<f4", [t.length / b.dim, b.dim], new Uint8Array(t.buffer)));
    writeFileSync(join(dir, "bundle.json"), JSON.stringify({ ...b.meta, bundle_id: b.bundle_id }));
    const bundle = await loadBundleDir(dir);
    assert.equal(bundle.bundleId, floor.bundle_ids.tiny);
    const cases = floor.cases.filter((c) => c.bundle === "tiny");
    assert.ok(cases.some((c) => c.reason !== null) && cases.some((c) => c.reason === null));
    for (const c of cases) {
      const why = await checkDchiFloor(c.mechanism, c.params.eta, bundle, null,
        { source: new Pcg64Source(BigInt(c.seed)), allowWeak: true });
      assert.equal(why, c.reason, `${c.mechanism} eta=${fmtG(c.params.eta)} seed ${c.seed}`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
