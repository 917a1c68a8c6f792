// What the text floor adds to Privatizer.create in @privbert/edge (bench/text_floor.py --node):
// the known bundle (baseline), an unverified one on a first load and with the signed cache.
//
//   node bench/text_floor_node.mjs KNOWN_DIR UNVERIFIED_DIR ETA
import { Privatizer } from "../web_edge/dist/mechanisms/privatizer.js";
import { MemoryTextFloorCache } from "../web_edge/dist/floor/text_floor_cache.js";
import { loadBundleDir } from "../web_edge/dist/node/caches.js";

const [knownDir, unverifiedDir, etaText] = process.argv.slice(2);
const eta = Number(etaText);
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function create(dir, cache) {
  const bundle = await loadBundleDir(dir);
  const t0 = performance.now();
  const p = await Privatizer.create(bundle, { mechanism: "dchi-text", eta, backend: "loop", threads: 1,
    textFloorCache: cache });
  const ms = performance.now() - t0;
  const kind = p.trust.kind;
  const draws = p.textFloor?.measure.draws ?? 0;
  await p.release();
  return { ms, kind, draws, cached: p.textFloor?.cached ?? false };
}

const rows = [];
for (const [what, dir, fresh] of [["known pca32-int8 (no text floor)", knownDir, true],
  ["unverified pca32, first load", unverifiedDir, true], ["unverified pca32, signed cache", unverifiedDir, false]]) {
  const runs = [];
  const cache = new MemoryTextFloorCache();
  if (!fresh) await create(dir, cache); // the first load keeps its pass
  for (let i = 0; i < 5; i++) runs.push(await create(dir, fresh ? null : cache));
  rows.push(`| ${what} | ${runs[0].kind} | ${runs[0].draws} | ${runs[0].cached} | ${median(runs.map((r) => r.ms)).toFixed(0)} `
    + `| ${runs.map((r) => r.ms.toFixed(0)).join(" ")} |`);
}
const base = Number(rows[0].split("|")[5]);
process.stdout.write("| Privatizer.create (Node, loop search) | trust | text floor draws | cached | median ms | each ms |\n"
  + "| --- | --- | --- | --- | --- | --- |\n" + rows.join("\n") + "\n");
process.stdout.write(`added by the text floor: first load ${(Number(rows[1].split("|")[5]) - base).toFixed(0)} ms, `
  + `with the cache ${(Number(rows[2].split("|")[5]) - base).toFixed(0)} ms (target <= 300 ms)\n`);
