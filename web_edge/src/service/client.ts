/**
 * The privbert API from the device, with `fetch` (browsers and Node ≥ 20): served models, the
 * edge bundle (verified before use), predictions and records. Only payload JSON travels: the
 * client takes payloads, never text. Retries with exponential backoff on 429/503 and connection
 * errors (honouring Retry-After); errors are one line with the server's problem+json title,
 * detail and type (edge_agent/service/client.py's wording), and a hint for whoever reads it:
 * a web developer (`audience: "page"`, the default) or a command line's user (`"cli"`, flags).
 *
 * In a page, a request to another origin that fails without an answer is not retried: it is
 * most often a CORS refusal (the service does not list the page's origin in
 * `PRIVBERT_CORS_ORIGINS`), which retrying cannot fix; one quick probe tells it from a
 * service that is down, and the error says which.
 */

import { EdgeBundle, peekBundleShape, type BundleShape } from "../bundle/bundle.js";
import { ApiError, BundleError } from "../errors.js";
import { fmtEps } from "../ledger/ledger.js";
import { CryptoSource } from "../random/random.js";

const RETRY_STATUS = [429, 503];
/** The problem type of the server's privacy budget refusal (403). */
export const BUDGET_EXHAUSTED = "urn:privbert:problem:budget-exhausted";
/** The forwarder's answer to a request without the app's session (../forwarder.ts). */
export const FORWARDER_NO_SESSION = "urn:privbert:forwarder:no-session";
const BUNDLE_ID = /^[0-9a-f]{64}$/;
export const SERVICE_HINT = "(is --server the URL of a privbert service?)";
const PAGE_SERVICE_HINT = "(is `server` the URL of a privbert service, or of your forwarding backend?)";
/** The header with the bundle's length before any Content-Encoding (download progress). */
export const BUNDLE_BYTES_HEADER = "X-Bundle-Bytes";
const PROBE_TIMEOUT_MS = 800;

/** Who reads the errors: a web developer (option names, settings) or a CLI user (flags). */
export type Audience = "page" | "cli";

export interface ClientOptions {
  apiKey?: string | null;
  /** seconds per request */
  timeout?: number;
  retries?: number;
  /** payloads per request */
  batchSize?: number;
  backoff?: number;
  maxBackoff?: number;
  fetch?: typeof fetch;
  /** how errors are worded: "page" (default) or "cli" */
  audience?: Audience;
}

/** Where opening a session is: the bundle's download (bytes so far, of ``total`` when the
 * server says), its verification, then the privatizer's preparation (the exact search's
 * table, the privacy floor). */
export interface Progress {
  phase: "download" | "verify" | "prepare";
  loaded: number;
  total: number | null;
  /** the bundle came from the cache: nothing was downloaded */
  cached?: boolean;
  /** what the tarball's bundle.json declares, told once as soon as it has arrived (before the
   * table: unverified, a hint, e.g. for `warmUp`) */
  shape?: BundleShape;
}
export type ProgressCallback = (p: Progress) => void;

/** A served model (GET /v1/models). */
export interface ModelInfo {
  id: string;
  mechanism: string;
  params: Record<string, unknown>;
  bundle_id: string;
  max_length?: number | null;
  labels?: string[];
  guarantee?: unknown;
  [k: string]: unknown;
}

/** One prediction: the label's name (the task's, as the model was trained with it) and the
 * probability of each label. */
export interface Prediction {
  label: string;
  scores: Record<string, number>;
}

/** Where verified bundles are kept between uses (Cache API or IndexedDB in a page, a
 * directory in Node). Implementations store the bytes; every load is verified again. */
export interface BundleCache {
  get(bundleId: string): Promise<EdgeBundle | null>;
  put(bundleId: string, tarball: Uint8Array): Promise<void>;
}

function short(text: string, limit: number): string {
  // eslint-disable-next-line no-control-regex -- the control characters are what it removes
  const line = text.split(/\s+/).join(" ").replace(/[\u0000-\u001f\u007f]/g, "").trim();
  return line.length <= limit ? line : line.slice(0, limit - 1) + "…";
}

/** A streamed answer's watchdog: abort when no more of its body comes for ``ms``. */
const watchdogs = new WeakMap<Response, { ms: number; abort: () => void }>();

/** ``resp`` with its body read under the call's timer (then cleared): a small answer is
 * bounded as a whole, as before. */
async function settled(resp: Response, timer: ReturnType<typeof setTimeout>): Promise<Response> {
  try {
    let body: ArrayBuffer;
    try {
      body = await resp.arrayBuffer();
    } catch (exc) {
      throw new ApiError(`the answer of ${resp.url} broke off (${(exc as Error).message})`, resp.status);
    }
    const out = new Response(body, { status: resp.status, statusText: resp.statusText, headers: resp.headers });
    Object.defineProperty(out, "url", { value: resp.url });
    return out;
  } finally {
    clearTimeout(timer);
  }
}

/** The page's origin when this runs in a page or a worker (null in Node). */
function pageOrigin(): string | null {
  const loc = (globalThis as { location?: { origin?: string } }).location;
  return typeof loc?.origin === "string" && loc.origin !== "null" && /^https?:/.test(loc.origin) ? loc.origin : null;
}

export class PrivbertClient {
  readonly baseUrl: string;
  readonly audience: Audience;
  private readonly headers: Record<string, string>;
  private readonly hasKey: boolean;
  private readonly timeout: number;
  private readonly retries: number;
  private readonly batchSize: number;
  private readonly backoff: number;
  private readonly maxBackoff: number;
  private readonly fetchFn: typeof fetch;
  private readonly jitter = new CryptoSource();
  /** the model ids of the last GET /v1/models */
  servedIds: string[] | null = null;

  constructor(baseUrl: string, options: ClientOptions = {}) {
    this.audience = options.audience ?? "page";
    if (!/^https?:\/\//.test(baseUrl)) {
      throw new RangeError(`${this.audience === "cli" ? "server URL" : "server"} must start with http:// or https://, got ${JSON.stringify(baseUrl)}`);
    }
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.headers = {};
    this.hasKey = Boolean(options.apiKey);
    if (options.apiKey) this.headers["Authorization"] = `Bearer ${options.apiKey}`;
    this.timeout = options.timeout ?? 30;
    this.retries = options.retries ?? 5;
    this.batchSize = options.batchSize ?? 64;
    this.backoff = options.backoff ?? 0.5;
    this.maxBackoff = options.maxBackoff ?? 30;
    this.fetchFn = options.fetch ?? globalThis.fetch.bind(globalThis);
    const [t, r] = this.audience === "cli" ? ["--timeout", "--retries"] : ["timeout", "retries"];
    if (!(this.timeout > 0)) throw new RangeError(`${t} must be > 0, got ${this.timeout}`);
    if (!(this.retries >= 0)) throw new RangeError(`${r} must be >= 0, got ${this.retries}`);
  }

  private get serviceHint(): string {
    return this.audience === "cli" ? SERVICE_HINT : PAGE_SERVICE_HINT;
  }

  private delay(attempt: number, resp: Response | null): number {
    const after = resp?.headers.get("Retry-After") ?? "";
    if (/^\d+$/.test(after.trim())) return Math.min(Number(after), this.maxBackoff);
    const base = Math.min(this.backoff * 2 ** attempt, this.maxBackoff);
    return base * (0.5 + this.jitter.nextDouble() / 2); // jitter: replicas do not retry in step
  }

  /** The hint after an error status, for this client's audience. */
  private statusHint(status: number, ptype: string | null, path: string, left = Number.NaN): string {
    if (this.audience === "cli") {
      if (status === 401) return " (check --api-key or $PRIVBERT_API_KEY)";
      if (status === 403 && ptype === BUDGET_EXHAUSTED) {
        return ` (the server's privacy budget for this key or device: remaining ${Number.isFinite(left) ? fmtEps(left) : "unknown"} `
          + "worst-case epsilon; its admin sets the cap)";
      }
      if (status === 403) return " (this key may not use that endpoint)";
      if (status === 413) return " (request too large: lower --post-batch)";
      return "";
    }
    if (status === 401 && ptype === FORWARDER_NO_SESSION) {
      return " (your backend forwards for signed-in users only and this request had no session: sign the user in "
        + "through your backend (its own sign-in, whose cookie the page then sends), then open the session again; "
        + "the page needs no API key)";
    }
    if (status === 401) {
      return this.hasKey
        ? " (the service does not know this API key, or it was revoked: pass an application key of this service as apiKey, or send through your backend, which adds the key)"
        : " (no API key was given: pass an application key as apiKey, or point server at your backend, which adds the key)";
    }
    if (status === 403 && ptype === BUDGET_EXHAUSTED) {
      return " (the privacy budget this key, or this device, has on the service is spent: nothing was stored; "
        + "the operator raises its cap with PUT /admin/budgets/{key_id}, or hands out another key)";
    }
    if (status === 403) return ` (this key may not use ${path}: an application key reads /v1 only)`;
    if (status === 413) return " (request too large: send fewer texts per call, or lower batchSize)";
    return "";
  }

  private async problem(resp: Response, discovery: string | null, path = ""): Promise<ApiError> {
    const text = await resp.text();
    let problem: Record<string, unknown> = {};
    try {
      const body = JSON.parse(text) as unknown;
      if (body && typeof body === "object" && !Array.isArray(body)) problem = body as Record<string, unknown>;
    } catch { /* not JSON */ }
    const ctype = (resp.headers.get("Content-Type") ?? "").split(";")[0]!.trim().toLowerCase();
    const isProblem = Object.keys(problem).length > 0 && ctype === "application/problem+json";
    // eslint-disable-next-line @typescript-eslint/no-base-to-string -- as the Python edge's str(title)
    const title = short(String(problem.title ?? (resp.statusText || "error")), 80);
    let detail: string | null = problem.detail === undefined || problem.detail === null ? null
      : typeof problem.detail === "string" ? problem.detail : JSON.stringify(problem.detail);
    if (detail === null && Object.keys(problem).length === 0 && text.trim()) {
      detail = ctype.includes("html") || text.trim().startsWith("<") ? "an HTML page, not a privbert answer" : short(text, 80);
    }
    const ptype = typeof problem.type === "string" ? problem.type : null;
    // a page's developer is told which URL answered (a wrong server or forwarder path)
    let msg = this.audience === "page" && discovery ? `GET ${this.baseUrl}${path}: ` : "";
    msg += `server answered ${resp.status} ${title}`;
    if (detail) msg += `: ${short(detail, 300)}`;
    if (ptype && ptype !== "about:blank") msg += ` [${short(ptype, 120)}]`;
    if (discovery && (!isProblem || (resp.status === 404 && discovery === "/v1/models"))) msg += ` ${this.serviceHint}`;
    const left = Number(problem.remaining ?? resp.headers.get("X-Privacy-Budget-Remaining") ?? Number.NaN);
    msg += this.statusHint(resp.status, ptype, path, left);
    return new ApiError(msg, resp.status, ptype);
  }

  /** A page's request to another origin that got no answer: a CORS refusal when the service
   * answers a plain probe (which CORS does not check), else a service out of reach. */
  private async crossOriginFailure(url: string, origin: string, why: string): Promise<ApiError> {
    const target = new URL(url).origin;
    let answered = false;
    try {
      await this.fetchFn(url, { method: "GET", mode: "no-cors", credentials: "omit", cache: "no-store",
        signal: AbortSignal.timeout(PROBE_TIMEOUT_MS) });
      answered = true;
    } catch { /* no answer at all */ }
    if (answered) {
      return new ApiError(`the service at ${target} answered, but not to this page: it does not allow the `
        + `origin ${origin} (a CORS refusal). List it in the service's PRIVBERT_CORS_ORIGINS `
        + `(PRIVBERT_CORS_ORIGINS=${origin}), or call the service through your own backend`, null, "cors");
    }
    return new ApiError(`cannot reach ${url} from this page (${why}): the service is down or out of reach, `
      + `or it refuses this page's origin ${origin} (CORS: PRIVBERT_CORS_ORIGINS), or the page's `
      + "Content-Security-Policy (connect-src) blocks it", null, "unreachable");
  }

  /** One call with retries; a non-2xx final answer raises ApiError. ``timeout`` seconds
   * bound the whole call, or with ``stream`` the wait for the answer's headers and then each
   * wait for more of its body (a large download on a slow network is not cut off while it
   * flows: {@link bodyWatchdog}). */
  async request(method: string, path: string, body?: string, headers: Record<string, string> = {},
                stream = false): Promise<Response> {
    const url = `${this.baseUrl}${path}`;
    const discovery = method === "GET" && (path === "/v1/models" || path.startsWith("/v1/bundles/")) ? path : null;
    const origin = this.audience === "page" ? pageOrigin() : null;
    const crossOrigin = origin !== null && new URL(url).origin !== origin;
    let last = "";
    let status: number | null = null;
    for (let attempt = 0; attempt <= this.retries; attempt++) {
      let resp: Response | null = null;
      const ctl = new AbortController();
      const timer = setTimeout(() => ctl.abort(new DOMException(`no answer in ${this.timeout} s`, "TimeoutError")),
        this.timeout * 1000);
      try {
        resp = await this.fetchFn(url, { method, body, headers: { ...this.headers, ...headers }, signal: ctl.signal });
        if (stream) {
          clearTimeout(timer);
          watchdogs.set(resp, { ms: this.timeout * 1000, abort: () => ctl.abort(new DOMException(
            `no data for ${this.timeout} s`, "TimeoutError")) });
        }
      } catch (exc) {
        clearTimeout(timer);
        const e = exc as Error & { cause?: { code?: string; message?: string } };
        const timedOut = e.name === "TimeoutError" || e.name === "AbortError";
        if (crossOrigin && !timedOut) throw await this.crossOriginFailure(url, origin, e.message);
        last = timedOut
          ? `no answer from ${url} in time (${e.name})`
          : `cannot reach ${url} (${e.cause?.code ?? e.cause?.message ?? e.message})`;
      }
      if (resp !== null) {
        status = resp.status;
        if (!RETRY_STATUS.includes(resp.status)) {
          if (resp.ok) return stream ? resp : await settled(resp, timer);
          try {
            throw await this.problem(resp, discovery, path);
          } finally {
            clearTimeout(timer);
          }
        }
        last = (await this.problem(resp, discovery, path)).message;
        clearTimeout(timer);
      }
      if (attempt < this.retries) await new Promise((r) => setTimeout(r, 1000 * this.delay(attempt, resp)));
    }
    const hint = this.audience === "cli" ? "check --server and that the service is running"
      : `is the service running at ${this.baseUrl}?`;
    throw new ApiError(`${last}; gave up after ${this.retries + 1} attempts (${hint})`, status);
  }

  private async json(resp: Response): Promise<unknown> {
    const text = await resp.text();
    try {
      return JSON.parse(text);
    } catch {
      throw new ApiError(`${resp.url}: answer is not JSON ${this.serviceHint}`, resp.status);
    }
  }

  /** GET /v1/models. */
  async models(): Promise<ModelInfo[]> {
    const body = await this.json(await this.request("GET", "/v1/models"));
    const models = body && typeof body === "object" && !Array.isArray(body) ? (body as { models?: unknown }).models : body;
    if (!Array.isArray(models)) throw new ApiError(`GET /v1/models: unexpected answer (no list of models) ${this.serviceHint}`);
    return models as ModelInfo[];
  }

  /** The served model ``modelId``; without one, the only model served. */
  async model(modelId?: string | null): Promise<ModelInfo> {
    const models = await this.models();
    const ids = models.map((m) => String(m.id));
    this.servedIds = ids; // what a pin checks a new model against (a rename)
    if (modelId == null) {
      if (models.length === 1) return models[0]!;
      const how = this.audience === "cli" ? "--model ID" : "the model option";
      throw new ApiError(`the server serves ${models.length} models (${ids.join(", ") || "none"}): pick one with ${how}`);
    }
    const found = models.find((m) => String(m.id) === modelId);
    if (!found) throw new ApiError(`the server has no model '${modelId}'; it serves: ${ids.join(", ") || "none"}`);
    return found;
  }

  /** GET /v1/bundles/{id}: the tarball's bytes (not verified: see {@link bundle}), read as
   * they arrive; ``onProgress`` hears of them at most every 100 ms, and at the end. */
  async bundleBytes(bundleId: string, onProgress?: ProgressCallback | null): Promise<Uint8Array> {
    if (!BUNDLE_ID.test(bundleId)) throw new ApiError(`not a bundle id (64 hex digits): ${JSON.stringify(bundleId)}`);
    const path = `/v1/bundles/${bundleId}`;
    const resp = await this.request("GET", path, undefined, {}, true);
    const declared = Number(resp.headers.get(BUNDLE_BYTES_HEADER)
      ?? (resp.headers.get("Content-Encoding") ? NaN : resp.headers.get("Content-Length") ?? NaN));
    const total = Number.isInteger(declared) && declared >= 0 ? declared : null;
    return readWithProgress(resp, total, onProgress ?? (() => undefined), `${this.baseUrl}${path}`);
  }

  /**
   * The bundle ``bundleId``: from ``cache`` when it holds a copy that verifies, else fetched,
   * verified (every file's SHA-256 and the id) and cached. A download that fails verification
   * is refused and never cached or used. ``onProgress``: the download's bytes, then "verify".
   */
  async bundle(bundleId: string, cache?: BundleCache | null,
               onProgress?: ProgressCallback | null): Promise<{ bundle: EdgeBundle; fetched: boolean }> {
    if (cache) {
      const hit = await cache.get(bundleId).catch(() => null);
      if (hit) {
        onProgress?.({ phase: "verify", loaded: 0, total: null, cached: true });
        return { bundle: hit, fetched: false };
      }
    }
    const data = await this.bundleBytes(bundleId, onProgress);
    onProgress?.({ phase: "verify", loaded: data.length, total: data.length });
    let bundle: EdgeBundle;
    try {
      bundle = await EdgeBundle.fromTar(data, bundleId);
    } catch (exc) {
      const where = this.audience === "page" ? ` from ${this.baseUrl}/v1/bundles/${bundleId}` : "";
      throw new BundleError(`the bundle the server sent for ${bundleId.slice(0, 12)}…${where} failed verification: ${(exc as Error).message}`);
    }
    if (cache) await cache.put(bundleId, data);
    return { bundle, fetched: true };
  }

  /** POST /v1/models/{id}/predict in requests of at most ``batchSize`` payloads. */
  async predict(modelId: string, payloads: string[]): Promise<Prediction[]> {
    const out: Prediction[] = [];
    try {
      for (let s = 0; s < payloads.length; s += this.batchSize) {
        const batch = payloads.slice(s, s + this.batchSize);
        const resp = await this.request("POST", `/v1/models/${encodeURIComponent(modelId)}/predict`,
          `{"payloads":[${batch.join(",")}]}`, { "Content-Type": "application/json" });
        const body = await this.json(resp) as { predictions?: unknown };
        const preds = body?.predictions;
        if (!Array.isArray(preds) || preds.length !== batch.length) {
          throw new ApiError(`predict: expected ${batch.length} predictions, got ${Array.isArray(preds) ? preds.length : "none"}`);
        }
        out.push(...(preds as Prediction[]));
      }
    } catch (exc) {
      if (exc instanceof ApiError) exc.partial = out;
      throw exc;
    }
    return out;
  }

  /** POST /v1/records in batches, each with its own Idempotency-Key (kept across retries). */
  async postRecords(task: string, recordJsons: string[]): Promise<unknown[]> {
    const ids: unknown[] = [];
    const prefix = Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
    try {
      for (let s = 0, n = 0; s < recordJsons.length; s += this.batchSize, n++) {
        const batch = recordJsons.slice(s, s + this.batchSize);
        const resp = await this.request("POST", "/v1/records", `{"task":${JSON.stringify(task)},"records":[${batch.join(",")}]}`,
          { "Content-Type": "application/json", "Idempotency-Key": `${prefix}-${n}` });
        const body = await this.json(resp) as { ids?: unknown; record_ids?: unknown } | unknown[];
        const got = Array.isArray(body) ? body : (body?.ids ?? body?.record_ids);
        if (!Array.isArray(got) || got.length !== batch.length) {
          throw new ApiError(`records: expected ${batch.length} record ids, got ${Array.isArray(got) ? got.length : "none"}`);
        }
        ids.push(...(got as unknown[]));
      }
    } catch (exc) {
      if (exc instanceof ApiError) exc.partial = ids;
      throw exc;
    }
    return ids;
  }
}

/** The body's bytes, into one buffer (of ``total`` when known: no copy at the end), with
 * progress at most every 100 ms and once at the end. A body cut short (fewer bytes than
 * announced) is left to the bundle's verification, which names what is missing. */
async function readWithProgress(resp: Response, total: number | null,
                                onProgress: ProgressCallback, url: string): Promise<Uint8Array> {
  if (resp.body === null) {
    const out = new Uint8Array(await resp.arrayBuffer());
    onProgress({ phase: "download", loaded: out.length, total: out.length });
    return out;
  }
  const reader = resp.body.getReader();
  const dog = watchdogs.get(resp);
  let buf = new Uint8Array(total ?? 1 << 20);
  let loaded = 0;
  let told = 0;
  let shape: BundleShape | null | undefined = null;  // null: bundle.json not in yet
  for (;;) {
    let chunk: ReadableStreamReadResult<Uint8Array>;
    const stall = dog ? setTimeout(dog.abort, dog.ms) : undefined;
    try {
      chunk = await reader.read();
    } catch (exc) {
      throw new ApiError(`the download of ${url} broke off after ${loaded} bytes (${(exc as Error).message})`);
    } finally {
      clearTimeout(stall);
    }
    if (chunk.done) break;
    const v = chunk.value;
    if (loaded + v.length > buf.length) {  // more than announced, or no announcement: grow
      const grown = new Uint8Array(Math.max(buf.length * 2, loaded + v.length));
      grown.set(buf.subarray(0, loaded));
      buf = grown;
    }
    buf.set(v, loaded);
    loaded += v.length;
    if (shape === null) {
      shape = peekBundleShape(buf, loaded);
      if (shape) onProgress({ phase: "download", loaded, total, shape });
    }
    const t = globalThis.performance?.now() ?? Date.now();
    if (t - told >= 100) {
      told = t;
      onProgress({ phase: "download", loaded, total });
    }
  }
  onProgress({ phase: "download", loaded, total });
  return loaded === buf.length ? buf : buf.slice(0, loaded);
}
