#!/usr/bin/env node
// A web app's backend that keeps the privbert API key off the page: it serves the app's page
// (compressed and cached: staticFiles), signs users in (a toy session: a shared login token, a
// random cookie), and forwards the page's payloads to privbert with the key added
// (@privbert/edge/forwarder; the bundle goes back gzip). Start from it: replace `login` and
// `authenticate` with your app's own accounts and sessions. It ships in the package:
// node_modules/@privbert/edge/examples/forwarder.mjs.
//
//   PRIVBERT_SERVICE=https://privbert.internal PRIVBERT_API_KEY=... APP_LOGIN_TOKEN=... \
//     node examples/forwarder.mjs [--port 8080] [--static DIR]
//
// The page:  await fetch("/login", { method: "POST", body: JSON.stringify({ token }) });
//            const s = await EdgeSession.open({ server: location.origin + "/privbert" });
// Logs: one JSON object per request on stdout (method, route, status, ms), never a body.

import { randomBytes, timingSafeEqual } from "node:crypto";
import { createServer } from "node:http";
import { parseArgs } from "node:util";

import { createForwarder } from "@privbert/edge/forwarder";
import { nodeHandler, staticFiles } from "@privbert/edge/node";

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

// the page's files: compressed (the build's .br/.gz copies, else made once here), content-named
// files (a hash in the name) immutable, the rest revalidated (ETag, Last-Modified: a 304)
const serveStatic = args.static ? staticFiles(args.static) : () => false;

createServer((req, res) => {
  const path = new URL(req.url, "http://x").pathname;
  if (path === "/privbert" || path.startsWith("/privbert/")) return void forward(req, res);
  if (path === "/login" && req.method === "POST") return void login(req, res);
  if (!serveStatic(req, res)) res.writeHead(404).end();
}).listen(Number(args.port), args.host, function () {
  const { port } = this.address();
  console.error(`forwarder: http://${args.host}:${port}/ -> ${SERVICE} (the key stays here)`);
});
