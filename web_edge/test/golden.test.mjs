// The golden vectors of the Python edge (tests/golden/*.json, written by
// `python -m tests.golden.make_golden`): the web edge draws and computes the same numbers for
// the same seeds, checked here without Python. Parts the web edge does not offer yet are
// `todo` (they run, and report, without failing the suite): the designed (pca int8) table.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { diameter, dchiCost, fits, fmtEps } from "../dist/ledger/ledger.js";
import { ExactNearest } from "../dist/search/nearest.js";
import { Pcg64Source } from "../dist/random/pcg64.js";
import {
  choiceWithoutReplacement,
  permutation,
  sampleDchiNoise,
  standardExponential,
  standardGamma,
  standardNormal,
} from "../dist/random/samplers.js";
import { laplaceDraw } from "../dist/mechanisms/laplace.js";
import { bitFlipEpsilon } from "../dist/mechanisms/ome.js";

const HERE = dirname(fileURLToPath(import.meta.url));
const GOLDEN = join(HERE, "..", "..", "tests", "golden");
const golden = (name) => JSON.parse(readFileSync(join(GOLDEN, `${name}.json`), "utf8"));
const num = (x) => (x === "inf" ? Infinity : x === "-inf" ? -Infinity : x === "nan" ? NaN : x);
const draws = (n, f) => Array.from({ length: n }, f);

const random = golden("random");

test("PCG64: the raw 64-bit stream and its doubles for each seed", () => {
  for (const s of random.streams) {
    const src = new Pcg64Source(BigInt(s.seed));
    const raw = draws(s.raw.length, () => {
      src.next64();
      return ((BigInt(src.hi >>> 0) << 32n) | BigInt(src.lo >>> 0)).toString();
    });
    assert.deepEqual(raw, s.raw, `seed ${s.seed}`);
    const u = new Pcg64Source(BigInt(s.seed));
    assert.deepEqual(draws(s.random.length, () => u.nextDouble()), s.random);
  }
});

test("the ziggurat normal and exponential draw numpy's numbers", () => {
  for (const s of random.streams) {
    const a = new Pcg64Source(BigInt(s.seed));
    assert.deepEqual(draws(s.standard_normal.length, () => standardNormal(a)), s.standard_normal);
    const b = new Pcg64Source(BigInt(s.seed));
    assert.deepEqual(draws(s.standard_exponential.length, () => standardExponential(b)),
      s.standard_exponential);
  }
});

test("Gamma(shape, scale) draws (scale · standard gamma, as numpy)", () => {
  for (const g of random.gamma) {
    const src = new Pcg64Source(BigInt(g.seed));
    assert.deepEqual(draws(g.draws.length, () => g.scale * standardGamma(src, g.shape)), g.draws,
      `shape ${g.shape}`);
  }
});

test("choice without replacement and permutations", () => {
  for (const c of random.choice_without_replacement) {
    const got = choiceWithoutReplacement(new Pcg64Source(BigInt(c.seed)), c.population, c.size);
    assert.deepEqual(Array.from(got), c.draws, `choice(${c.population}, ${c.size})`);
  }
  for (const p of random.permutation) {
    assert.deepEqual(Array.from(permutation(new Pcg64Source(BigInt(p.seed)), p.n)), p.draws);
  }
});

// A known difference, reported by this `todo` test until the web edge matches numpy:
// Math.log is not glibc's log (a Laplace draw can differ in its last bit). The payload bytes
// of the CLI runs below agree all the same. A dχ noise vector's norm is summed in numpy's
// pairwise order, and the diameter D exactly (correctly rounded sums) in both edges, so
// both agree to the bit.
test("Laplace draws", { todo: "Math.log is not C's log: the last bit of a draw can differ" }, () => {
  for (const l of random.laplace) {
    const src = new Pcg64Source(BigInt(l.seed));
    assert.deepEqual(draws(l.draws.length, () => laplaceDraw(src, l.scale)), l.draws);
  }
});

test("dχ noise: sample_dchi_noise's Gamma radii and normals for a seed", () => {
  for (const d of random.dchi_noise) {
    const src = new Pcg64Source(BigInt(d.seed));
    assert.deepEqual(draws(d.count, () => (1 / d.eta) * standardGamma(src, d.dim)), d.radius);
    assert.deepEqual(draws(d.count * d.dim, () => standardNormal(src)), d.normals);
  }
});

test("dχ noise: sample_dchi_noise's vectors for a seed, to the bit", () => {
    for (const d of random.dchi_noise) {
      const got = sampleDchiNoise(d.count, d.dim, d.eta, new Pcg64Source(BigInt(d.seed)));
      assert.deepEqual(Array.from(got), d.noise, `dim ${d.dim}, eta ${d.eta}`);
    }
  });

test("the exact nearest row, near ties to the lowest row", async () => {
  const n = golden("nearest");
  const table = Float32Array.from(n.table.values);
  const queries = Float64Array.from(n.queries.values);
  const index = await ExactNearest.create(table, n.table.rows, n.table.dim);
  assert.deepEqual(Array.from(await index.search(queries)), n.nearest_rows);
  const withIds = await ExactNearest.create(table, n.table.rows, n.table.dim, Int32Array.from(n.ids));
  assert.deepEqual(Array.from(await withIds.search(queries)), n.nearest_ids);
});

const led = golden("ledger");

test("ledger: the tiny bundle's diameter D, to the last bit", () => {
  const b = golden("payloads").bundles.tiny;
  assert.equal(diameter(Float32Array.from(b.table), b.dim, b.regular_ids), led.diameter);
});

test("ledger: D is exact where a plain sum picks the wrong row", () => {
  assert.ok(led.diameters.length >= 2);
  for (const c of led.diameters) {
    const t = Float32Array.from(c.table);
    assert.equal(diameter(t, c.dim, c.rows), num(c.diameter), JSON.stringify(c.rows));
  }
  // the case is one: an in-order float64 sum would pick row 1 (1 + 2^-51) over row 0
  const [all, noFirst] = led.diameters;
  assert.ok(all.diameter > noFirst.diameter, "row 0's exact norm is the largest");
});

test("ledger: dχ costs for a given D, the cap filter, bit-flip epsilon", () => {
  for (const c of led.costs.filter((x) => x.cost.family === "dchi")) {
    const got = dchiCost(c.mechanism, c.params.eta, c.tokens, c.diameter);
    assert.equal(got.epsilon, num(c.cost.epsilon), c.mechanism);
    assert.equal(got.metric, num(c.cost.metric));
    assert.equal(got.tokens, c.cost.tokens);
  }
  for (const f of led.fits) assert.equal(fits(f.spent, f.epsilon, f.cap), f.fits, JSON.stringify(f));
  for (const e of led.bit_flip_epsilon) {
    assert.equal(bitFlipEpsilon(Float64Array.from(e.p), e.q), num(e.value));
  }
});

test("ledger: an epsilon in a message is written as the Python edge writes it", () => {
  assert.ok(led.eps_text.length >= 10);
  for (const [value, text] of led.eps_text) assert.equal(fmtEps(value === null ? null : num(value)), text, String(value));
});

// -- payload bytes through the command line ------------------------------------------------
const pay = golden("payloads");
const CLI = join(HERE, "..", "bin", "privbert-edge.js");

function npy(descr, shape, bytes) {
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': (${shape.join(", ")}${shape.length === 1 ? "," : ""}), }`;
  const total = Math.ceil((10 + header.length + 1) / 64) * 64;
  header = header.padEnd(total - 10 - 1, " ") + "\n";
  const out = new Uint8Array(total + bytes.byteLength);
  out.set([0x93, ...new TextEncoder().encode("NUMPY"), 1, 0, header.length & 255, header.length >> 8], 0);
  out.set(new TextEncoder().encode(header), 10);
  out.set(bytes, total);
  return out;
}

/** The golden bundle ``name`` as the directory shared/bundle.py saves. */
function writeBundle(dir, name) {
  const b = pay.bundles[name];
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "tokenizer.json"), pay.tokenizer_json);
  const rows = b.table.length / b.dim;
  if (b.embeddings_equal_table) {
    const t = Float32Array.from(b.table);
    writeFileSync(join(dir, "embeddings.npy"), npy("<f4", [rows, b.dim], new Uint8Array(t.buffer)));
  } else {
    const q = Int8Array.from(b.stored);
    writeFileSync(join(dir, "table.npy"), npy("|i1", [rows, b.dim], new Uint8Array(q.buffer)));
    const s = Float32Array.from(b.scale);
    writeFileSync(join(dir, "table_scale.npy"), npy("<f4", [b.dim], new Uint8Array(s.buffer)));
  }
  writeFileSync(join(dir, "bundle.json"), JSON.stringify({ ...b.meta, bundle_id: b.bundle_id }));
}

for (const run of pay.cli) {
  if (run.args.includes("none")) {
    // edge-agent's experiments-only plain ids: the web edge never sends them, and says so
    test(`privbert-edge privatize ${run.args.join(" ")}: refused in one line, naming edge-agent`, async () => {
      const args = run.args.filter((a) => a !== "--allow-none");
      await assert.rejects(promisify(execFile)(process.execPath, [CLI, "privatize", "-", ...args,
        "--bundle", "/nonexistent"]), (err) => {
        assert.equal(err.code, 2);
        assert.equal(err.stdout, "");
        assert.match(err.stderr, /^privbert-edge: error: --mechanism none sends plain token ids: .*edge-agent privatize --allow-none\n$/);
        return true;
      });
    });
    continue;
  }
  test(`privbert-edge privatize ${run.args.join(" ")} --seed ${run.seed} (${run.bundle}): the JSONL of edge-agent`,
    async () => {
      const work = mkdtempSync(join(tmpdir(), "golden-"));
      try {
        writeBundle(join(work, "bundle"), run.bundle);
        writeFileSync(join(work, "in.txt"), pay.input_lines.join("\n") + "\n");
        const { stdout } = await promisify(execFile)(process.execPath, [CLI, "privatize",
          join(work, "in.txt"), ...run.args, "--seed", String(run.seed), "--bundle",
          join(work, "bundle"), "--allow-weak-privacy", "--ledger", join(work, "ledger.json")],
        { env: { ...process.env, PRIVBERT_CACHE: join(work, "cache") } });
        assert.deepEqual(stdout.split("\n").filter((x) => x), run.lines);
      } finally {
        rmSync(work, { recursive: true, force: true });
      }
    });
}
