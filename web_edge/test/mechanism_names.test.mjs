// One home per mechanism (issue 45): outside src/mechanisms/ no source of the library names a
// mechanism in its code; everything asks the registry (src/mechanisms/registry.ts) or the spec
// (src/mechanisms/specs.ts, src/generated/spec.ts). Comments may name them; string literals,
// template texts and type literals may not. "none" is left out: it is also the word for no
// table projection, no cap and no ε in the library's strings, and the web edge never sends it.
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import ts from "typescript";

import { MECHANISMS } from "../dist/generated/spec.js";
import { DEFAULT_MECHANISM, mechanismModule, mechanismNames, refusal } from "../dist/mechanisms/registry.js";

const SRC = join(dirname(fileURLToPath(import.meta.url)), "..", "src");
const EXEMPT = new Set(["none"]);
const NAMES = MECHANISMS.map((m) => m.name).filter((n) => !EXEMPT.has(n));

function* sources(dir) {
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) yield* sources(p);
    else if (p.endsWith(".ts")) yield p;
  }
}

/** Every string text of a source: literals, template parts, literal types (not the paths of
 * imports and exports: index.ts re-exports the mechanisms' classes from their modules). */
function strings(path) {
  const file = ts.createSourceFile(path, readFileSync(path, "utf8"), ts.ScriptTarget.Latest, true);
  const out = [];
  const visit = (node) => {
    if ((ts.isImportDeclaration(node) || ts.isExportDeclaration(node)) && node.moduleSpecifier) return;
    if (ts.isStringLiteral(node) || ts.isNoSubstitutionTemplateLiteral(node)) out.push(node.text);
    else if (ts.isTemplateExpression(node)) out.push(node.head.text, ...node.templateSpans.map((s) => s.literal.text));
    ts.forEachChild(node, visit);
  };
  visit(file);
  return out;
}

const names = (text) => NAMES.filter((n) => new RegExp(`(^|[^\\w-])${n}($|[^\\w-])`).test(text));

test("no source outside src/mechanisms/ names a mechanism (the generated spec aside)", () => {
  const found = [];
  for (const path of sources(SRC)) {
    const rel = relative(SRC, path);
    if (rel.startsWith("mechanisms/") || rel.startsWith("generated/")) continue;
    for (const s of strings(path)) for (const n of names(s)) found.push(`${rel}: ${n} in ${JSON.stringify(s.slice(0, 60))}`);
  }
  assert.deepEqual(found, []);
});

test("the check finds a name where one is written", () => {
  // the mechanisms folder does name them: the scan is not blind
  const inFolder = [...sources(join(SRC, "mechanisms"))].flatMap((p) => strings(p).flatMap(names));
  for (const n of mechanismNames()) assert.ok(inFolder.includes(n), n);
});

test("the registry holds the web edge's mechanisms, keyed by the spec's names", () => {
  const spec = MECHANISMS.map((m) => m.name);
  for (const n of mechanismNames()) {
    assert.ok(spec.includes(n), n);
    assert.equal(mechanismModule(n).name, n);
    assert.equal(refusal(n), null);
  }
  assert.ok(mechanismNames().includes(DEFAULT_MECHANISM));
  // a mechanism of the spec the web edge leaves to the Python edge: refused, naming edge-agent
  for (const n of spec.filter((x) => !mechanismNames().includes(x))) {
    assert.throws(() => mechanismModule(n), (e) => e instanceof RangeError && /edge-agent privatize/.test(e.message));
    assert.match(refusal(n, "cli"), /^--mechanism /);
  }
  assert.throws(() => mechanismModule("no-such"), /no payload format for mechanism "no-such"/);
});
