// The web edge's side of bench/web_edge.py: dχ-text privatization of one sentence in Node
// (onnxruntime-web's WebAssembly backend, as in a page), warm, timed per call. Prints JSON.
//   node bench/web_edge_node.mjs BUNDLE_DIR "sentence" ETA REPEATS THREADS
import { loadBundleDir } from "../web_edge/dist/node/caches.js";
import { Privatizer } from "../web_edge/dist/mechanisms/privatizer.js";

const [dir, sentence, eta, repeats, threads] = process.argv.slice(2);
const t0 = performance.now();
const bundle = await loadBundleDir(dir);
const t1 = performance.now();
const priv = await Privatizer.create(bundle, { mechanism: "dchi-text", eta: Number(eta), threads: Number(threads) });
const t2 = performance.now();
const first = performance.now();
await priv.privatize([sentence]);
const firstMs = performance.now() - first;
for (let i = 0; i < 3; i++) await priv.privatize([sentence]); // warm-up
const times = [], search = [];
const cpu0 = process.cpuUsage();
for (let i = 0; i < Number(repeats); i++) {
  const a = performance.now();
  const items = priv.tokenize([sentence]);
  const b = performance.now();
  const data = await priv.privatizeData(items);
  const c = performance.now();
  priv.payloads(items, data);
  times.push(performance.now() - a);
  search.push(c - b);
}
const cpu = process.cpuUsage(cpu0);
const tokens = priv.tokenize([sentence])[0].idsA.length;
const sorted = [...times].sort((x, y) => x - y);
console.log(JSON.stringify({
  tokens, threads: Number(threads), load_bundle_ms: t1 - t0, setup_ms: t2 - t1, first_ms: firstMs,
  median_ms: sorted[Math.floor(sorted.length / 2)], best_ms: sorted[0],
  noise_and_search_median_ms: [...search].sort((x, y) => x - y)[Math.floor(search.length / 2)],
  cpu_ms_per_call: (cpu.user + cpu.system) / 1000 / Number(repeats),
}));
await priv.release();
