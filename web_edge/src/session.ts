/**
 * A privatizing session against one served model, for a page or a script: the model's bundle
 * checked against this device's pin (./pins.ts), fetched and verified (and cached), the
 * privatizer at the model's η (checked against the privacy floor, measured afresh), the device
 * ledger, and one call that privatizes, charges (before anything is sent) and predicts.
 *
 *     const s = await EdgeSession.open({ server: "https://api.example", apiKey, eta: 65 });
 *     const r = await s.predict("a sentence");   // r.sent: the only thing that left the device
 */

import { guarantee, type Guarantee } from "./accounting.js";
import type { EdgeBundle } from "./bundle.js";
import { PrivbertClient, type BundleCache, type ModelInfo } from "./client.js";
import { TextError } from "./errors.js";
import { IndexedDbPinStore } from "./browser_stores.js";
import { Ledger, MemoryLedgerStore, type Cost, type LedgerStore, type Status } from "./ledger.js";
import { Privatizer, nTokens, type TokenizedText } from "./privatizer.js";
import { MemoryPinStore, parseIds, pinnedBundle, type PinStore } from "./pins.js";
import type { BitSource } from "./random.js";

export interface SessionOptions {
  server: string;
  apiKey?: string | null;
  /** the served model (default: the only one) */
  model?: string | null;
  /** default: the model's η */
  eta?: number;
  /** default: the model's */
  mechanism?: string;
  ledger?: LedgerStore;
  bundleCache?: BundleCache | null;
  /** the bundle pins (default: IndexedDB where the page has it, else this process's memory) */
  pins?: PinStore | null;
  /** bundle ids the user accepts for the model in place of the one this device pinned */
  acceptBundle?: string | readonly string[] | null;
  /** if any: the only bundle ids this app uses (any other is refused) */
  trustedBundles?: string | readonly string[] | null;
  /** what the privacy floor's check draws from: OS entropy unless given (tests only) */
  floorSource?: BitSource | null;
  /** WebAssembly threads of the nearest-token search */
  threads?: number;
  allowWeakPrivacy?: boolean;
}

/** What one privatization sent and cost. */
export interface Sent {
  /** the payload JSON that left the device */
  payload: string;
  /** the privatized tokens (dchi-text), as text */
  privatizedText: string | null;
  tokens: number;
  /** null: a memoized repeat (the stored payload, at no cost) */
  cost: Cost | null;
}

export class EdgeSession {
  private constructor(readonly client: PrivbertClient, readonly model: ModelInfo,
                      readonly bundle: EdgeBundle, readonly privatizer: Privatizer,
                      readonly ledger: Ledger, readonly diameter: number) {}

  static async open(o: SessionOptions): Promise<EdgeSession> {
    const client = new PrivbertClient(o.server, { apiKey: o.apiKey ?? null });
    const accept = parseIds(o.acceptBundle, "acceptBundle");
    const trusted = parseIds(o.trustedBundles, "trustedBundles");
    const model = await client.model(o.model ?? null);
    const pins = o.pins ?? (globalThis.indexedDB ? new IndexedDbPinStore() : new MemoryPinStore());
    const { bundle } = await pinnedBundle(client, o.server, model, o.bundleCache ?? null, pins, { accept, trusted });
    const mechanism = o.mechanism ?? model.mechanism;
    const token = mechanism === "dchi-text" || mechanism === "dchi-embedding";
    const limit = token && typeof model.max_length === "number" && model.max_length >= 4
      ? Math.min(model.max_length, bundle.maxLength) : null;
    const mp = model.params as Record<string, unknown>;
    const privatizer = await Privatizer.create(bundle, {
      mechanism, eta: o.eta ?? Number(mp.eta), epsilon: Number(mp.epsilon), lam: Number(mp.lam),
      calibration: (mp.calibration as "vector" | "coordinate" | undefined) ?? "vector",
      wordDropout: Number(mp.word_dropout ?? 0), maxLength: limit,
      floorSource: o.floorSource ?? null, threads: o.threads, allowWeakPrivacy: o.allowWeakPrivacy,
    });
    return new EdgeSession(client, model, bundle, privatizer, new Ledger(o.ledger ?? new MemoryLedgerStore()),
      2 * bundle.regularMaxNorm); // ledger.diameter (of the privatization table)
  }

  /** The published and worst-case guarantee (dχ: per token; laplace, ome: per sentence). */
  get guarantee(): Guarantee | { mechanism: string; params: Record<string, number | string>; worst_case: { epsilon: number } } {
    const p = this.privatizer;
    if (p.name === "dchi-text" || p.name === "dchi-embedding") {
      return guarantee(p.name, Number(p.params.eta), this.diameter, this.bundle.tableDim);
    }
    return { mechanism: p.name, params: p.params, worst_case: { epsilon: p.cost({ idsA: [], idsB: null, nBefore: 0 }).epsilon! } };
  }

  /** Privatize ``texts`` and charge the ledger (BudgetRefused before anything is sent). */
  async privatize(texts: string[], source?: BitSource | null): Promise<Sent[]> {
    const items = this.privatizer.tokenize(texts) as TokenizedText[];
    const data = await this.privatizer.privatizeData(items, source);
    const fresh = this.privatizer.payloads(items, data);
    const p = this.privatizer;
    const keys = await this.ledger.memoKeys({ mechanism: p.name, params: p.params, bundle_id: this.bundle.bundleId });
    const memo = await Promise.all(items.map((it) => keys.keyOf(it.idsA, it.idsB)));
    const costs = items.map((it) => p.cost(it));
    const charged = await this.ledger.charge(costs, fresh, memo,
      { mechanism: p.name, params: p.params, bundleId: this.bundle.bundleId });
    const seen = new Set<string>();
    return charged.payloads.map((payload, i) => {
      const first = payload === fresh[i] && !seen.has(memo[i]!);
      seen.add(memo[i]!);
      let text: string | null = null;
      if (p.name === "dchi-text") {
        const ids = JSON.parse(payload).token_ids.data as string;
        text = p.tokenizer.decode(decodeIds(ids));
      }
      return { payload, privatizedText: text, tokens: nTokens(items[i]!), cost: first ? costs[i]! : null };
    });
  }

  /** Privatize, charge, then ask the model: the prediction for each text. */
  async predict(texts: string[], source?: BitSource | null): Promise<{ sent: Sent[]; predictions: { label: string; scores: Record<string, number> }[] }> {
    if (texts.some((t) => t.trim() === "")) throw new TextError(texts.findIndex((t) => t.trim() === ""), "empty", "has no tokens");
    const sent = await this.privatize(texts, source);
    const predictions = await this.client.predict(this.model.id, sent.map((s) => s.payload));
    return { sent, predictions };
  }

  async status(): Promise<Status> {
    return this.ledger.status();
  }

  async close(): Promise<void> {
    await this.privatizer.release();
  }
}

function decodeIds(b64: string): number[] {
  const bin = atob(b64);
  const out: number[] = [];
  for (let i = 0; i < bin.length; i += 4) {
    out.push((bin.charCodeAt(i) | (bin.charCodeAt(i + 1) << 8) | (bin.charCodeAt(i + 2) << 16) | (bin.charCodeAt(i + 3) << 24)) >>> 0);
  }
  return out;
}
