/**
 * The privatizing side of an {@link EdgeSession}: the verified bundle and a privatizer, in the
 * page's thread ({@link LocalEngine}) or in a Worker (`RemoteEngine`, src/session/remote.ts, talking to
 * src/worker.ts). Either gives the session the same things: for each text its word-piece ids
 * (the device ledger's memo key is made from them), its payload JSON and its cost; the raw
 * text never leaves the page (a Worker is part of it).
 */

import type { EdgeBundle } from "../bundle/bundle.js";
import type { BundleCache, ModelInfo, PrivbertClient, ProgressCallback } from "../service/client.js";
import type { Cost } from "../ledger/ledger.js";
import { loadOrt } from "../runtime/ort.js";
import type { AnyGuarantee } from "../ledger/accounting.js";
import { Privatizer, type PrivatizerOptions } from "../mechanisms/privatizer.js";
import { predictMaxLength, usesEncoder } from "../mechanisms/specs.js";
import type { TokenizedText } from "../mechanisms/tokens.js";
import type { BitSource } from "../random/random.js";
import { warmUpQuietly } from "../runtime/warm_up.js";
import type { TextFloorCache } from "../floor/text_floor_cache.js";
import type { Trust } from "../bundle/trust.js";
import type { TextMeasure } from "../floor/text_floor.js";

/** What the session needs to know of the privatizer and its bundle. */
export interface EngineInfo {
  name: string;
  params: Record<string, number | string>;
  bundleId: string;
  /** the privatization table's dimension (the noise's n) */
  dim: number;
  /** the privatization table's name (shared.table: "none", "pca32-int8", ...) */
  table: string;
  vocabSize: number;
  /** the model's length limit in word pieces, [CLS]/[SEP] included */
  maxLength: number;
  truncate: "first" | "error";
  /** D = 2 max‖φ‖ over the regular tokens (ledger.diameter) */
  diameter: number;
  /** the bundle was downloaded (false: from the cache) */
  fetched: boolean;
  /** a sentence-vector mechanism's worst-case ε of one payload (null for a token mechanism) */
  vectorEpsilon: number | null;
  /** the published and worst-case guarantee (shared.accounting.guarantee) */
  guarantee: AnyGuarantee;
  /** known, trusted or unverified (issue 42) */
  trust: Trust;
  /** an unverified bundle's text floor: what was measured (or kept, signed), else null */
  textFloor: { measure: TextMeasure; cached: boolean } | null;
}

/** Texts privatized: per text its tokenized form, payload JSON and cost (not yet charged). */
export interface EngineOutput {
  items: TokenizedText[];
  payloads: string[];
  costs: Cost[];
}

export interface Engine {
  readonly info: EngineInfo;
  privatize(texts: string[], source?: BitSource | null): Promise<EngineOutput>;
  /** the text of privatized token ids (payloads of substituted tokens), one string per list */
  decode(ids: number[][]): Promise<string[]>;
  close(): Promise<void>;
}

/** The privatizer options that travel to a Worker (no objects, no functions), with the served
 * model's description its payloads are for (its ``max_length``: the predict length policy,
 * applied once the bundle is known: {@link predictMaxLength}). */
export type PlainPrivatizerOptions = Omit<PrivatizerOptions, "floorSource" | "textFloorCache"> & {
  served?: Pick<ModelInfo, "max_length"> | null;
};

/** Open the model's bundle (cache, or download and verify) and a privatizer on it. */
export async function openLocal(client: PrivbertClient, bundleId: string, options: PlainPrivatizerOptions & {
  bundleCache: BundleCache | null; floorSource?: BitSource | null; onProgress?: ProgressCallback | null;
  textFloorCache?: TextFloorCache | null;
}): Promise<LocalEngine> {
  // onnxruntime-web starts while the bundle downloads, where the bundle needs it (an encoder
  // mechanism or a search asked to run on it: at once; a search over a large table: once bundle.json, the tarball's first
  // file, says so); a compact table's search is plain JS and fetches no WebAssembly. A
  // WebAssembly that cannot be loaded fails the session here (Privatizer.create), with its URL.
  const threads = options.threads ?? 1;
  const onOrt = options.backend === "int8" || options.backend === "ort";
  const early = usesEncoder(options.mechanism) || onOrt ? loadOrt(threads) : null;
  const onProgress = options.onProgress ?? null;
  const [{ bundle, fetched }] = await Promise.all([
    client.bundle(bundleId, options.bundleCache, (p) => {
      if (p.shape && (options.backend ?? "auto") === "auto") {
        warmUpQuietly({ threads, shape: p.shape, mechanism: options.mechanism });
      }
      onProgress?.(p);
    }),
    early,
  ]);
  options.onProgress?.({ phase: "prepare", loaded: 0, total: null });
  const { bundleCache: _b, onProgress: _p, served, ...rest } = options;
  const maxLength = predictMaxLength(rest.mechanism, rest.maxLength ?? null, bundle.maxLength, served ?? null);
  const privatizer = await Privatizer.create(bundle, { ...rest, maxLength });
  return new LocalEngine(bundle, privatizer, fetched);
}

/** The engine in this thread. */
export class LocalEngine implements Engine {
  readonly info: EngineInfo;

  constructor(readonly bundle: EdgeBundle, readonly privatizer: Privatizer, fetched: boolean) {
    const p = privatizer;
    this.info = { name: p.name, params: p.params, bundleId: bundle.bundleId, dim: bundle.tableDim,
      table: bundle.tableName,
      vocabSize: bundle.vocabSize, maxLength: p.maxLength, truncate: p.truncate,
      diameter: bundle.diameter, fetched,
      vectorEpsilon: p.isVector ? p.cost({ idsA: [], idsB: null, nBefore: 0 }).epsilon : null,
      guarantee: p.guarantee(),
      trust: p.trust,
      textFloor: p.textFloor === null ? null : { measure: p.textFloor.measure, cached: p.textFloor.cached } };
  }

  async privatize(texts: string[], source?: BitSource | null): Promise<EngineOutput> {
    const p = this.privatizer;
    const items = p.tokenize(texts) as TokenizedText[];
    const data = await p.privatizeData(items, source);
    return { items, payloads: p.payloads(items, data), costs: items.map((it) => p.cost(it)) };
  }

  async decode(ids: number[][]): Promise<string[]> {
    return ids.map((x) => this.privatizer.tokenizer.decode(x));
  }

  async close(): Promise<void> {
    await this.privatizer.release();
  }
}
