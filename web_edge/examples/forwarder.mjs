#!/usr/bin/env node
// A web app's backend that keeps the privbert API key off the page: it serves the app's page,
// signs users in (a toy session: a shared login token, a random cookie), and forwards the
// page's payloads to privbert with the key added (@privbert/edge/forwarder). Start from it:
// replace `login` and `authenticate` with your app's own accounts and sessions.
//
//   PRIVBERT_SERVICE=https://privbert.internal PRIVBERT_API_KEY=... APP_LOGIN_TOKEN=... \
//     node examples/forwarder.mjs [--port 8080] [--static DIR]
//
// The page:  await fetch("/login", { method: "POST", body: JSON.stringify({ token }) });
//            const s = await EdgeSession.open({ server: location.origin + "/privbert" });
// Logs: one JSON object per request on stdout (method, route, status, ms), never a body.

import { randomBytes, timingSafeEqual } from "node:crypto";
import { createReadStream, statSync } from "node:fs";
import { createServer } from "node:http";
import { extname, join, normalize, resolve, sep } from "node:path";
import { parseArgs } from "node:util";

import { createForwarder } from "@privbert/edge/forwarder";
import { nodeHandler } from "@privbert/edge/node";

const { values: args } = parseArgs({ options: { port: { type: "string", default: process.env.PORT ?? "8080" },
  host: { type: "string", default: "127.0.0.1" }, static: { type: "string" } } });
const need = (name) => {
  const v = process.env[name];
  if (!v) {
    console.error(`forwarder: error: set ${name}`);
    process.exit(2);
  }
  return v;
};
const SERVICE = need("PRIVBERT_SERVICE");
const API_KEY = need("PRIVBERT_API_KEY");
const LOGIN_TOKEN = Buffer.from(need("APP_LOGIN_TOKEN"));
const sessions = new Map(); // session id -> user (a real app: its session store)
const log = (line) => process.stdout.write(JSON.stringify({ t: new Date().toISOString(), ...line }) + "\n");

function cookie(req, name) {
  for (const part of (req.headers.cookie ?? "").split(";")) {
    const [k, ...v] = part.trim().split("=");
    if (k === name) return v.join("=");
  }
  return null;
}

const forward = nodeHandler(createForwarder({
  service: SERVICE, apiKey: API_KEY, prefix: "/privbert", deviceIds: true, log,
  authenticate: (request) => {
    const sid = cookie({ headers: { cookie: request.headers.get("cookie") ?? "" } }, "sid");
    return (sid && sessions.get(sid)) ?? null;
  },
}));

async function login(req, res) {
  let body = "";
  for await (const chunk of req) {
    body += chunk;
    if (body.length > 4096) break;
  }
  let token = "";
  try {
    token = String(JSON.parse(body).token ?? "");
  } catch { /* not JSON */ }
  const given = Buffer.from(token);
  const ok = given.length === LOGIN_TOKEN.length && timingSafeEqual(given, LOGIN_TOKEN);
  log({ method: "POST", route: "/login", status: ok ? 204 : 401 });
  if (!ok) {
    res.writeHead(401, { "Content-Type": "application/json" }).end('{"error":"wrong login token"}');
    return;
  }
  const sid = randomBytes(24).toString("base64url");
  sessions.set(sid, `user-${randomBytes(6).toString("hex")}`);
  res.writeHead(204, { "Set-Cookie": `sid=${sid}; HttpOnly; SameSite=Strict; Path=/` }).end();
}

const TYPES = { ".html": "text/html; charset=utf-8", ".js": "text/javascript", ".mjs": "text/javascript",
  ".css": "text/css", ".wasm": "application/wasm", ".json": "application/json", ".map": "application/json" };

function serveStatic(req, res) {
  if (!args.static) return res.writeHead(404).end();
  const root = resolve(args.static);
  const rel = normalize(decodeURIComponent(new URL(req.url, "http://x").pathname)).replace(/^([/\\])+/, "");
  let file = join(root, rel);
  if (file !== root && !file.startsWith(root + sep)) return res.writeHead(404).end();
  try {
    if (statSync(file).isDirectory()) file = join(file, "index.html");
    const st = statSync(file);
    res.writeHead(200, { "Content-Type": TYPES[extname(file)] ?? "application/octet-stream", "Content-Length": st.size,
      "Cache-Control": "no-cache" });
    createReadStream(file).pipe(res);
  } catch {
    res.writeHead(404).end();
  }
}

createServer((req, res) => {
  const path = new URL(req.url, "http://x").pathname;
  if (path === "/privbert" || path.startsWith("/privbert/")) return void forward(req, res);
  if (path === "/login" && req.method === "POST") return void login(req, res);
  return serveStatic(req, res);
}).listen(Number(args.port), args.host, function () {
  const { port } = this.address();
  console.error(`forwarder: http://${args.host}:${port}/ -> ${SERVICE} (the key stays here)`);
});
