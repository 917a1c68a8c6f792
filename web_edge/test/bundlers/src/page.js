// A web developer's page, from the README and docs/web.md only: one EdgeSession, a textarea
// and a button. Built unchanged by Vite, esbuild and webpack (build.mjs). Its settings come
// from the query string (the test's): server (default: this origin's /privbert, a forwarding
// backend), key, wasm (wasmPaths), search (the search's backend: int8 runs it on
// onnxruntime-web, as a 384-d table's does), worker=1, login (the forwarder's toy sign-in),
// warmup=1 (warmUp() once the session is open), pin=ID&model=M (the test's stand-in for an
// earlier visit that pinned another bundle for model M).
import { EdgeSession, IndexedDbPinStore, serverKey, summary, warmUp } from "@privbert/edge";

const q = new URLSearchParams(location.search);
const $ = (id) => document.getElementById(id);
const state = { progress: [], longTasks: [], openMs: null, result: null, error: null };
window.privbert = state;
let session = null;

try {
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) state.longTasks.push(Math.round(e.duration));
  }).observe({ type: "longtask", buffered: true });
} catch { /* no long task timing here */ }

function fail(err, t0) {
  state.error = { name: err?.name ?? "Error", message: String(err?.message ?? err), ms: performance.now() - t0 };
  $("error").textContent = `${state.error.name}: ${state.error.message}`;
  $("error").hidden = false;
  document.body.dataset.done = "1";
}

async function open() {
  const t0 = performance.now();
  try {
    if (q.get("login")) {
      const r = await fetch("/login", { method: "POST", body: JSON.stringify({ token: q.get("login") }) });
      if (!r.ok) throw new Error(`sign-in refused (${r.status})`);
    }
    const server = q.get("server") || `${location.origin}/privbert`;
    if (q.get("pin")) await new IndexedDbPinStore().put(serverKey(server, q.get("model")), q.get("pin"));
    const worker = q.get("worker") === "1"
      ? new Worker(new URL("./privbert-worker.js", import.meta.url), { type: "module" })
      : null;
    session = await EdgeSession.open({
      server,
      apiKey: q.get("key"),
      wasmPaths: q.get("wasm") || undefined,
      backend: q.get("search") || undefined,
      worker,
      bundleCache: true,
      trustedBundles: q.getAll("trusted"),
      onProgress: (p) => state.progress.push({ ...p, at: Math.round(performance.now() - t0) }),
    });
    state.openMs = performance.now() - t0;
    state.labels = session.labels;
    state.guarantee = summary(session.guarantee);
    if (q.get("warmup") === "1") await warmUp();
    $("status").textContent = "ready";
    $("go").disabled = false;
    document.body.dataset.ready = "1";
  } catch (err) {
    fail(err, t0);
  }
}

$("go").addEventListener("click", async () => {
  const t0 = performance.now();
  document.body.dataset.done = "";
  try {
    const { sent, predictions } = await session.predict($("text").value);  // a string: a batch of one
    state.result = { label: predictions[0].label, scores: predictions[0].scores, payload: sent[0].payload,
      privatizedText: sent[0].privatizedText, ms: performance.now() - t0 };
    $("label").textContent = predictions[0].label;
    document.body.dataset.done = "1";
  } catch (err) {
    fail(err, t0);
  }
});

open();
