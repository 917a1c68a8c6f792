/**
 * The page's use of `@privbert/edge`: one served dχ-text model, its bundle checked against
 * the one this browser first accepted for the model (pins in IndexedDB: a server that swaps
 * it is refused before it is fetched, unless the page is opened with ?accept-bundle=ID),
 * fetched from the service, verified (SHA-256 of every file and the bundle id, Web Crypto) and
 * cached (Cache API), a privatizer per η (each checked against the privacy floor first,
 * measured afresh), and the device ledger in IndexedDB. Nothing here privatizes, verifies, encodes or counts by itself: it
 * calls the library in the order the Python edge does, and turns its errors into one line a
 * person can act on.
 */

import {
  ApiError, BudgetRefused, BundleChanged, BundleError, CacheApiBundleCache, CryptoSource, DChiText,
  IndexedDbLedgerStore, IndexedDbPinStore, IndexedDbTextFloorCache, Ledger, PrivbertClient, Privatizer, TextError,
  WeakPrivacyError, trust, trustNote,
  parseIds, pinnedBundle, predictMaxLength, UPGRADE_WORK, warmUp, type BundleCache, type EdgeBundle, type Guarantee, type ModelInfo, type PinStore,
  type ProgressCallback, type Status, type TokenizedText,
} from "@privbert/edge";

/** Regular tokens the inversion rate is measured on (its standard error is at most 3.1%). */
export const INVERSION_TOKENS = 256;
const INVERSION_BATCH = 32;

/** The device ledger. */
const LEDGER = new IndexedDbLedgerStore();
/** An unverified bundle's passed text floor, signed with a non-extractable key of the device. */
const TEXT_FLOOR_CACHE = new IndexedDbTextFloorCache();
/** The bundle pins: storage the page may not use means no pin can be checked, and then
 * nothing is privatized (a swapped bundle would go unseen). */
const PINS = new IndexedDbPinStore();
const STRICT_PINS: PinStore = {
  where: PINS.where,
  get: (key) => PINS.get(key).catch((err: unknown) => {
    throw new Error(`the device's storage (IndexedDB) cannot be used (${(err as Error).message}): the bundle pins `
      + "and the privacy ledger need it, so this page privatizes nothing: nothing was sent");
  }),
  put: (key, id) => PINS.put(key, id),
};
// both databases are opened now (a fresh profile creates them), while the bundle downloads;
// a failure shows where they are used
void PINS.get("").catch(() => undefined);
void LEDGER.read().catch(() => undefined);
/** Bundle ids the person accepts in place of the pinned one: ?accept-bundle=ID (explicit). */
const ACCEPT = (() => {
  try {
    return parseIds(new URLSearchParams(location.search).getAll("accept-bundle"), "?accept-bundle");
  } catch {
    return new Set<string>();
  }
})();

/** Bundle ids the person trusts as they are, beside the ones privbert builds from public
 * sources: ?trusted-bundles=ID[,ID] (explicit; any other bundle is unverified: the text floor). */
const TRUSTED = (() => {
  try {
    return parseIds(new URLSearchParams(location.search).getAll("trusted-bundles").join(","), "?trusted-bundles");
  } catch {
    return new Set<string>();
  }
})();

const BUNDLES = new CacheApiBundleCache();
const OPTIONAL_BUNDLE_CACHE: BundleCache = {
  get: (id) => BUNDLES.get(id).catch(() => null),
  // stored in the background once the page is ready (copying 50 MB into the Cache API costs
  // the main thread time the first privatization needs): the page does not wait for it
  put: (id, tar) => {
    void ready.then(() => BUNDLES.put(id, tar)).catch(() => undefined);
    return Promise.resolve();
  },
};
let pageReady: () => void = () => undefined;
/** Resolved when the first model's privatizer is ready (or opening it failed). */
const ready = new Promise<void>((resolve) => {
  pageReady = resolve;
});

/** WebAssembly threads for the nearest-token search: more than one needs cross-origin
 * isolation (cloud-api serve sends COOP/COEP with /demo). */
const THREADS = threadsFor(new URLSearchParams(location.search).get("threads"));

// onnxruntime-web's WebAssembly is fetched, compiled and started before the first privatization
// only where the bundle needs it (a vocabulary-sized 384-d table: as soon as the download's first
// file, bundle.json, says so, while the rest downloads); a compact table's search is plain JS,
// and the page fetches it only after the first privatization is shown, for the later ones (the
// search then switches to onnxruntime-web's int8 pass: the same tokens, about 6x less CPU)

/** ``?threads=N`` (benchmarks) or up to 4 when isolated; 1 without cross-origin isolation. */
function threadsFor(asked: string | null): number {
  if (!globalThis.crossOriginIsolated) return 1;
  const n = Number(asked);
  return Number.isInteger(n) && n >= 1 ? Math.min(n, 16) : Math.min(4, navigator.hardwareConcurrency || 1);
}

export interface Privatized {
  eta: number;
  item: TokenizedText;
  /** the word pieces typed, and the privatized ones (as the vocabulary spells them) */
  typed: string[];
  tokens: string[];
  /** the word-piece ids typed, and the privatized ones */
  ids: number[];
  outIds: number[];
  /** per token: the noise left it unchanged in this draw */
  unchanged: boolean[];
  /** per token: a public word of the model's token policy (sent as typed with probability
   * 1 − p); all false without a policy */
  public: boolean[];
  /** the payload JSON, once the privacy floor has passed at this η (WeakPrivacyError if not):
   * nothing is sent before it */
  payload: () => Promise<string>;
  /** tokenize, noise and exact nearest token, in this page */
  ms: number;
  /** the printed guarantee of these parameters (under a token policy it says what it covers) */
  guarantee: Guarantee;
}

/** What happened to one word piece (judged by rank among the typed one's neighbours); "public":
 * a word of the model's public list sent as typed (SanText+'s rule: no noise, no guarantee). */
export type TokenKind = "public" | "typed" | "near" | "far";

/** A replacement among this many nearest word pieces of the typed one (in the privatization
 * table the noise is added in) counts as a near word; any other as an unrelated word. */
export const NEAR_RANK = 10;

export interface Answer {
  /** what left the device: the fresh payload, or the stored one of a memoized repeat */
  payloadJson: string;
  repeat: boolean;
  prediction: { label: string; scores: Record<string, number> };
  modelId: string;
}

/** One line for a person: what went wrong, and that nothing was sent where that holds. */
export function explain(err: unknown): string {
  if (err instanceof TextError) return `the text ${err.detail}: nothing was sent`;
  if (err instanceof BundleChanged) {
    return `${err.message.replace(/ \(accept it with .*\)$/, "")}: the bundle was refused and `
      + "nothing was sent (to accept the new one, open this page with ?accept-bundle=<its id>)";
  }
  if (err instanceof WeakPrivacyError) return `${err.message}: nothing was sent`;
  if (err instanceof BudgetRefused) return err.message.includes("nothing was sent") ? err.message : `${err.message}: nothing was sent`;
  if (err instanceof BundleError) return `${err.message}: the bundle was refused and nothing was sent`;
  if (err instanceof ApiError && err.status === null) return `the service cannot be reached: ${err.message}`;
  return err instanceof Error ? err.message : String(err);
}

export class Edge {
  private readonly privatizers = new Map<number, Promise<Privatizer>>();
  private runtimeAsked = false;
  private vocabulary: string[] | null = null;
  /** how long opening took: the bundle (fetched and verified, or from the cache), the rest */
  phases: Record<string, number | boolean> = {};

  private constructor(readonly client: PrivbertClient, readonly model: ModelInfo, readonly bundle: EdgeBundle,
                      readonly ledger: Ledger, readonly diameter: number, readonly maxLength: number) {}

  /** Each word piece's spelling by id (read from the tokenizer's JSON once: off the way to the
   * page being ready, on the first use or once the page is idle). */
  private get vocab(): string[] {
    if (this.vocabulary === null) {
      const v = (JSON.parse(this.bundle.tokenizerJson) as { model: { vocab: Record<string, number> } }).model.vocab;
      this.vocabulary = [];
      for (const [tok, id] of Object.entries(v)) this.vocabulary[id] = tok;
    }
    return this.vocabulary;
  }

  static client(apiKey: string | null): PrivbertClient {
    // one retry: a page should say "unreachable" in seconds, not after a CLI's back-off
    return new PrivbertClient(location.origin, { apiKey, retries: 1, backoff: 0.2, timeout: 30 });
  }

  /** The model's bundle (verified, cached) and the privatizer at the model's η. */
  static async open(client: PrivbertClient, model: ModelInfo, onProgress?: ProgressCallback): Promise<Edge> {
    const t0 = performance.now();
    // the pin first (before a byte of a changed bundle is fetched), recorded once verified
    const progress: ProgressCallback = (p) => {
      if (p.shape) warmUp({ threads: THREADS, shape: p.shape, mechanism: "dchi-text" }).catch(() => undefined);
      onProgress?.(p);
    };
    const { bundle, fetched } = await pinnedBundle(client, location.origin, model, OPTIONAL_BUNDLE_CACHE, STRICT_PINS,
      { accept: ACCEPT }, progress);
    onProgress?.({ phase: "prepare", loaded: 0, total: null });
    const t1 = performance.now();
    // the predict length policy (the library's one): the model's limit within the bundle's
    const limit = predictMaxLength(model.mechanism, null, bundle.maxLength, model) ?? bundle.maxLength;
    const ledger = new Ledger(LEDGER);
    const edge = new Edge(client, model, bundle, ledger, bundle.diameter, limit); // shared.accounting.bundle_diameter: of the privatization table
    const t2 = performance.now();
    // ready to privatize in the page as soon as the search is built; the privacy floor is
    // measured meanwhile (Privatizer.open), and nothing is sent before it passes
    const first = await edge.privatizer(Number(model.params.eta)).catch((err: unknown) => {
      setTimeout(pageReady, 1000);
      throw err;
    });
    void first.floorChecked.catch(() => undefined).finally(() => setTimeout(pageReady, 1000));
    setTimeout(() => void edge.vocab, 0);
    edge.phases = { bundleMs: t1 - t0, fetched, setupMs: t2 - t1, privatizerMs: performance.now() - t2,
      threads: THREADS };
    return edge;
  }

  /** What the page knows of the bundle, for the guarantee: known (built by privbert from
   * public sources) or unverified (checked by the floors only). */
  get trustNote(): string {
    return trustNote(trust(this.bundle.bundleId, TRUSTED), "?trusted-bundles");
  }

  /** The dimension of the privatization table (the noise's: k for a designed table). */
  get dim(): number {
    return this.bundle.tableDim;
  }

  get vocabSize(): number {
    return this.bundle.vocabSize;
  }

  /** The privatizer at ``eta`` (WeakPrivacyError past the floor); the model's η and the
   * last other η explored are kept (each holds a search over the whole table). */
  privatizer(eta: number): Promise<Privatizer> {
    let p = this.privatizers.get(eta);
    if (!p) {
      const keep = Number(this.model.params.eta);
      for (const [old, q] of this.privatizers) {
        if (old === keep) continue;
        this.privatizers.delete(old);
        void q.then((x) => x.release()).catch(() => undefined);
      }
      p = Privatizer.open(this.bundle, {
        mechanism: "dchi-text", params: this.params(eta), maxLength: this.maxLength, truncate: "error",
        threads: THREADS,
        // an unverified bundle's passed text floor, kept signed by this device (issue 42)
        textFloorCache: TEXT_FLOOR_CACHE, trustedBundles: [...TRUSTED], trustHow: "?trusted-bundles=ID",
      });
      this.privatizers.set(eta, p);
      p.catch(() => this.privatizers.delete(eta));
      // a privatizer the floor refuses is dropped (the next try measures afresh)
      const made = p;
      void made.then((x) => x.floorChecked.catch(() => {
        if (this.privatizers.get(eta) === made) this.privatizers.delete(eta);
        void x.release();
      }), () => undefined);
    }
    return p;
  }

  /** The model's parameters at ``eta``: its token policy's public_p too, when it has one (a
   * payload without it would be refused by the model, and with it the public words go as typed). */
  params(eta: number): Record<string, number> {
    const pub = this.model.params.public_p;
    return typeof pub === "number" ? { eta, public_p: pub } : { eta };
  }

  /** The model's token policy: p, and how many words its public list holds; null without one. */
  get policy(): { p: number; words: number; name: string } | null {
    const pub = this.model.params.public_p;
    const pol = this.bundle.policy;
    return typeof pub === "number" && pol ? { p: pub, words: pol.size, name: pol.name } : null;
  }

  /** Settles with the privacy floor's check at ``eta`` (WeakPrivacyError past the floor). */
  async floorChecked(eta: number): Promise<void> {
    await (await this.privatizer(eta)).floorChecked;
  }

  /** Privatize ``text`` at ``eta`` in the page; nothing is charged or sent (its payload is
   * made once the privacy floor has passed). */
  async privatize(text: string, eta: number): Promise<Privatized> {
    if (!(eta > 0) || !Number.isFinite(eta)) throw new RangeError(`η must be a positive number, got ${eta}: nothing was sent`);
    const priv = await this.privatizer(eta);
    const t0 = performance.now();
    const [item] = priv.tokenize([text]) as TokenizedText[];
    const data = await priv.privatizeData([item!]) as Int32Array;
    const ms = performance.now() - t0;
    let made: Promise<string> | null = null;
    const payload = (): Promise<string> => (made ??= priv.floorChecked.then(() => priv.payloads([item!], data)[0]!));
    const ids = [...item!.idsA, ...(item!.idsB ?? [])];
    const pub = priv.policy?.publicMask(ids) ?? new Uint8Array(ids.length);  // truncate "error": no cut
    // after this one is painted; where the search would switch (a table of no more work keeps
    // the loop, and the page fetches no WebAssembly)
    if (!this.runtimeAsked && this.bundle.regularIds.length * this.dim >= UPGRADE_WORK) {
      this.runtimeAsked = true;
      // a WebAssembly that cannot be loaded leaves the page on the plain JS search
      setTimeout(() => {
        warmUp({ threads: THREADS, dim: this.dim }).catch((err: unknown) => console.warn(String(err)));
      }, 0);
    }
    return { eta, item: item!, payload, ms, ids, guarantee: priv.guarantee() as Guarantee, outIds: Array.from(data),
      typed: ids.map((id) => this.vocab[id] ?? `[${id}]`),
      tokens: Array.from(data, (id) => this.vocab[id] ?? `[${id}]`),
      unchanged: Array.from(data, (id, i) => id === ids[i]), public: Array.from(pub, (x) => x === 1) };
  }

  /**
   * What happened to each word piece: sent as typed, replaced by a near word (one of the
   * {@link NEAR_RANK} regular word pieces nearest to the typed one in the privatization table),
   * or replaced by an unrelated word; with the replacement's rank among the typed one's
   * neighbours (1: the nearest other word piece).
   */
  tokenKinds(p: Privatized): { kind: TokenKind; rank: number }[] {
    const n = this.dim;
    const table = this.bundle.table;
    const reg = this.bundle.regularIds;
    return p.ids.map((x, i) => {
      const y = p.outIds[i]!;
      if (y === x) return { kind: p.public[i] ? "public" : "typed", rank: 0 };
      const d2 = (a: number): number => {
        let s = 0;
        for (let k = 0; k < n; k++) {
          const d = table[a * n + k]! - table[x * n + k]!;
          s += d * d;
        }
        return s;
      };
      const dy = d2(y);
      let rank = 1;
      for (const j of reg) if (j !== x && j !== y && d2(j) < dy) rank++;
      return { kind: rank <= NEAR_RANK ? "near" : "far", rank };
    });
  }

  /** The privatized token ids of a payload (a memoized repeat sends a stored one). */
  idsOf(payloadJson: string): number[] {
    const b64 = (JSON.parse(payloadJson) as { token_ids: { data: string } }).token_ids.data;
    const bin = atob(b64);
    const out: number[] = [];
    for (let i = 0; i < bin.length; i += 4) {
      out.push(bin.charCodeAt(i) | (bin.charCodeAt(i + 1) << 8) | (bin.charCodeAt(i + 2) << 16) | (bin.charCodeAt(i + 3) << 24));
    }
    return out;
  }

  /** ``p`` as a stored payload sent it (a memoized repeat: the tokens of the first send). */
  asSent(p: Privatized, payloadJson: string): Privatized {
    const outIds = this.idsOf(payloadJson);
    return { ...p, outIds, tokens: outIds.map((id) => this.vocab[id] ?? `[${id}]`),
      unchanged: outIds.map((id, i) => id === p.ids[i]) };
  }

  /**
   * Charge the ledger (committed, or BudgetRefused and nothing sent), then send what it says:
   * the fresh payload, or the stored payload of a memoized repeat at no cost.
   */
  async send(p: Privatized): Promise<Answer> {
    const fresh = await p.payload();  // the floor passed: nothing before it is sent
    const priv = await this.privatizer(p.eta);
    const keys = await this.ledger.memoKeys({ mechanism: priv.name, params: priv.params,
      bundle_id: this.bundle.bundleId });
    const memo = await keys.keyOf(p.item.idsA, p.item.idsB);
    const cost = priv.cost(p.item);  // under a token policy: its public words counted, not charged
    const charged = await this.ledger.charge([cost], [fresh], [memo],
      { mechanism: priv.name, params: priv.params, bundleId: this.bundle.bundleId }, "this sentence");
    const payloadJson = charged.payloads[0]!;
    const [prediction] = await this.client.predict(this.model.id, [payloadJson]);
    return { payloadJson, repeat: charged.cost === null, prediction: prediction!, modelId: this.model.id };
  }

  /** Release every search this page built (another model was chosen). */
  async close(): Promise<void> {
    const all = [...this.privatizers.values()];
    this.privatizers.clear();
    await Promise.all(all.map((p) => p.then((x) => x.release()).catch(() => undefined)));
  }

  async ledgerStatus(): Promise<Status> {
    try {
      return await this.ledger.status();
    } catch (err) {
      throw new BudgetRefused(`the device ledger (IndexedDB) cannot be read (${(err as Error).message}): `
        + "nothing will be sent from this page");
    }
  }

  async setCap(cap: number | null): Promise<void> {
    if (cap !== null && !(cap >= 0 && Number.isFinite(cap))) throw new RangeError(`the cap must be a number >= 0, got ${cap}`);
    await this.ledger.setCap("cap", cap);
  }

  /**
   * The inversion rate at ``eta`` (Qu et al. §5.4): the share of ``tokens`` regular tokens,
   * drawn uniformly with OS entropy, that the mechanism returns unchanged; ± its standard error.
   */
  async inversionRate(eta: number, tokens = INVERSION_TOKENS): Promise<{ rate: number; se: number; tokens: number }> {
    const priv = await this.privatizer(eta);
    const reg = this.bundle.regularIds;
    const src = new CryptoSource();
    const ids = Int32Array.from({ length: tokens }, () => reg[Math.floor(src.nextDouble() * reg.length)]!);
    // in small batches, yielding between them: the page stays responsive while it measures
    const out = new Int32Array(tokens);
    for (let s0 = 0; s0 < tokens; s0 += INVERSION_BATCH) {
      await new Promise((resolve) => setTimeout(resolve, 0));
      out.set(await (priv.mechanism as DChiText).privatizeIds(ids.subarray(s0, s0 + INVERSION_BATCH)), s0);
    }
    let same = 0;
    for (let i = 0; i < tokens; i++) if (out[i] === ids[i]) same++;
    const rate = same / tokens;
    return { rate, se: Math.sqrt((rate * (1 - rate)) / tokens), tokens };
  }
}
