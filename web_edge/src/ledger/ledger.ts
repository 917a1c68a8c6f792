/**
 * The device's privacy budget ledger: the cost functions of shared/ledger.py and a ledger over
 * a small storage interface ({@link LedgerStore}: IndexedDB in a page, a file in Node, memory
 * in tests).
 *
 * Costs (sequential composition, Dwork & Roth 2014 Thm 3.16; for metric DP η1·d then η2·d is
 * (η1+η2)·d, Chatzikokolakis et al. 2013): a dχ payload of n tokens costs the metric total η·n,
 * and the worst-case ε = η·n·D with D = 2 max‖φ‖ over the bundle's regular table. The filter
 * (Rogers et al. 2016): spent S, cap C, a cost c is admitted iff S + c ≤ C.
 *
 * A charge is one transaction of the store, committed before the caller writes or sends
 * anything: a ledger that cannot be written refuses (nothing is sent uncharged).
 *
 * The per-day window reads the ledger's time, not the wall clock ({@link ledgerTime}, the rule of
 * edge_agent/budget/clock.py): the latest time the ledger has seen plus what a monotonic clock
 * ({@link MonotonicClock}: performance.now in a page, the boot clock or process.hrtime in Node)
 * says has passed since, so a wall clock moved by hand neither buys budget nor refuses a run. Memoized
 * repeats (RAPPOR's lesson, Erlingsson et al. 2014 §3) are free: the key of an item is
 * HMAC-SHA-256 of its token ids after the tokenizer's normalization and the length policy,
 * under a random per-ledger key, with the mechanism, parameters and bundle; the memo keeps
 * that key and the payload sent, never the text.
 */

import { BudgetRefused } from "../errors.js";
import { fmtG, message } from "../format/messages.js";
import { DEVICE, FAMILIES as SPEC_FAMILIES, MECHANISMS as MECHANISM_SPECS, type FamilyName } from "../generated/spec.js";
import { pyDumps, type PyValue } from "../format/pyjson.js";
import { fsum } from "./exact.js";

export { diameter, fsum } from "./exact.js";

// the budget families, each mechanism's and the memo rule are shared.ledger's, read from the
// mechanism spec (shared/spec)
export type Family = FamilyName;
export const FAMILIES: readonly Family[] = SPEC_FAMILIES.map((f) => f.name);
const FAMILY_OF: Readonly<Record<string, Family>> = Object.fromEntries(MECHANISM_SPECS.map((m) => [m.name, m.family]));
/** families without a differential-privacy ε (their spend has none) */
const NO_EPSILON: readonly Family[] = SPEC_FAMILIES.filter((f) => !f.epsilon).map((f) => f.name);
/** metric families (dχ: a cost of η·n, the worst case η·n·D) */
const METRIC: readonly Family[] = SPEC_FAMILIES.filter((f) => f.metric).map((f) => f.name);
/** families whose repeats are memoized (free) */
export const MEMO_FAMILIES: readonly Family[] = SPEC_FAMILIES.filter((f) => f.memo).map((f) => f.name);
/** The per-day cap's window (shared.conventions.DAY_S), in ms. */
export const DAY_MS = DEVICE.ledger.day_s * 1000;
/** Epochs of the monotonic clock whose anchors a ledger keeps (the most recent). */
export const MAX_ANCHORS: number = DEVICE.ledger.max_anchors;
const EPS = DEVICE.eps_format;

/** The cost of one payload, or of several added up. ``tokens``: the dχ tokens charged;
 * ``public``: the dχ tokens sent under a token policy (public words: counted, no guarantee, not
 * charged; absent: none). */
export interface Cost {
  family: Family;
  epsilon: number | null;
  metric: number;
  tokens: number;
  sends: number;
  eta: number | null;
  public?: number;
}

export function familyOf(mechanism: string): Family {
  const f = FAMILY_OF[mechanism];
  if (f === undefined) throw new RangeError(`no budget family for mechanism ${JSON.stringify(mechanism)}`);
  return f;
}

function checkAmount(name: string, v: number): number {
  if (typeof v !== "number" || Number.isNaN(v)) throw new RangeError(`${name} must be a number, got ${v}`);
  if (!Number.isFinite(v)) throw new RangeError(`${name} must be finite, got ${v}`);
  if (v < 0) throw new RangeError(`${name} must be >= 0, got ${v}`);
  return v;
}

/** The cost of one dχ payload of ``tokens`` tokens (shared.ledger.cost): under a token policy
 * its ``publicTokens`` public words are counted and not charged, the other n − k are (ε =
 * η·(n − k)·D). */
export function dchiCost(mechanism: string, eta: number, tokens: number, diam: number, publicTokens = 0): Cost {
  const fam = familyOf(mechanism);
  if (!METRIC.includes(fam)) throw new RangeError(`${mechanism} is not a dχ mechanism`);
  checkAmount("eta", eta);
  if (!Number.isInteger(tokens) || tokens < 0) throw new RangeError(`tokens must be an integer >= 0, got ${tokens}`);
  if (!Number.isInteger(publicTokens) || publicTokens < 0) {
    throw new RangeError(`public tokens must be an integer >= 0, got ${publicTokens}`);
  }
  if (publicTokens > tokens) throw new RangeError(`public tokens (${publicTokens}) cannot exceed the tokens (${tokens})`);
  checkAmount("table diameter", diam);
  const m = tokens - publicTokens;
  const eps = eta * m * diam;
  if (!Number.isFinite(eps)) {
    throw new RangeError(message("LEDGER_NOT_FINITE", { mechanism, epsilon: eps }));
  }
  const cost: Cost = { family: fam, epsilon: eps, metric: eta * m, tokens: m, sends: 1, eta };
  if (publicTokens) cost.public = publicTokens;
  return cost;
}

/** The cost of one payload of a mechanism with an ε per payload: ``epsilon`` its worst-case ε
 * (DPNR: the whole vector's; OME: summed over the bits). */
export function epsilonCost(mechanism: string, epsilon: number): Cost {
  if (!Number.isFinite(epsilon) || epsilon < 0) {
    throw new RangeError(message("LEDGER_NOT_FINITE", { mechanism, epsilon: epsilon }));
  }
  return { family: familyOf(mechanism), epsilon, metric: 0, tokens: 0, sends: 1, eta: null };
}

/** Costs of one family added into one (shared.ledger.total); null for none. */
export function total(costs: Cost[]): Cost | null {
  if (costs.length === 0) return null;
  const fams = new Set(costs.map((c) => c.family));
  if (fams.size !== 1) throw new RangeError(`one family per batch, got ${[...fams].sort().join(", ")}`);
  const fam = costs[0]!.family;
  const etas = new Set(costs.map((c) => c.eta));
  const pub = costs.reduce((a, c) => a + (c.public ?? 0), 0);
  return {
    family: fam,
    epsilon: NO_EPSILON.includes(fam) ? null : fsum(costs.map((c) => c.epsilon!)),
    metric: fsum(costs.map((c) => c.metric)),
    tokens: costs.reduce((a, c) => a + c.tokens, 0),
    sends: costs.reduce((a, c) => a + c.sends, 0),
    eta: etas.size === 1 ? [...etas][0]! : null,
    ...(pub ? { public: pub } : {}),
  };
}

/** The privacy filter (shared.ledger.fits). */
export function fits(spent: number, epsilon: number | null, cap: number | null): boolean {
  checkAmount("spent", spent);
  if (epsilon !== null) checkAmount("cost", epsilon);
  if (cap === null) return true;
  checkAmount("cap", cap);
  if (epsilon === null || cap === 0) return false;
  return spent + epsilon <= cap;
}

/** A worst-case ε for a message (shared.conventions.fmt_eps, its rule read from the spec). */
export function fmtEps(eps: number | null): string {
  if (eps === null) return "none";
  if (eps >= EPS.grouped_from && eps < EPS.scientific_from) {
    return eps.toLocaleString("en-US", { minimumFractionDigits: EPS.grouped_decimals,
      maximumFractionDigits: EPS.grouped_decimals });
  }
  return fmtG(eps, EPS.significant);
}

export interface FamilySpend {
  epsilon: number | null;
  metric: number;
  tokens: number;
  sends: number;
  /** dχ: public words sent under a token policy (no guarantee, not charged); absent: none */
  public?: number;
}

export interface ChargeRecord {
  at: number;
  family: Family;
  mechanism: string;
  params: Record<string, number | string>;
  bundle_id: string;
  epsilon: number | null;
  metric: number;
  tokens: number;
  sends: number;
  /** dχ: public words sent under a token policy (absent: none) */
  public?: number;
}

/** The ledger's time and the monotonic clock's reading at the last charge of an epoch (ms). */
export interface Anchor {
  at: number;
  reading: number;
}

/** The ledger's clock: the latest time it has seen (ms, on Date.now's scale) and an anchor per
 * epoch of the monotonic clock. */
export interface ClockState {
  latest: number;
  anchors: Record<string, Anchor>;
}

/** What a ledger holds (no text, no payload but the memoized ones). ``clock`` is absent in a
 * ledger written before it: its latest time is then that of its last charge, with no anchor. */
export interface LedgerState {
  format: "privbert-edge-ledger";
  version: 1;
  cap: number | null;
  per_day: number | null;
  spend: Partial<Record<Family, FamilySpend>>;
  charges: ChargeRecord[];
  /** hex HMAC key of an item -> the payload JSON sent for it */
  memo: Record<string, string>;
  clock?: ClockState;
}

export function emptyState(): LedgerState {
  return { format: "privbert-edge-ledger", version: 1, cap: null, per_day: null, spend: {}, charges: [], memo: {} };
}

/**
 * A monotonic clock for the per-day window: ``read()`` in ms, never going back within ``epoch``
 * (what its readings count from: a boot, a page, a process). ``sinceBoot``: readings count from
 * the boot that ``epoch`` names, so at least ``read()`` ms have passed since anything recorded
 * in another epoch.
 */
export interface MonotonicClock {
  readonly epoch: string;
  readonly sinceBoot: boolean;
  read(): number;
}

function randomHex(bytes: number): string {
  return Array.from(crypto.getRandomValues(new Uint8Array(bytes)), (b) => b.toString(16).padStart(2, "0")).join("");
}

let pageClockOnce: MonotonicClock | null = null;

/** performance.now, one epoch per page (a Node process: one per process): the default clock. */
export function pageClock(): MonotonicClock {
  pageClockOnce ??= { epoch: `page:${randomHex(8)}`, sinceBoot: false, read: () => performance.now() };
  return pageClockOnce;
}

/**
 * The ledger's time now (ms) (edge_agent.budget.clock.ledger_time): in an epoch it has an anchor
 * for, the anchor's time plus what the monotonic clock says has passed since (never before the
 * latest time seen; the wall clock is not read); in an epoch it has not seen (a new page, a
 * reboot), the later of the wall clock and the latest time seen plus what surely passed (the
 * time since boot, for a boot clock, when the ledger's charges were in other epochs).
 */
export function ledgerTime(latest: number | null, anchors: Record<string, Anchor>, epoch: string,
                           reading: number, sinceBoot: boolean, wall: number): number {
  if (latest === null) return wall;
  const a = anchors[epoch];
  if (a !== undefined) return Math.max(latest, a.at + Math.max(0, reading - a.reading));
  const surely = sinceBoot && Object.keys(anchors).length > 0 ? reading : 0;
  return Math.max(latest + surely, wall);
}

/** The clock of a state: its latest time (never before its last charge's, which an older
 * privbert-edge may have written without moving the clock) and its anchors (none in a ledger
 * written before them). */
function clockOf(s: LedgerState): { latest: number | null; anchors: Record<string, Anchor> } {
  const last = s.charges.reduce<number | null>((m, c) => (m === null || c.at > m ? c.at : m), null);
  if (!s.clock) return { latest: last, anchors: {} };
  return { latest: last === null ? s.clock.latest : Math.max(s.clock.latest, last), anchors: s.clock.anchors };
}

/** Where a ledger lives. ``update`` runs ``fn`` on the current state under the store's lock and
 * commits what it returns (null: no change) before it resolves; it rejects when the state cannot
 * be read or written. */
export interface LedgerStore {
  readonly where: string;
  read(): Promise<LedgerState>;
  update<T>(fn: (state: LedgerState) => { state: LedgerState | null; result: T }): Promise<T>;
  /** The ledger's memo key (random, made at first use, never exported). */
  hmacKey(): Promise<CryptoKey>;
}

/** A store in memory (tests, a page that keeps no ledger across visits). */
export class MemoryLedgerStore implements LedgerStore {
  readonly where = "memory";
  private state = emptyState();
  private key: Promise<CryptoKey> | null = null;

  async read(): Promise<LedgerState> {
    return structuredClone(this.state);
  }

  async update<T>(fn: (s: LedgerState) => { state: LedgerState | null; result: T }): Promise<T> {
    const { state, result } = fn(structuredClone(this.state));
    if (state !== null) this.state = state;
    return result;
  }

  hmacKey(): Promise<CryptoKey> {
    this.key ??= newHmacKey();
    return this.key;
  }
}

/** A random HMAC-SHA-256 key (256 bits), not extractable. */
export function newHmacKey(): Promise<CryptoKey> {
  return crypto.subtle.generateKey({ name: "HMAC", hash: "SHA-256", length: 256 }, false, ["sign"]);
}

/** An HMAC-SHA-256 key from 32 raw bytes (a Node ledger's key file). */
export function importHmacKey(raw: Uint8Array): Promise<CryptoKey> {
  return crypto.subtle.importKey("raw", raw as Uint8Array<ArrayBuffer>, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
}

/**
 * What a memo key is bound to besides the ids: mechanism, parameters and bundle. The rule of
 * the Python edge (edge_agent/budget/memo.py): the key is of what is sent, the token ids after the
 * tokenizer's normalization and the length policy, so spellings that tokenize alike share one
 * stored payload; the float dtype, the length limit and the truncation policy are not part of
 * it (a different --max-length must not buy a fresh draw of the same ids).
 */
export interface MemoSetting {
  mechanism: string;
  params: Record<string, number | string>;
  bundle_id: string;
}

/** HMAC keys of tokenized items under one setting. */
export class MemoKeys {
  private readonly prefix: Uint8Array;

  constructor(private readonly key: CryptoKey, setting: MemoSetting) {
    const p = { mechanism: setting.mechanism, params: Object.fromEntries(Object.entries(setting.params)),
      bundle_id: setting.bundle_id } as unknown as PyValue;
    this.prefix = new TextEncoder().encode(pyDumps(p));
  }

  /** The key of an item: its (kept) ids, and the second segment's for a pair (null: none). */
  async keyOf(idsA: ArrayLike<number>, idsB: ArrayLike<number> | null): Promise<string> {
    const parts: number[] = [];
    const u64 = (n: number): void => {
      for (let k = 0; k < 8; k++) parts.push(Math.floor(n / 2 ** (8 * k)) & 255);
    };
    u64(this.prefix.length);
    parts.push(...this.prefix);
    for (const seg of [idsA, idsB]) {
      if (seg === null) {
        parts.push(0xff);
        continue;
      }
      parts.push(0);
      u64(seg.length * 4);
      for (let i = 0; i < seg.length; i++) {
        const v = seg[i]! >>> 0;
        parts.push(v & 255, (v >>> 8) & 255, (v >>> 16) & 255, v >>> 24);
      }
    }
    const mac = new Uint8Array(await crypto.subtle.sign("HMAC", this.key, Uint8Array.from(parts)));
    return Array.from(mac, (b) => b.toString(16).padStart(2, "0")).join("");
  }
}

export interface Status {
  where: string;
  cap: number | null;
  perDay: number | null;
  spent: number;
  daySpent: number;
  families: Partial<Record<Family, FamilySpend>>;
  memoized: number;
  sends: number;
}

function status(where: string, s: LedgerState, now: number): Status {
  const fams = s.spend;
  const spent = fsum(Object.values(fams).map((f) => f.epsilon ?? 0));
  const daySpent = s.per_day === null ? 0
    : fsum(s.charges.filter((c) => c.at > now - DAY_MS).map((c) => c.epsilon ?? 0));
  return { where, cap: s.cap, perDay: s.per_day, spent, daySpent, families: fams,
    memoized: Object.keys(s.memo).length, sends: Object.values(fams).reduce((a, f) => a + f.sends, 0) };
}

/** What to send for a charged batch: stored payloads for memoized items. */
export interface Charged {
  payloads: string[];
  cost: Cost | null;
  memoized: number;
}

const TOOL = "privbert-edge budget";

/** The ledger: check, charge, cap. ``clock``: the per-day window's monotonic clock (default
 * {@link pageClock}; the Node CLI passes the boot clock, node/clock.ts). */
export class Ledger {
  constructor(readonly store: LedgerStore, readonly clock: MonotonicClock = pageClock()) {}

  /** The ledger's time now for state ``s``, and the monotonic reading it was taken from. */
  private now(s: LedgerState): { now: number; reading: number } {
    const reading = this.clock.read();
    const { latest, anchors } = clockOf(s);
    return { now: ledgerTime(latest, anchors, this.clock.epoch, reading, this.clock.sinceBoot, Date.now()), reading };
  }

  async status(): Promise<Status> {
    const s = await this.store.read();
    return status(this.store.where, s, this.now(s).now);
  }

  async memoKeys(setting: MemoSetting): Promise<MemoKeys> {
    return new MemoKeys(await this.store.hmacKey(), setting);
  }

  /** Set (null: remove) the lifetime cap or the per-day cap, in worst-case ε. */
  async setCap(name: "cap" | "per_day", cap: number | null): Promise<void> {
    if (cap !== null) checkAmount("cap", cap);
    await this.store.update((s) => {
      s[name] = cap;
      return { state: s, result: undefined };
    });
  }

  /** Why the filter refuses ``cost`` on top of ``st`` (null: it fits). */
  refusal(st: Status, cost: Cost, what: string): string | null {
    if (st.cap === null && st.perDay === null) return null;
    const eps = cost.epsilon;
    if (eps === null) return message("BUDGET_NO_EPSILON", { family: cost.family, tool: TOOL });
    if (!fits(st.spent, eps, st.cap)) {
      return message("BUDGET_CAP", { spent: fmtEps(st.spent), what, needs: fmtEps(eps), cap: fmtEps(st.cap), tool: TOOL });
    }
    if (!fits(st.daySpent, eps, st.perDay)) {
      return message("BUDGET_PER_DAY", { spent: fmtEps(st.daySpent), what, needs: fmtEps(eps), cap: fmtEps(st.perDay),
        tool: TOOL });
    }
    return null;
  }

  /** BudgetRefused if ``cost`` would not fit now (nothing is spent). */
  async check(cost: Cost | null, what = "this run"): Promise<Status> {
    const st = await this.status();
    if (cost !== null) {
      const why = this.refusal(st, cost, what);
      if (why !== null) throw new BudgetRefused(why);
    }
    return st;
  }

  /** Memoized payloads of those ``keys`` that are stored. */
  async lookup(keys: (string | null)[]): Promise<Map<string, string>> {
    const s = await this.store.read();
    const out = new Map<string, string>();
    for (const k of keys) if (k !== null && k in s.memo) out.set(k, s.memo[k]!);
    return out;
  }

  /**
   * Charge one batch in one transaction and return what to send: an item whose key is stored
   * gets the stored payload at no cost; the first item of a new key is charged and its payload
   * stored. BudgetRefused for the whole batch (nothing spent or stored) when it does not fit,
   * or when the ledger cannot be written.
   */
  async charge(costs: Cost[], payloads: string[], keys: (string | null)[],
               info: { mechanism: string; params: Record<string, number | string>; bundleId: string },
               what = "this batch"): Promise<Charged> {
    if (costs.length !== payloads.length || payloads.length !== keys.length) {
      throw new RangeError("one cost, payload and key per item");
    }
    try {
      return await this.store.update<Charged>((s) => {
        const out: string[] = [];
        const charged: Cost[] = [];
        const fresh = new Map<string, string>();
        costs.forEach((c, i) => {
          const k = keys[i]!;
          if (k !== null && k in s.memo) out.push(s.memo[k]!);
          else if (k !== null && fresh.has(k)) out.push(fresh.get(k)!);
          else {
            out.push(payloads[i]!);
            charged.push(c);
            if (k !== null) fresh.set(k, payloads[i]!);
          }
        });
        const cost = total(charged);
        if (cost === null) return { state: null, result: { payloads: out, cost: null, memoized: out.length } };
        const { now, reading } = this.now(s);
        const why = this.refusal(status(this.store.where, s, now), cost, what);
        if (why !== null) throw new BudgetRefused(why);
        const clock = clockOf(s);
        const anchors = { ...clock.anchors, [this.clock.epoch]: { at: now, reading } };
        const kept = Object.entries(anchors).sort((a, b) => b[1].at - a[1].at).slice(0, MAX_ANCHORS);
        s.clock = { latest: Math.max(clock.latest ?? now, now), anchors: Object.fromEntries(kept) };
        // a token policy's public words: counted beside what is charged (only where there are
        // some: a ledger without them reads as it always did)
        const pub = cost.public ?? 0;
        s.charges.push({ at: now, family: cost.family, mechanism: info.mechanism, params: info.params,
          bundle_id: info.bundleId, epsilon: cost.epsilon, metric: cost.metric, tokens: cost.tokens, sends: cost.sends,
          ...(pub ? { public: pub } : {}) });
        const f = s.spend[cost.family] ?? { epsilon: NO_EPSILON.includes(cost.family) ? null : 0, metric: 0, tokens: 0, sends: 0 };
        if (cost.epsilon !== null) f.epsilon = (f.epsilon ?? 0) + cost.epsilon;
        f.metric += cost.metric;
        f.tokens += cost.tokens;
        f.sends += cost.sends;
        if (pub) f.public = (f.public ?? 0) + pub;
        s.spend[cost.family] = f;
        for (const [k, p] of fresh) s.memo[k] = p;
        return { state: s, result: { payloads: out, cost, memoized: out.length - charged.length } };
      });
    } catch (exc) {
      if (exc instanceof BudgetRefused) throw exc;
      throw new BudgetRefused(`${this.store.where}: the privacy ledger cannot be written (${(exc as Error).message}); nothing was sent`);
    }
  }
}
