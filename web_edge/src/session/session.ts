/**
 * A privatizing session against one served model, for a page or a script: the model's bundle
 * checked against this device's pin (../service/pins.ts), fetched and verified (and cached), the
 * privatizer at the model's η (checked against the privacy floor, measured afresh), the device
 * ledger, and one call that privatizes, charges (before anything is sent) and predicts.
 *
 *     const s = await EdgeSession.open({ server: "https://api.example", apiKey, onProgress });
 *     const r = await s.predict("a sentence");   // r.sent: the only thing that left the device
 *     r.predictions[0].label;                      // the task's label name, e.g. "positive"
 *
 * With ``worker`` the bundle's verification, the exact search's table, the privacy floor and
 * every privatization run in that Worker (src/worker.ts); the ledger stays here.
 */

import type { AnyGuarantee } from "../ledger/accounting.js";
import { CacheApiBundleCache, IndexedDbPinStore, IndexedDbTextFloorCache } from "./browser_stores.js";
import { trustNote, type Trust } from "../bundle/trust.js";
import type { TextFloorCache } from "../floor/text_floor_cache.js";
import {
  PrivbertClient, type BundleCache, type ModelInfo, type Prediction, type ProgressCallback,
} from "../service/client.js";
import { openLocal, type Engine, type PlainPrivatizerOptions } from "./engine.js";
import { TextError } from "../errors.js";
import { Ledger, MemoryLedgerStore, type Cost, type LedgerStore, type Status } from "../ledger/ledger.js";
import { configureRuntime, type WasmPaths } from "../runtime/ort.js";
import { mechanismSpec, substitutesTokens } from "../mechanisms/specs.js";
import { nTokens } from "../mechanisms/tokens.js";
import { MemoryPinStore, checkPin, parseIds, type PinStore } from "../service/pins.js";
import type { BitSource } from "../random/random.js";
import { RemoteEngine } from "./remote.js";

export interface SessionOptions {
  /** the service's URL, or your forwarding backend's (which adds the key) */
  server: string;
  apiKey?: string | null;
  /** the served model (default: the only one) */
  model?: string | null;
  /** default: the model's η */
  eta?: number;
  /** default: the model's */
  mechanism?: string;
  /** a text past the model's length: "error" (default) refuses it with a TextError, nothing
   * charged or sent; "first" keeps its first word pieces (edge-agent's --truncate first) */
  truncate?: "error" | "first";
  ledger?: LedgerStore;
  /** verified bundles between visits: true = the Cache API, or your own; default none */
  bundleCache?: BundleCache | boolean | null;
  /** the bundle pins (default: IndexedDB where the page has it, else this process's memory) */
  pins?: PinStore | null;
  /** bundle ids the user accepts for the model in place of the one this device pinned */
  acceptBundle?: string | readonly string[] | null;
  /** bundle ids this app trusts as they are, beside the bundles privbert builds from public
   * sources (any other bundle is unverified: checked by the text floor too, and said so by
   * {@link EdgeSession.trust}) */
  trustedBundles?: string | readonly string[] | null;
  /** refuse a bundle that is neither known nor trusted (a BundleChanged before it is fetched) */
  refuseUnverified?: boolean;
  /** an unverified bundle's passed text floor, kept between loads and signed by this device:
   * true (default where the page has IndexedDB) or your own store; false measures it at every load */
  textFloorCache?: TextFloorCache | boolean | null;
  /** what the privacy floor's check draws from: OS entropy unless given (tests only; not
   * with ``worker``) */
  floorSource?: BitSource | null;
  /** WebAssembly threads of the nearest-token search */
  threads?: number;
  /** the nearest-token search's candidate pass (ExactNearest's ``backend``): "auto" (default:
   * onnxruntime-web for a large table, a plain JS loop for a compact one, which fetches no
   * WebAssembly), "int8" or "ort" (onnxruntime-web), "loop"; every one gives the same tokens */
  backend?: "auto" | "int8" | "ort" | "loop";
  allowWeakPrivacy?: boolean;
  /** where the page serves onnxruntime-web's WebAssembly (default: beside its script, where
   * Vite and webpack put it) */
  wasmPaths?: WasmPaths | null;
  /** the bundle's download (bytes so far, of total), its verification, the preparation */
  onProgress?: ProgressCallback | null;
  /** privatize in this module Worker, whose script imports "@privbert/edge/worker" */
  worker?: Worker | null;
  /** seconds per request, and retries (429, 503, a same-origin service out of reach) */
  timeout?: number;
  retries?: number;
}

/** What one privatization sent and cost. */
export interface Sent {
  /** the payload JSON that left the device */
  payload: string;
  /** the privatized tokens as text (a mechanism that sends other tokens' ids), else null */
  privatizedText: string | null;
  tokens: number;
  /** null: a memoized repeat (the stored payload, at no cost) */
  cost: Cost | null;
}

/** A string is a batch of one: the answers are lists either way. */
function asList(texts: string | string[]): string[] {
  if (typeof texts === "string") return [texts];
  if (!Array.isArray(texts) || texts.some((t) => typeof t !== "string")) {
    throw new TypeError(`texts must be a string or an array of strings, got ${describe(texts)}`);
  }
  return texts;
}

function describe(v: unknown): string {
  if (Array.isArray(v)) return `an array holding ${describe(v.find((t) => typeof t !== "string"))}`;
  return v === null ? "null" : typeof v;
}

export class EdgeSession {
  private constructor(readonly client: PrivbertClient, readonly model: ModelInfo,
                      private readonly engine: Engine, readonly ledger: Ledger) {}

  static async open(o: SessionOptions): Promise<EdgeSession> {
    const truncate = o.truncate ?? "error";
    if (truncate !== "error" && truncate !== "first") {
      throw new RangeError(`truncate must be "error" or "first", got ${JSON.stringify(truncate)}`);
    }
    if (o.wasmPaths !== undefined && !o.worker) configureRuntime({ wasmPaths: o.wasmPaths });
    const client = new PrivbertClient(o.server, { apiKey: o.apiKey ?? null, timeout: o.timeout, retries: o.retries });
    const accept = parseIds(o.acceptBundle, "acceptBundle");
    const trusted = parseIds(o.trustedBundles, "trustedBundles");
    const model = await client.model(o.model ?? null);
    // the pin is checked before a byte of the bundle is fetched, and recorded once it is verified
    const pins = o.pins ?? (globalThis.indexedDB ? new IndexedDbPinStore() : new MemoryPinStore());
    const modelId = String(model.id);
    const pinOptions = { accept, trusted, refuseUnverified: o.refuseUnverified ?? false,
      refuseHow: "the refuseUnverified option", trustHow: "the trustedBundles option", served: client.servedIds };
    await checkPin(pins, o.server, modelId, model.bundle_id, { ...pinOptions, record: false });
    const mechanism = o.mechanism ?? model.mechanism;
    // the model's parameters (its η unless the page asks for another)
    const params: Record<string, number | string> = { ...(model.params as Record<string, number | string>) };
    if (o.eta !== undefined) params.eta = o.eta;
    const options: PlainPrivatizerOptions = {
      mechanism, params, served: { max_length: model.max_length }, truncate,
      threads: o.threads, backend: o.backend, allowWeakPrivacy: o.allowWeakPrivacy,
      trustedBundles: [...trusted], trustHow: "the trustedBundles option",
    };
    const keep = o.textFloorCache ?? Boolean(globalThis.indexedDB);
    let engine: Engine;
    if (o.worker) {
      if (o.bundleCache !== undefined && o.bundleCache !== null && typeof o.bundleCache !== "boolean") {
        throw new RangeError("bundleCache: a session in a Worker keeps the browser's own cache; pass true or false, not an object");
      }
      if (o.floorSource) throw new RangeError("floorSource: a seeded floor is for tests in this thread, not in a Worker");
      if (typeof keep === "object" && keep !== null) {
        throw new RangeError("textFloorCache: a session in a Worker keeps the browser's own store; pass true or false, not an object");
      }
      engine = await RemoteEngine.open(o.worker, {
        server: client.baseUrl, apiKey: o.apiKey ?? null,
        client: { timeout: o.timeout, retries: o.retries }, bundleId: model.bundle_id, options,
        bundleCache: o.bundleCache === true,
        textFloorCache: keep === true,
        wasmPaths: absolute(o.wasmPaths ?? null),
      }, o.onProgress);
    } else {
      engine = await openLocal(client, model.bundle_id, {
        ...options,
        bundleCache: o.bundleCache === true ? new CacheApiBundleCache() : o.bundleCache || null,
        floorSource: o.floorSource ?? null,
        onProgress: o.onProgress,
        textFloorCache: keep === true ? new IndexedDbTextFloorCache() : keep || null,
      });
    }
    if (engine.info.bundleId !== model.bundle_id) throw new Error("the engine opened another bundle than the model's");
    await checkPin(pins, o.server, modelId, model.bundle_id, { ...pinOptions, record: true });
    return new EdgeSession(client, model, engine, new Ledger(o.ledger ?? new MemoryLedgerStore()));
  }

  /** The mechanism, its parameters, the bundle, the length limit: what payloads are made with. */
  get info(): Engine["info"] {
    return this.engine.info;
  }

  /** How far this edge vouches for the bundle: known (built by privbert from public sources),
   * trusted (the trustedBundles option) or unverified (checked by the floors only). */
  get trust(): Trust {
    return this.engine.info.trust;
  }

  /** One line for the page beside the guarantee, e.g. "bundle 6be7… unverified: checked by
   * the floor only". */
  get trustNote(): string {
    return trustNote(this.engine.info.trust, "the trustedBundles option");
  }

  /** The task's label names (what predictions' `label` is one of). */
  get labels(): string[] {
    return Array.isArray(this.model.labels) ? [...this.model.labels] : [];
  }

  /** The published and worst-case guarantee (dχ: per token; a sentence-vector mechanism: per
   * sentence); `summary(session.guarantee)` writes it in one line. */
  get guarantee(): AnyGuarantee {
    return this.engine.info.guarantee;
  }

  /**
   * Privatize ``texts`` (a string, or an array of them) and charge the ledger (BudgetRefused
   * before anything is sent). A text past the model's length is a TextError unless the session
   * was opened with ``truncate: "first"``; an empty text is a TextError.
   */
  async privatize(texts: string | string[], source?: BitSource | null): Promise<Sent[]> {
    const list = asList(texts);
    const { items, payloads: fresh, costs } = await this.engine.privatize(list, source);
    const info = this.engine.info;
    const keys = await this.ledger.memoKeys({ mechanism: info.name, params: info.params, bundle_id: info.bundleId });
    const memo = await Promise.all(items.map((it) => keys.keyOf(it.idsA, it.idsB)));
    const charged = await this.ledger.charge(costs, fresh, memo,
      { mechanism: info.name, params: info.params, bundleId: info.bundleId });
    const field = mechanismSpec(info.name).payload.field;
    const texts_ = substitutesTokens(info.name)
      ? await this.engine.decode(charged.payloads.map((p) => decodeIds((JSON.parse(p) as Record<string, { data: string }>)[field]!.data)))
      : null;
    const seen = new Set<string>();
    return charged.payloads.map((payload, i) => {
      const first = payload === fresh[i] && !seen.has(memo[i]!);
      seen.add(memo[i]!);
      return { payload, privatizedText: texts_?.[i] ?? null, tokens: nTokens(items[i]!), cost: first ? costs[i]! : null };
    });
  }

  /** Privatize, charge, then ask the model: the prediction for each text (its label is the
   * task's label name). */
  async predict(texts: string | string[], source?: BitSource | null): Promise<{ sent: Sent[]; predictions: Prediction[] }> {
    const list = asList(texts);
    const empty = list.findIndex((t) => t.trim() === "");
    if (empty >= 0) throw new TextError(empty, "empty", "has no tokens");
    const sent = await this.privatize(list, source);
    const predictions = await this.client.predict(this.model.id, sent.map((s) => s.payload));
    return { sent, predictions };
  }

  async status(): Promise<Status> {
    return this.ledger.status();
  }

  async close(): Promise<void> {
    await this.engine.close();
  }
}

/** wasmPaths as absolute URLs: a Worker resolves relative ones against its own script. */
function absolute(p: WasmPaths | null): WasmPaths | null {
  const base = globalThis.location?.href;
  if (p === null || base === undefined) return p;
  if (typeof p === "string") return new URL(p, base).href;
  return { ...(p.wasm !== undefined ? { wasm: new URL(String(p.wasm), base).href } : {}),
    ...(p.mjs !== undefined ? { mjs: new URL(String(p.mjs), base).href } : {}) };
}

function decodeIds(b64: string): number[] {
  const bin = atob(b64);
  const out: number[] = [];
  for (let i = 0; i < bin.length; i += 4) {
    out.push((bin.charCodeAt(i) | (bin.charCodeAt(i + 1) << 8) | (bin.charCodeAt(i + 2) << 16) | (bin.charCodeAt(i + 3) << 24)) >>> 0);
  }
  return out;
}
