/**
 * `@privbert/edge/forwarder`: keep the API key off the page. A request handler for the web
 * app's own backend (the Fetch API's `Request → Response`: Next.js route handlers, Hono, Deno,
 * Bun, Cloudflare Workers; `nodeHandler` in `@privbert/edge/node` adapts it to Node's `http`
 * and Express). The page opens its session with `server` set to this handler's URL and no
 * key; the handler
 *
 * 1. checks the app's own session (``authenticate``): none is a 401 from the forwarder, and
 *    nothing reaches the service;
 * 2. lets through only what a session needs: `GET /v1/models`, `GET /v1/bundles/{id}` and
 *    `POST /v1/models/{id}/predict` whose body is `{"payloads": [...]}` of well-formed
 *    payloads (the fields of shared/payload.py and nothing else: every string a literal, a
 *    hex digest or base64). Anything else is refused (404, 405, 413, 422) and never forwarded;
 * 3. adds `Authorization: Bearer <apiKey>` (and, with ``deviceIds``, the user as `X-Device-Id`,
 *    so the service keeps a privacy budget per user) and forwards the rebuilt payload body.
 *
 * Its log (``log``) has one object per request: method, route, status, time. Never a body.
 */

import { MECHANISMS } from "./generated/spec.js";
import { paramSchemas, plainSchema, type ParamSchema } from "./mechanisms/specs.js";

const HEX64 = /^[0-9a-f]{64}$/;
const B64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;
const MODEL_ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
const PROBLEM = "urn:privbert:forwarder:";
/** Response headers passed back to the page (the rest are the service's business). */
const PASS_BACK = ["content-type", "content-encoding", "content-length", "etag", "cache-control", "vary",
  "retry-after", "x-privacy-budget-remaining", "x-request-id", "x-bundle-bytes"];

/** Bits per value of each array dtype a payload may carry (shared/arrays.py). */
const DTYPE_BITS: Readonly<Record<string, number>> = { int32: 32, float32: 32, float16: 16, bits: 1 };

/** What a payload of one mechanism may hold, from the spec's published payload and params. */
interface Shape {
  field: string;
  dtypes: readonly string[];
  ndim: number;
  params: Readonly<Record<string, ParamSchema>>;
  required: readonly string[];
  /** a token payload: a sentence pair's `segments` travel with it */
  tokens: boolean;
}

/** Every mechanism the spec publishes whose payloads are privatized (not the plain token ids of
 * the Null-privacy baseline, which a page never sends). */
const SHAPES: ReadonlyMap<string, Shape> = new Map(MECHANISMS.filter((m) => m.private).map((m) => [m.name, {
  field: m.payload.field, dtypes: m.payload.dtypes, ndim: m.payload.ndim,
  params: paramSchemas(m.name), required: m.required_params,
  tokens: m.payload.reads_tokens,
}]));

/** Whether ``v`` is a value of the parameter whose JSON Schema is ``schema`` (its type, its choices). */
function paramValue(given: ParamSchema, v: unknown): boolean {
  const schema = plainSchema(given);
  if (schema.type === "string") return typeof v === "string" && (schema.enum === undefined || schema.enum.includes(v));
  if (typeof v !== "number" || !Number.isFinite(v)) return false;
  return schema.type === "number" || Number.isInteger(v);
}

export interface ForwarderOptions {
  /** the privbert service's URL */
  service: string;
  /** the application key the forwarder adds (a backend secret: never sent to the page) */
  apiKey: string;
  /** the app's own session check: a user id, or null for no session (401) */
  authenticate: (request: Request) => string | null | Promise<string | null>;
  /** the path the handler is mounted at (default "/privbert"); the page's `server` is
   * this origin plus it */
  prefix?: string;
  /** the models a page may use (default: every model the service serves) */
  models?: string[] | null;
  /** send the user id as X-Device-Id: the service then keeps a budget per user */
  deviceIds?: boolean;
  /** the largest predict body accepted (default 4 MiB) */
  maxBodyBytes?: number;
  /** seconds to wait for the service (default 30) */
  timeout?: number;
  fetch?: typeof fetch;
  /** bundles whose gzip copy is kept in memory (default 2; a bundle is named by its content,
   * so a copy never goes stale) */
  keepCompressed?: number;
  /** one object per request (method, route, status, ms); never a body or a key */
  log?: (line: Record<string, unknown>) => void;
}

export type Forwarder = (request: Request) => Promise<Response>;

/** A refusal: RFC 9457 problem+json, typed `urn:privbert:forwarder:<kind>`. */
export class Refused extends Error {
  constructor(readonly status: number, readonly kind: string, readonly title: string, readonly detail: string) {
    super(detail);
  }

  response(): Response {
    return new Response(JSON.stringify({ type: PROBLEM + this.kind, title: this.title, status: this.status, detail: this.detail }),
      { status: this.status, headers: { "Content-Type": "application/problem+json", "Cache-Control": "no-store" } });
  }
}

/** The handler (see the module's comment). */
export function createForwarder(o: ForwarderOptions): Forwarder {
  if (!/^https?:\/\//.test(o.service ?? "")) throw new RangeError(`service must be an http(s) URL, got ${JSON.stringify(o.service)}`);
  if (!o.apiKey) throw new RangeError("apiKey is required: the key the forwarder adds (keep it on the backend)");
  if (typeof o.authenticate !== "function") throw new RangeError("authenticate(request) is required: the app's own session check");
  const service = o.service.replace(/\/+$/, "");
  const prefix = "/" + (o.prefix ?? "/privbert").replace(/^\/+|\/+$/g, "");
  const maxBody = o.maxBodyBytes ?? 4 << 20;
  const fetchFn = o.fetch ?? globalThis.fetch.bind(globalThis);
  const timeout = (o.timeout ?? 30) * 1000;
  const models = o.models ? new Set(o.models) : null;
  const gzipped = new GzipCopies(o.keepCompressed ?? 2);

  return async (request: Request): Promise<Response> => {
    const t0 = Date.now();
    let route = "?";
    let status = 500;
    try {
      const url = new URL(request.url);
      const path = prefix === "/" ? url.pathname : url.pathname.startsWith(prefix + "/") ? url.pathname.slice(prefix.length) : null;
      const m = path === null ? null : matchRoute(path);
      route = m === null ? "?" : m.route;
      if (m === null) throw new Refused(404, "not-found", "Not forwarded", "this backend forwards GET /v1/models, GET /v1/bundles/{id} and POST /v1/models/{id}/predict only");
      if (request.method !== m.method && !(m.method === "GET" && request.method === "HEAD")) {
        throw new Refused(405, "method-not-allowed", "Method not allowed", `${route} takes ${m.method} only`);
      }
      const user = await o.authenticate(request);
      if (user === null || user === undefined || user === "") {
        throw new Refused(401, "no-session", "No session", "sign in first: this backend forwards payloads for signed-in users only");
      }
      if (m.model !== null && models !== null && !models.has(m.model)) {
        throw new Refused(404, "not-found", "Not forwarded", `model ${m.model} is not one this backend forwards to`);
      }
      const headers: Record<string, string> = { Authorization: `Bearer ${o.apiKey}` };
      if (o.deviceIds) headers["X-Device-Id"] = deviceId(String(user));
      let body: string | undefined;
      if (m.method === "POST") {
        body = payloadBody(await readBody(request, maxBody));
        headers["Content-Type"] = "application/json";
      } else {
        // fetch decodes whatever it is sent: ask for identity, and let the app's own HTTP
        // layer (or CDN) compress what goes back to the page
        headers["Accept-Encoding"] = "identity";
        const tag = request.headers.get("if-none-match");
        if (tag) headers["If-None-Match"] = tag;
      }
      let answer: Response;
      try {
        answer = await fetchFn(service + path, { method: request.method, headers, body, signal: AbortSignal.timeout(timeout) });
      } catch (exc) {
        throw new Refused(502, "service-unreachable", "Service unreachable", `the privbert service did not answer (${(exc as Error).name})`);
      }
      status = answer.status;
      const back = new Headers();
      for (const h of PASS_BACK) {
        const v = answer.headers.get(h);
        if (v !== null) back.set(h, v);
      }
      if (back.has("content-encoding")) {  // fetch decoded it: it goes back as it is now
        back.delete("content-encoding");
        back.delete("content-length");
      }
      if (request.method === "HEAD" || answer.body === null) return new Response(null, { status: answer.status, headers: back });
      if (answer.status === 200 && m.method === "GET" && accepts(request.headers.get("accept-encoding"), "gzip")) {
        // compressed for the page, as the service itself sends it (a bundle: gzip made once, kept)
        back.set("content-encoding", "gzip");
        back.delete("content-length");
        back.set("vary", "Accept-Encoding");
        if (m.bundleId !== null) {
          const packed = await gzipped.get(m.bundleId, answer);
          back.set("content-length", String(packed.byteLength));
          return new Response(packed, { status: 200, headers: back });
        }
        return new Response(answer.body.pipeThrough(new CompressionStream("gzip")), { status: 200, headers: back });
      }
      return new Response(answer.body, { status: answer.status, headers: back });
    } catch (exc) {
      const r = exc instanceof Refused ? exc
        : new Refused(500, "internal", "Forwarder error", "the forwarder failed; nothing was forwarded");
      status = r.status;
      return r.response();
    } finally {
      o.log?.({ method: request.method, route, status, ms: Date.now() - t0 });
    }
  };
}

interface RouteMatch {
  route: string;
  method: "GET" | "POST";
  model: string | null;
  /** the bundle of GET /v1/bundles/{id} */
  bundleId: string | null;
}

function matchRoute(path: string): RouteMatch | null {
  if (path === "/v1/models") return { route: "/v1/models", method: "GET", model: null, bundleId: null };
  let m = /^\/v1\/bundles\/([^/]+)$/.exec(path);
  if (m) return HEX64.test(m[1]!) ? { route: "/v1/bundles/{id}", method: "GET", model: null, bundleId: m[1]! } : null;
  m = /^\/v1\/models\/([^/]+)\/predict$/.exec(path);
  if (m) {
    const id = decodeURIComponent(m[1]!);
    return MODEL_ID.test(id) ? { route: "/v1/models/{id}/predict", method: "POST", model: id, bundleId: null } : null;
  }
  return null;
}

/** Whether an Accept-Encoding value admits ``coding`` (q > 0). */
function accepts(header: string | null, coding: string): boolean {
  for (const part of (header ?? "").split(",")) {
    const [name, ...params] = part.trim().split(";");
    if (name!.trim().toLowerCase() !== coding && name!.trim() !== "*") continue;
    const q = params.map((x) => x.trim()).find((x) => x.startsWith("q="));
    return q === undefined || Number(q.slice(2)) > 0;
  }
  return false;
}

/** gzip copies of the last few bundles asked for (CompressionStream: every Fetch-API runtime
 * has it), made once per bundle id while concurrent requests wait for the same copy. */
class GzipCopies {
  private readonly copies = new Map<string, Promise<ArrayBuffer>>();

  constructor(private readonly keep: number) {}

  /** The gzip copy of the bundle ``id``, from the service's ``answer`` (not read when a copy is kept). */
  get(id: string, answer: Response): Promise<ArrayBuffer> {
    let copy = this.copies.get(id);
    if (copy === undefined) {
      copy = answer.arrayBuffer().then((raw) =>
        new Response(new Blob([raw]).stream().pipeThrough(new CompressionStream("gzip"))).arrayBuffer());
      copy.catch(() => this.copies.delete(id));
      if (this.keep > 0) this.copies.set(id, copy);
    } else {
      this.copies.delete(id);  // most recent last
      this.copies.set(id, copy);
      void answer.body?.cancel().catch(() => undefined);
    }
    while (this.copies.size > this.keep) this.copies.delete(this.copies.keys().next().value!);
    return copy;
  }
}

/** The user as a device id the service accepts (its pattern: [A-Za-z0-9_.:-], ≤ 64). */
function deviceId(user: string): string {
  const clean = user.replace(/[^A-Za-z0-9_.:-]/g, "_").slice(0, 64);
  return clean || "user";
}

async function readBody(request: Request, limit: number): Promise<string> {
  const declared = Number(request.headers.get("content-length") ?? NaN);
  if (declared > limit) throw new Refused(413, "too-large", "Body too large", `bodies over ${limit} bytes are not forwarded`);
  const type = (request.headers.get("content-type") ?? "").split(";")[0]!.trim().toLowerCase();
  if (type !== "application/json") {
    throw new Refused(415, "not-json", "Not JSON", "the body must be application/json: {\"payloads\": [...]}");
  }
  const parts: Uint8Array[] = [];
  let n = 0;
  if (request.body !== null) {
    const reader = request.body.getReader();
    for (let r = await reader.read(); !r.done; r = await reader.read()) {
      n += r.value.length;
      if (n > limit) {  // stop reading: nothing of it is kept or forwarded
        await reader.cancel().catch(() => undefined);
        throw new Refused(413, "too-large", "Body too large", `bodies over ${limit} bytes are not forwarded`);
      }
      parts.push(r.value);
    }
  }
  const bytes = new Uint8Array(n);
  let at = 0;
  for (const p of parts) {
    bytes.set(p, at);
    at += p.length;
  }
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw new Refused(422, "not-a-payload", "Not a payload", "the body is not UTF-8 JSON");
  }
}

/** The body rebuilt from its checked parts, or Refused 422: only payloads travel. */
export function payloadBody(text: string): string {
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    throw notPayload("the body is not JSON");
  }
  if (!isObject(body) || !sameKeys(body, ["payloads"]) || !Array.isArray(body.payloads) || body.payloads.length === 0) {
    throw notPayload('the body must be {"payloads": [payload, ...]} and nothing else');
  }
  return JSON.stringify({ payloads: body.payloads.map((p, i) => checkPayload(p, i)) });
}

function checkPayload(p: unknown, i: number): Record<string, unknown> {
  const where = `payloads[${i}]`;
  if (!isObject(p)) throw notPayload(`${where} is not an object`);
  const shape = typeof p.mechanism === "string" ? SHAPES.get(p.mechanism) : undefined;
  if (!shape) throw notPayload(`${where}: mechanism must be one of ${[...SHAPES.keys()].join(", ")}`);
  const allowed = ["version", "mechanism", "params", "bundle_id", shape.field, ...(shape.tokens ? ["segments"] : [])];
  const extra = Object.keys(p).filter((k) => !allowed.includes(k));
  if (extra.length) throw notPayload(`${where} has fields a payload does not have (${extra.length})`);
  if (p.version !== undefined && p.version !== 1) throw notPayload(`${where}: version must be 1`);
  if (typeof p.bundle_id !== "string" || !HEX64.test(p.bundle_id)) throw notPayload(`${where}: bundle_id must be 64 hex digits`);
  const params = p.params;
  const names = Object.keys(shape.params);
  if (!isObject(params) || Object.entries(params).some(([k, v]) => !(k in shape.params) || !paramValue(shape.params[k]!, v))
      || shape.required.some((k) => !(k in params))) {
    throw notPayload(`${where}: params must be ${names.join(", ")} (each of its type)`);
  }
  const arr = p[shape.field];
  if (!isObject(arr) || !sameKeys(arr, ["dtype", "shape", "data"]) || !shape.dtypes.includes(arr.dtype as string)
      || !Array.isArray(arr.shape) || arr.shape.length !== shape.ndim
      || !arr.shape.every((d) => Number.isInteger(d) && (d as number) >= 0)
      || typeof arr.data !== "string" || !B64.test(arr.data)) {
    throw notPayload(`${where}: ${shape.field} must be {dtype, shape, data} (${shape.dtypes.join("|")}, rank ${shape.ndim}, base64)`);
  }
  const count = (arr.shape as number[]).reduce((a, b) => a * b, 1);
  const bytes = Math.ceil((count * DTYPE_BITS[arr.dtype as string]!) / 8);
  const pad = arr.data.endsWith("==") ? 2 : arr.data.endsWith("=") ? 1 : 0;
  if ((arr.data.length / 4) * 3 - pad !== bytes) throw notPayload(`${where}: ${shape.field}'s data does not match its shape`);
  const out: Record<string, unknown> = { version: 1, mechanism: p.mechanism, params: { ...params }, bundle_id: p.bundle_id,
    [shape.field]: { dtype: arr.dtype, shape: [...(arr.shape as number[])], data: arr.data } };
  if (p.segments !== undefined && p.segments !== null) {
    const s = p.segments;
    if (!Array.isArray(s) || s.length < 1 || s.length > 2 || !s.every((x) => Number.isInteger(x) && (x as number) > 0)) {
      throw notPayload(`${where}: segments must be one or two positive integers`);
    }
    out.segments = [...(s as number[])];
  }
  return out;
}

function notPayload(detail: string): Refused {
  return new Refused(422, "not-a-payload", "Not a payload", `${detail}: nothing was forwarded`);
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function sameKeys(o: Record<string, unknown>, keys: string[]): boolean {
  const k = Object.keys(o);
  return k.length === keys.length && keys.every((x) => x in o);
}
