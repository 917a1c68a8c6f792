// Drives the bundler pages in Debian's headless Chromium (playwright-core, never a downloaded
// browser) and prints one JSON report: per scenario what the page showed (window.privbert),
// every request it and its Worker sent (URL, method, body as base64), what each thread
// fetched by itself (Resource Timing), its console.
//
//   node drive.mjs '{"sentence": "...", "scenarios": [{"name": "vite", "url": "...",
//                    "text": "..."}, ...]}'
//
// A scenario opens its URL in a fresh context (empty caches), waits until the session is
// open or failed, then (with "text") types it and clicks Predict. "revisit": true opens the
// same URL again in the same context (its caches kept) and reports the bytes of both visits.

import { chromium } from "playwright-core";

const CHROMIUM = process.env.PRIVBERT_CHROMIUM || "/usr/bin/chromium";
const FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync"];
const TIMEOUT = 60_000;
const args = JSON.parse(process.argv[2]);
const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: FLAGS, timeout: TIMEOUT });
const report = {};

async function visit(ctx, sc, requests, console_) {
  const page = await ctx.newPage();
  page.setDefaultTimeout(TIMEOUT);
  page.on("console", (m) => console_.push(`${m.type()}: ${m.text()}`));
  page.on("pageerror", (e) => console_.push(`pageerror: ${e.message}`));
  const workers = [];
  page.on("worker", (w) => {
    workers.push(w);
    console_.push(`worker: ${w.url()}`);
  });
  const t0 = Date.now();
  await page.goto(sc.url);
  await page.waitForFunction(() => document.body.dataset.ready === "1" || document.body.dataset.done === "1");
  const openedMs = Date.now() - t0;
  if (sc.text && (await page.evaluate(() => document.body.dataset.ready === "1"))) {
    await page.fill("#text", sc.text);
    await page.click("#go");
    await page.waitForFunction(() => document.body.dataset.done === "1");
  }
  const state = await page.evaluate(() => window.privbert);
  // what each thread fetched itself (Resource Timing): the page's, and its Workers'
  const names = () => performance.getEntriesByType("resource").map((e) => e.name);
  state.mainFetched = await page.evaluate(names);
  // and what it cost (same-origin entries: bytes over the wire, 0 from the HTTP cache)
  state.mainResources = await page.evaluate(() => performance.getEntriesByType("resource").map((e) => ({
    name: e.name, transferSize: e.transferSize, encodedBodySize: e.encodedBodySize, decodedBodySize: e.decodedBodySize })));
  state.workerFetched = (await Promise.all(workers.map((w) => w.evaluate(names).catch(() => [])))).flat();
  state.shownError = (await page.locator("#error").isVisible()) ? await page.locator("#error").textContent() : null;
  state.openedMs = openedMs;
  await page.close();
  return state;
}

for (const sc of args.scenarios) {
  const ctx = await browser.newContext();
  const requests = [];
  const console_ = [];
  ctx.on("request", (r) => {
    const body = r.postDataBuffer();
    requests.push({ url: r.url(), method: r.method(), body: body ? body.toString("base64") : null });
  });
  ctx.on("response", async (r) => {
    const q = requests.findLast((x) => x.url === r.url() && x.status === undefined);
    if (!q) return;
    const h = await r.allHeaders().catch(() => ({}));
    Object.assign(q, { status: r.status(), encoding: h["content-encoding"] ?? null, cacheControl: h["cache-control"] ?? null,
      etag: h.etag ?? null });
  });
  try {
    const first = await visit(ctx, sc, requests, console_);
    const out = { first, requests: requests.splice(0), console: console_.splice(0) };
    if (sc.revisit) {
      out.second = await visit(ctx, sc, requests, console_);
      out.secondRequests = requests.splice(0);
    }
    report[sc.name] = out;
  } catch (err) {
    report[sc.name] = { failed: String(err.stack || err), requests, console: console_ };
  } finally {
    await ctx.close();
  }
}
await browser.close();
process.stdout.write(JSON.stringify(report));
