// Drives the privacy explorer in Debian's headless Chromium (playwright-core, never a
// downloaded browser) and prints one JSON report on stdout: what each scenario showed and
// every request the page sent (URL, method, body as base64). The caller (pytest, or
// bench/web_page.py) asserts on it; this script only drives and records.
//
//   node test/drive.mjs '{"url": "http://127.0.0.1:PORT/demo/", "sentence": "...",
//                         "scenarios": ["predict", "empty", ...]}'

import { readFileSync } from "node:fs";
import { gzipSync } from "node:zlib";

import { chromium } from "playwright-core";

const CHROMIUM = process.env.PRIVBERT_CHROMIUM || "/usr/bin/chromium";
const FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync"];
const args = JSON.parse(process.argv[2]);
const TIMEOUT = args.timeout ?? 60_000;
const report = { scenarios: {} };

// one browser (its own fresh --user-data-dir, made and removed by playwright), a new
// context per scenario: each starts with an empty Cache API and IndexedDB
const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: FLAGS,
  timeout: TIMEOUT });

async function freshPage(init) {
  const ctx = await browser.newContext();
  const page = await ctx.newPage();
  page.setDefaultTimeout(TIMEOUT);
  const requests = [];
  const console_ = [];
  page.on("console", (m) => console_.push(`${m.type()}: ${m.text()}`));
  page.on("pageerror", (e) => console_.push(`pageerror: ${e.message}`));
  page.on("request", (r) => {
    const body = r.postDataBuffer();
    requests.push({ url: r.url(), method: r.method(), resource: r.resourceType(),
      body: body ? body.toString("base64") : null });
  });
  if (init) await init(ctx, page);
  return { ctx, page, requests, console: console_, close: () => ctx.close() };
}

async function text(page, id) {
  return (await page.locator(`#${id}`).textContent())?.trim() ?? "";
}

async function errorShown(page) {
  return (await page.locator("#error").isVisible()) ? await text(page, "error") : null;
}

// scenarios that leave nothing behind run one after the other on one page (in this order in
// args.scenarios): each is its own result, with the requests sent while it ran
const SHARED = ["empty", "too_long", "weak_eta", "server_down"];
const opened = new WeakSet(); // pages already loaded (a shared page is not loaded again)
const modelEta = new WeakMap(); // the η field as the page set it (the model's)

/** Open the page and wait until it can privatize (or shows an error). */
async function ready(page) {
  const t0 = Date.now();
  if (opened.has(page)) {
    await page.fill("#eta", modelEta.get(page));
    return 0;
  }
  opened.add(page);
  await page.goto(args.url);
  await page.waitForFunction(() => !document.querySelector("#go").disabled
    || !document.querySelector("#error").hidden);
  modelEta.set(page, await page.inputValue("#eta"));
  return Date.now() - t0;
}

/** Click a button and wait for the page to finish (a prediction, a token list or an error). */
async function click(page, id) {
  await page.evaluate(() => {
    document.querySelector("#prediction").textContent = "–";
    document.querySelector("#tokens").replaceChildren();
    document.body.dataset.done = "";
  });
  if (await page.locator(`#${id}`).isDisabled()) return;  // the page refused before: its message stands
  // the page's event for the answer (no polling delay), listened to before the click
  await page.evaluate(() => {
    window.privbertAnswered = new Promise((resolve) => {
      document.addEventListener("privbert-answered", () => resolve(), { once: true });
    });
  });
  await page.click(`#${id}`);
  await page.evaluate(() => window.privbertAnswered);
  await page.waitForFunction(() => document.body.dataset.done === "1");
}

/** Act as a server that names another bundle for its models: /v1/models says ``id`` and
 * /v1/bundles/``id`` serves the tarball at ``tar`` (a valid bundle_id: the server signs what it
 * likes). */
async function serveBundle(page, { id, tar }) {
  const body = readFileSync(tar);
  await page.route("**/v1/models", async (route) => {
    const r = await route.fetch();
    const models = await r.json();
    for (const m of models.models ?? models) m.bundle_id = id;
    await route.fulfill({ response: r, json: models });
  });
  await page.route(`**/v1/bundles/${id}`, (route) => route.fulfill({ status: 200, contentType: "application/x-tar", body }));
}

async function state(page) {
  return {
    error: await errorShown(page), prediction: await text(page, "prediction"),
    tokens: await page.locator("#tokens li").allTextContents(),
    payload: await text(page, "payload"), guarantee: await text(page, "guarantee"),
    sentNote: await text(page, "sent-note"), status: await text(page, "status"),
    ledger: { spent: await text(page, "ledger-spent"), cap: await text(page, "ledger-cap"),
      remaining: await text(page, "ledger-remaining"), sends: await text(page, "ledger-sends") },
    privatizeMs: Number(await page.evaluate(() => document.body.dataset.privatizeMs)),
    keyFieldShown: await page.locator("#key").isVisible(),
    progress: JSON.parse(await page.evaluate(() => document.body.dataset.progress || "[]")),
    legend: await text(page, "legend"), bundleNote: await text(page, "bundle-note"),
    tokenKinds: JSON.parse(await page.evaluate(() => document.body.dataset.tokenKinds || "null")),
    tokenClasses: await page.locator("#tokens li").evaluateAll((els) => els.map((e) => e.className)),
    tokenTitles: await page.locator("#tokens li").evaluateAll((els) => els.map((e) => e.title)),
    tokenCounts: await text(page, "token-counts"), etaNote: await text(page, "eta-note"),
  };
}

/** Wait until the page has stored a bundle of at least ``bytes`` in the Cache API (it does
 * so in the background once it is ready). Polled here: waitForFunction would take the
 * predicate's promise itself for a true value. */
async function bundleCached(page, bytes) {
  const deadline = Date.now() + TIMEOUT;
  for (;;) {
    const size = await page.evaluate(async () => {
      const c = await caches.open("privbert-bundles");
      const [k] = await c.keys();
      return k === undefined ? 0 : (await (await c.match(k)).arrayBuffer()).byteLength;
    });
    if (size >= bytes) return;
    if (Date.now() > deadline) throw new Error(`the page did not store the bundle in the Cache API in ${TIMEOUT} ms`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** What this visit transferred (Resource Timing: 0 for a file from the HTTP cache). */
async function transferred(page) {
  return page.evaluate(() => [...performance.getEntriesByType("navigation"), ...performance.getEntriesByType("resource")]
    .map((e) => ({ name: e.name, transferSize: e.transferSize, decodedBodySize: e.decodedBodySize })));
}

const SCENARIOS = {
  // type a sentence, get a prediction; then the same sentence again (a memoized repeat)
  async predict(p) {
    await ready(p.page);
    await p.page.fill("#text", args.sentence);
    await click(p.page, "go");
    // what happened to each token is judged once the tokens are painted
    await p.page.waitForFunction(() => document.body.dataset.tokenKinds);
    const first = await state(p.page);
    await p.page.waitForFunction(() => /random regular tokens|not measured/.test(document.querySelector("#inversion").textContent));
    first.inversion = await text(p.page, "inversion");
    first.guaranteeNotes = await p.page.locator("#guarantee-notes li").allTextContents();
    await click(p.page, "go");
    return { first, repeat: await state(p.page) };
  },
  // the page opened twice in one profile: the second visit downloads nothing it had
  async revisit(p) {
    await ready(p.page);
    const firstState = await state(p.page);
    const first = await transferred(p.page);
    // the page keeps the bundle in the Cache API once it is ready (in the background): wait
    // until the whole of it is there
    await bundleCached(p.page, first.find((e) => e.name.includes("/v1/bundles/"))?.decodedBodySize ?? 1);
    await p.page.goto("about:blank");
    opened.delete(p.page);
    await ready(p.page);
    return { first, firstState, second: await transferred(p.page), state: await state(p.page) };
  },
  async empty(p) {
    await ready(p.page);
    await p.page.fill("#text", "   ");
    await click(p.page, "go");
    return state(p.page);
  },
  async too_long(p) {
    await ready(p.page);
    await p.page.fill("#text", Array(400).fill(args.sentence).join(" "));
    await click(p.page, "go");
    return state(p.page);
  },
  async weak_eta(p) {
    await ready(p.page);
    await p.page.fill("#text", args.sentence);
    await p.page.fill("#eta", String(args.weakEta));
    await click(p.page, "go");
    return state(p.page);
  },
  // another η than the model's: privatized and shown, never sent, its inversion rate measured
  async other_eta(p) {
    await ready(p.page);
    await p.page.fill("#text", args.sentence);
    await p.page.fill("#eta", String(args.otherEta));
    await click(p.page, "go");
    await p.page.waitForFunction(() => /random regular tokens|not measured/.test(document.querySelector("#inversion").textContent));
    return { ...(await state(p.page)), inversion: await text(p.page, "inversion") };
  },
  async over_cap(p) {
    await ready(p.page);
    await p.page.fill("#cap", "0");
    await p.page.click("#set-cap");
    await p.page.waitForFunction(() => document.querySelector("#ledger-cap").textContent === "0.0");
    await p.page.fill("#text", args.sentence);
    await click(p.page, "go");
    return state(p.page);
  },
  async server_down(p) {
    await ready(p.page);
    await p.page.route("**/v1/**", (route) => route.abort("connectionrefused"));
    await p.page.fill("#text", args.sentence);
    await click(p.page, "go");
    return state(p.page);
  },
  async server_down_at_start(p) {
    await p.page.route("**/v1/**", (route) => route.abort("connectionrefused"));
    await ready(p.page);
    return state(p.page);
  },
  async wrong_hash(p) {
    await p.page.route("**/v1/bundles/**", async (route) => {
      const r = await route.fetch();
      const body = Buffer.from(await r.body());
      // one bit flipped inside embeddings.npy's data (past its header): the tar still reads,
      // the file's SHA-256 no longer matches bundle.json
      let at = -1;
      for (let h = 0; h + 512 <= body.length; h += 512) {
        if (body.subarray(h, h + 15).toString("latin1") === "embeddings.npy\0") { at = h + 512 + 256; break; }
      }
      if (at < 0) throw new Error("no embeddings.npy in the bundle tarball");
      body[at] ^= 0x01;
      await route.fulfill({ response: r, body });
    });
    await ready(p.page);
    return state(p.page);
  },
  async truncated(p) {
    await p.page.route("**/v1/bundles/**", async (route) => {
      const r = await route.fetch();
      const body = Buffer.from(await r.body());
      await route.fulfill({ response: r, body: body.subarray(0, body.length >> 1) });
    });
    await ready(p.page);
    return state(p.page);
  },
  // a hostile server's bundle (issue 34: its table scaled x1000): verified, then refused by
  // the privacy floor before anything is privatized or sent
  async hostile_bundle(p) {
    await serveBundle(p.page, args.hostile);
    await ready(p.page);
    // the floor is measured once the page can privatize: its refusal follows
    await p.page.waitForFunction(() => !document.querySelector("#error").hidden);
    return state(p.page);
  },
  // the bundle this browser pinned for the model, then a server that names another one: the
  // reloaded page refuses it before fetching it
  async swapped_bundle(p) {
    await ready(p.page);
    const before = await state(p.page);
    await serveBundle(p.page, args.other);
    await p.page.reload();
    await p.page.waitForFunction(() => !document.querySelector("#error").hidden
      || (!document.querySelector("#go").disabled && document.body.dataset.bundleMs));
    await p.page.fill("#text", args.sentence);
    await click(p.page, "go");
    return { ...(await state(p.page)), before: before.error };
  },
  async ledger_unwritable(p) {
    await ready(p.page);
    await p.page.fill("#text", args.sentence);
    await click(p.page, "go");
    return state(p.page);
  },
  // bench: the first privatization of a fresh page, bundle download included, then warm ones
  async bench(p) {
    const t0 = Date.now();
    await p.page.goto(args.url);
    await p.page.waitForFunction(() => !document.querySelector("#preview").disabled
      || !document.querySelector("#error").hidden);
    await p.page.fill("#text", args.sentence);
    await click(p.page, "preview");
    const firstMs = Date.now() - t0;
    const first = await state(p.page);
    first.privatizeMs = Number(await p.page.evaluate(() => document.body.dataset.privatizeMs));
    // the page's clock (ms after navigation): the first click, and its answer
    first.clickAt = Number(await p.page.evaluate(() => document.body.dataset.clickAt));
    first.doneAt = Number(await p.page.evaluate(() => document.body.dataset.doneAt));
    // when the navigation started (the page's time origin), after the driver asked for it
    first.navigationAfterMs = (await p.page.evaluate(() => performance.timeOrigin)) - t0;
    const warm = [];
    for (let i = 0; i < (args.repeats ?? 20); i++) {
      await click(p.page, "preview");
      warm.push((await state(p.page)).privatizeMs);
    }
    const measures = await p.page.evaluate(() => performance.getEntriesByType("measure")
      .filter((m) => m.name.startsWith("privbert:") && m.startTime < Number(document.body.dataset.clickAt))
      .map((m) => [m.name, m.startTime, m.duration]));
    return { firstMs, first, warm, measures, bundleMs: Number(await p.page.evaluate(() => document.body.dataset.bundleMs)),
      phases: JSON.parse(await p.page.evaluate(() => document.body.dataset.phases || "{}")) };
  },
};

/** Where a visit's time went, by the page's clock (ms after navigation): its script, the
 * click and the answer, every User Timing measure of the library, every request (Resource
 * Timing: start, end, bytes transferred). */
async function profile(page) {
  return page.evaluate(() => {
    const d = document.body.dataset;
    const nav = performance.getEntriesByType("navigation")[0];
    return {
      navigation: nav ? { responseEnd: nav.responseEnd, domInteractive: nav.domInteractive } : null,
      scriptAt: JSON.parse(d.phases || "{}").scriptMs ?? null, readyAt: Number(d.readyAt) || null,
      clickAt: Number(d.clickAt) || null, doneAt: Number(d.doneAt) || null,
      measures: performance.getEntriesByType("measure").map((m) => [m.name, m.startTime, m.duration]),
      resources: performance.getEntriesByType("resource").map((r) => [r.name, r.startTime, r.responseEnd, r.transferSize]),
    };
  });
}

/**
 * bench: two visits of one profile under Chromium's own network and CPU emulation (CDP
 * Network.emulateNetworkConditions, Emulation.setCPUThrottlingRate); for each, the time from
 * navigation to the first privatized tokens on screen and every request before them, as
 * transferred (Network.loadingFinished's encodedDataLength: headers and body as they came
 * over the wire; 0 for a file from the HTTP cache). The second visit is the same profile
 * (its HTTP cache, Cache API and IndexedDB kept) once the page has stored the bundle.
 */
async function visits(p) {
  const cdp = await p.ctx.newCDPSession(p.page);
  await cdp.send("Network.enable");
  const net = args.network;
  if (net) {
    await cdp.send("Network.emulateNetworkConditions", { offline: false, latency: net.latencyMs,
      downloadThroughput: net.downMbps * 1e6 / 8, uploadThroughput: net.upMbps * 1e6 / 8 });
  }
  if (args.cpuSlowdown) await cdp.send("Emulation.setCPUThrottlingRate", { rate: args.cpuSlowdown });
  let log = new Map();
  cdp.on("Network.requestWillBeSent", (e) => log.set(e.requestId, { url: e.request.url, bytes: 0, fromCache: false }));
  cdp.on("Network.requestServedFromCache", (e) => { const r = log.get(e.requestId); if (r) r.fromCache = true; });
  cdp.on("Network.responseReceived", (e) => {
    const r = log.get(e.requestId);
    if (!r) return;
    const h = Object.fromEntries(Object.entries(e.response.headers).map(([k, v]) => [k.toLowerCase(), v]));
    Object.assign(r, { status: e.response.status, encoding: h["content-encoding"] ?? null,
      fromCache: r.fromCache || Boolean(e.response.fromDiskCache), cacheControl: h["cache-control"] ?? null });
  });
  cdp.on("Network.loadingFinished", (e) => { const r = log.get(e.requestId); if (r) r.bytes = e.encodedDataLength; });
  cdp.on("Network.loadingFailed", (e) => { const r = log.get(e.requestId); if (r) r.failed = e.errorText; });
  const one = async () => {
    log = new Map();
    opened.delete(p.page);
    const t0 = Date.now();
    await p.page.goto(args.url);
    await p.page.waitForFunction(() => !document.querySelector("#preview").disabled
      || !document.querySelector("#error").hidden);
    const readyMs = Date.now() - t0;
    await p.page.fill("#text", args.sentence);
    await click(p.page, "preview");
    const firstMs = Date.now() - t0;
    const st = await state(p.page);
    const requests = [...log.values()];
    return { readyMs, firstMs, error: st.error, privatizeMs: st.privatizeMs, status: st.status, requests,
      profile: await profile(p.page) };
  };
  const first = await one();
  const warm = [];
  for (let i = 0; i < (args.repeats ?? 20); i++) {
    await click(p.page, "preview");
    warm.push((await state(p.page)).privatizeMs);
  }
  await bundleCached(p.page, 1);
  const second = await one();
  return { first, second, warm };
}
SCENARIOS.visits = visits;

// IndexedDB that cannot be opened, as in a browser that refuses storage to the page
const NO_INDEXEDDB = () => {
  Object.defineProperty(window, "indexedDB", {
    get() { throw new DOMException("storage is not allowed here", "SecurityError"); },
  });
};

const scripts = new Map();  // URL -> gzip size of every script the page loaded
let shared = null;
for (const name of args.scenarios) {
  const reuse = SHARED.includes(name) && shared !== null;
  const p = reuse ? shared : await freshPage(async (ctx, page) => {
    if (name === "ledger_unwritable") await page.addInitScript(NO_INDEXEDDB);
    if (name === "bench" || name === "predict") {
      page.on("response", async (r) => {
        const type = r.request().resourceType();
        if (type === "script" || /\.m?js(\?|$)/.test(r.url())) {
          try { scripts.set(r.url(), gzipSync(await r.body(), { level: 9 }).length); } catch { /* redirect */ }
        }
      });
    }
  });
  if (SHARED.includes(name)) shared = p;
  const from = p.requests.length;
  const logFrom = p.console.length;
  try {
    const result = await SCENARIOS[name](p);
    report.scenarios[name] = { result, requests: p.requests.slice(from), console: p.console.slice(logFrom) };
  } catch (err) {
    report.scenarios[name] = { failed: String(err.stack || err), requests: p.requests.slice(from),
      console: p.console.slice(logFrom), page: await state(p.page).catch(() => null) };
  } finally {
    if (p !== shared) await p.close();
  }
}
if (shared) await shared.close();
await browser.close();
report.scripts = Object.fromEntries(scripts);
process.stdout.write(JSON.stringify(report));
