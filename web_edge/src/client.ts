/**
 * The privbert API from the device, with `fetch` (browsers and Node ≥ 20): served models, the
 * edge bundle (verified before use), predictions and records. Only payload JSON travels: the
 * client takes payloads, never text. Retries with exponential backoff on 429/503 and connection
 * errors (honouring Retry-After); errors are one line with the server's problem+json title,
 * detail and type (edge_agent/service/client.py's wording).
 */

import { EdgeBundle } from "./bundle.js";
import { ApiError, BundleError } from "./errors.js";
import { fmtEps } from "./ledger.js";
import { CryptoSource } from "./random.js";

const RETRY_STATUS = [429, 503];
/** The problem type of the server's privacy budget refusal (403). */
export const BUDGET_EXHAUSTED = "urn:privbert:problem:budget-exhausted";
const BUNDLE_ID = /^[0-9a-f]{64}$/;
export const SERVICE_HINT = "(is --server the URL of a privbert service?)";

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
}

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

/** Where verified bundles are kept between uses (Cache API or IndexedDB in a page, a
 * directory in Node). Implementations store the bytes; every load is verified again. */
export interface BundleCache {
  get(bundleId: string): Promise<EdgeBundle | null>;
  put(bundleId: string, tarball: Uint8Array): Promise<void>;
}

function short(text: string, limit: number): string {
  const line = text.split(/\s+/).join(" ").replace(/[\u0000-\u001f\u007f]/g, "").trim();
  return line.length <= limit ? line : line.slice(0, limit - 1) + "…";
}

export class PrivbertClient {
  readonly baseUrl: string;
  private readonly headers: Record<string, string>;
  private readonly timeout: number;
  private readonly retries: number;
  private readonly batchSize: number;
  private readonly backoff: number;
  private readonly maxBackoff: number;
  private readonly fetchFn: typeof fetch;
  private readonly jitter = new CryptoSource();

  constructor(baseUrl: string, options: ClientOptions = {}) {
    if (!/^https?:\/\//.test(baseUrl)) {
      throw new RangeError(`server URL must start with http:// or https://, got ${JSON.stringify(baseUrl)}`);
    }
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.headers = {};
    if (options.apiKey) this.headers["Authorization"] = `Bearer ${options.apiKey}`;
    this.timeout = options.timeout ?? 30;
    this.retries = options.retries ?? 5;
    this.batchSize = options.batchSize ?? 64;
    this.backoff = options.backoff ?? 0.5;
    this.maxBackoff = options.maxBackoff ?? 30;
    this.fetchFn = options.fetch ?? globalThis.fetch.bind(globalThis);
    if (!(this.timeout > 0)) throw new RangeError(`--timeout must be > 0, got ${this.timeout}`);
    if (!(this.retries >= 0)) throw new RangeError(`--retries must be >= 0, got ${this.retries}`);
  }

  private delay(attempt: number, resp: Response | null): number {
    const after = resp?.headers.get("Retry-After") ?? "";
    if (/^\d+$/.test(after.trim())) return Math.min(Number(after), this.maxBackoff);
    const base = Math.min(this.backoff * 2 ** attempt, this.maxBackoff);
    return base * (0.5 + this.jitter.nextDouble() / 2); // jitter: replicas do not retry in step
  }

  private async problem(resp: Response, discovery: string | null): Promise<ApiError> {
    const text = await resp.text();
    let problem: Record<string, unknown> = {};
    try {
      const body = JSON.parse(text) as unknown;
      if (body && typeof body === "object" && !Array.isArray(body)) problem = body as Record<string, unknown>;
    } catch { /* not JSON */ }
    const ctype = (resp.headers.get("Content-Type") ?? "").split(";")[0]!.trim().toLowerCase();
    const isProblem = Object.keys(problem).length > 0 && ctype === "application/problem+json";
    const title = short(String(problem.title ?? (resp.statusText || "error")), 80);
    let detail: string | null = problem.detail === undefined || problem.detail === null ? null
      : typeof problem.detail === "string" ? problem.detail : JSON.stringify(problem.detail);
    if (detail === null && Object.keys(problem).length === 0 && text.trim()) {
      detail = ctype.includes("html") || text.trim().startsWith("<") ? "an HTML page, not a privbert answer" : short(text, 80);
    }
    const ptype = typeof problem.type === "string" ? problem.type : null;
    let msg = `server answered ${resp.status} ${title}`;
    if (detail) msg += `: ${short(detail, 300)}`;
    if (ptype && ptype !== "about:blank") msg += ` [${short(ptype, 120)}]`;
    if (discovery && (!isProblem || (resp.status === 404 && discovery === "/v1/models"))) msg += ` ${SERVICE_HINT}`;
    if (resp.status === 401) msg += " (check --api-key or $PRIVBERT_API_KEY)";
    else if (resp.status === 403 && ptype === BUDGET_EXHAUSTED) {
      const left = Number(problem.remaining ?? resp.headers.get("X-Privacy-Budget-Remaining") ?? Number.NaN);
      msg += ` (the server's privacy budget for this key or device: remaining ${Number.isFinite(left) ? fmtEps(left) : "unknown"} `
        + "worst-case epsilon; its admin sets the cap)";
    } else if (resp.status === 403) msg += " (this key may not use that endpoint)";
    else if (resp.status === 413) msg += " (request too large: lower --post-batch)";
    return new ApiError(msg, resp.status, ptype);
  }

  /** One call with retries; a non-2xx final answer raises ApiError. */
  async request(method: string, path: string, body?: string, headers: Record<string, string> = {}): Promise<Response> {
    const url = `${this.baseUrl}${path}`;
    const discovery = method === "GET" && (path === "/v1/models" || path.startsWith("/v1/bundles/")) ? path : null;
    let last = "";
    let status: number | null = null;
    for (let attempt = 0; attempt <= this.retries; attempt++) {
      let resp: Response | null = null;
      try {
        resp = await this.fetchFn(url, { method, body, headers: { ...this.headers, ...headers },
          signal: AbortSignal.timeout(this.timeout * 1000) });
      } catch (exc) {
        const e = exc as Error & { cause?: { code?: string; message?: string } };
        last = e.name === "TimeoutError" || e.name === "AbortError"
          ? `no answer from ${url} in time (${e.name})`
          : `cannot reach ${url} (${e.cause?.code ?? e.cause?.message ?? e.message})`;
      }
      if (resp !== null) {
        status = resp.status;
        if (!RETRY_STATUS.includes(resp.status)) {
          if (resp.ok) return resp;
          throw await this.problem(resp, discovery);
        }
        last = (await this.problem(resp, discovery)).message;
      }
      if (attempt < this.retries) await new Promise((r) => setTimeout(r, 1000 * this.delay(attempt, resp)));
    }
    throw new ApiError(`${last}; gave up after ${this.retries + 1} attempts (check --server and that the service is running)`, status);
  }

  private async json(resp: Response): Promise<unknown> {
    const text = await resp.text();
    try {
      return JSON.parse(text);
    } catch {
      throw new ApiError(`${resp.url}: answer is not JSON ${SERVICE_HINT}`, resp.status);
    }
  }

  /** GET /v1/models. */
  async models(): Promise<ModelInfo[]> {
    const body = await this.json(await this.request("GET", "/v1/models"));
    const models = body && typeof body === "object" && !Array.isArray(body) ? (body as { models?: unknown }).models : body;
    if (!Array.isArray(models)) throw new ApiError(`GET /v1/models: unexpected answer (no list of models) ${SERVICE_HINT}`);
    return models as ModelInfo[];
  }

  /** The served model ``modelId``; without one, the only model served. */
  async model(modelId?: string | null): Promise<ModelInfo> {
    const models = await this.models();
    const ids = models.map((m) => String(m.id));
    if (modelId == null) {
      if (models.length === 1) return models[0]!;
      throw new ApiError(`the server serves ${models.length} models (${ids.join(", ") || "none"}): pick one with --model ID`);
    }
    const found = models.find((m) => String(m.id) === modelId);
    if (!found) throw new ApiError(`the server has no model '${modelId}'; it serves: ${ids.join(", ") || "none"}`);
    return found;
  }

  /** GET /v1/bundles/{id}: the tarball's bytes (not verified: see {@link bundle}). */
  async bundleBytes(bundleId: string): Promise<Uint8Array> {
    if (!BUNDLE_ID.test(bundleId)) throw new ApiError(`not a bundle id (64 hex digits): ${JSON.stringify(bundleId)}`);
    const resp = await this.request("GET", `/v1/bundles/${bundleId}`);
    return new Uint8Array(await resp.arrayBuffer());
  }

  /**
   * The bundle ``bundleId``: from ``cache`` when it holds a copy that verifies, else fetched,
   * verified (every file's SHA-256 and the id) and cached. A download that fails verification
   * is refused and never cached or used.
   */
  async bundle(bundleId: string, cache?: BundleCache | null): Promise<{ bundle: EdgeBundle; fetched: boolean }> {
    if (cache) {
      const hit = await cache.get(bundleId).catch(() => null);
      if (hit) return { bundle: hit, fetched: false };
    }
    const data = await this.bundleBytes(bundleId);
    let bundle: EdgeBundle;
    try {
      bundle = await EdgeBundle.fromTar(data, bundleId);
    } catch (exc) {
      throw new BundleError(`the bundle the server sent for ${bundleId.slice(0, 12)}… failed verification: ${(exc as Error).message}`);
    }
    if (cache) await cache.put(bundleId, data);
    return { bundle, fetched: true };
  }

  /** POST /v1/models/{id}/predict in requests of at most ``batchSize`` payloads. */
  async predict(modelId: string, payloads: string[]): Promise<{ label: string; scores: Record<string, number> }[]> {
    const out: { label: string; scores: Record<string, number> }[] = [];
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
        out.push(...(preds as { label: string; scores: Record<string, number> }[]));
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
        ids.push(...got);
      }
    } catch (exc) {
      if (exc instanceof ApiError) exc.partial = ids;
      throw exc;
    }
    return ids;
  }
}
