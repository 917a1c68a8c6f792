import { chromium } from "playwright-core";
import { writeFileSync } from "node:fs";
const url = process.argv[2];
const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"] });
const ctx = await browser.newContext();
const page = await ctx.newPage();
const cdp = await ctx.newCDPSession(page);
await cdp.send("Profiler.enable");
await cdp.send("Profiler.setSamplingInterval", { interval: 500 });
await cdp.send("Profiler.start");
const t0 = Date.now();
await page.goto(url);
await page.waitForFunction(() => !document.querySelector("#preview").disabled || !document.querySelector("#error").hidden, null, { timeout: 60000 });
const ready = Date.now() - t0;
const { profile } = await cdp.send("Profiler.stop");
const phases = await page.evaluate(() => document.body.dataset.phases);
const measures = await page.evaluate(() => performance.getEntriesByType("measure").map((m) => [m.name, Math.round(m.startTime), Math.round(m.duration)]));
const res = await page.evaluate(() => performance.getEntriesByType("resource").map((r) => [r.name.split("/").pop().slice(0, 30), Math.round(r.startTime), Math.round(r.responseEnd)]));
console.log("ready", ready, phases); console.log(JSON.stringify(measures)); console.log(JSON.stringify(res));
const self = new Map(); const byId = new Map(profile.nodes.map((n) => [n.id, n]));
for (let i = 0; i < profile.samples.length; i++) { const n = byId.get(profile.samples[i]); const k = n.callFrame.functionName + " " + n.callFrame.url.split("/").pop() + ":" + n.callFrame.lineNumber; self.set(k, (self.get(k) || 0) + (profile.timeDeltas[i] || 0)); }
console.log([...self].sort((a, b) => b[1] - a[1]).slice(0, 30).map(([k, v]) => `${(v / 1000).toFixed(0)} ${k}`).join("\n"));
await browser.close();
