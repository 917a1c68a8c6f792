/**
 * `privbert-edge`: the web edge's command line for Node (a backend, a script), with the flags
 * of `edge-agent privatize` that apply:
 *
 *     privbert-edge privatize FILE --mechanism dchi-text --eta 65 (--bundle DIR | --server URL
 *         [--model ID]) [-o OUT.jsonl] [--post predict|records --task T] [--ledger FILE --cap EPS]
 *     privbert-edge budget [--ledger FILE] [--cap EPS|none] [--per-day EPS|none]
 *
 * One JSON record per line, as edge-agent writes them (the same bytes for the same noise), in an
 * -o file created 0600. Errors: one line `privbert-edge: error: ...` on stderr and exit code 2
 * for usage (bad flags or parameters, parameters weaker than the privacy floor), 3 when a privacy
 * budget refuses a run (the device ledger's, before anything is written or sent, or the server's
 * 403 budget-exhausted), 1 for any other failure (bad input line, bundle, server, ledger), as
 * edge-agent's.
 */

import { accessSync, closeSync, constants, existsSync, openSync, readFileSync, statSync, writeSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { parseArgs } from "node:util";

import type { EdgeBundle } from "../bundle/bundle.js";
import { PrivbertClient, type ModelInfo } from "../service/client.js";
import { summary } from "../ledger/accounting.js";
import { ApiError, BudgetRefused, TextError, WeakPrivacyError } from "../errors.js";
import { BUDGET_EXHAUSTED } from "../service/client.js";
import { fmtG } from "../format/messages.js";
import { Ledger, fmtEps, total, type Cost } from "../ledger/ledger.js";
import { recordLine } from "../service/payload.js";
import { Pcg64Source } from "../random/pcg64.js";
import { Privatizer, type Mechanism } from "../mechanisms/privatizer.js";
import { DEFAULT_MECHANISM, mechanismNames, refusal } from "../mechanisms/registry.js";
import { predictMaxLength, sameParams } from "../mechanisms/specs.js";
import { nTokens, type TokenizedText } from "../mechanisms/tokens.js";
import { TextTokenizer } from "../bundle/tokenizer.js";
import { checkVouched, parseIds, pinnedBundle, TRUSTED_ENV } from "../service/pins.js";
import { trustNote } from "../bundle/trust.js";
import { DirBundleCache, FileTextFloorCache, loadBundleDir } from "./caches.js";
import { nodeClock } from "./clock.js";
import { FileLedgerStore, defaultLedgerPath } from "./file_ledger.js";
import { batches, InputError, type Batch, type Line } from "./input.js";
import { FilePinStore } from "./pins.js";
import { THRESHOLD } from "../floor/floor.js";
import { DEVICE } from "../generated/spec.js";
import { mechanismFlags, mechanismParams, neededParams, paramFlags, usageAlternatives, type ParamFlag } from "./mechanism_flags.js";

const PROG = "privbert-edge";

/** Bad flags or parameters: exit code 2. */
class UsageError extends Error {}
/** A flag the parser refuses (unknown, missing value): exit 2, with a pointer to --help. */
class ArgError extends UsageError {}
/** A run-time failure with a message that says what to do: exit code 1. */
class CliError extends Error {}

// the mechanism flags, from the mechanism spec (./mechanism_flags.ts): none is listed here
const PARAM_FLAGS: readonly ParamFlag[] = paramFlags();

const USAGE = `usage: ${PROG} privatize FILE (${usageAlternatives(DEFAULT_MECHANISM).join("\n         | ")})
         (--bundle DIR | --server URL [--model ID] [--api-key KEY]) [-o OUT.jsonl]
         [--post predict|records [--task T]] [--tsv] [--header auto|yes|no]
         [--ledger FILE] [--cap EPS] [--per-day EPS] [--no-memo] [--empty skip|error] [--truncate first|error]
         [--max-length N] [--batch-size N] [--post-batch N] [--float16] [--seed N]
         [--allow-weak-privacy] [--timeout S] [--retries N]
         [--accept-bundle ID] [--trusted-bundles IDS] [--refuse-unverified]
       ${PROG} budget [--ledger FILE] [--cap EPS|none] [--per-day EPS|none]
       ${PROG} tokenize FILE --bundle DIR   (word-piece ids per line, as JSON; nothing is sent)

mechanism parameters:
${PARAM_FLAGS.map((f) => `  --${f.name} ${f.metavar}: ${f.help}`).join("\n")}
input: one record per line (UTF-8); with --tsv: text<TAB>label or text_a<TAB>text_b<TAB>label.
output: one JSON record per line, {"payload": {...}, "label": ...}, as edge-agent writes them.
policies (the Python edge's): empty lines and texts without word pieces are skipped and counted
  (--empty error refuses them); a text longer than the model's limit (max_length - 2 word pieces,
  - 3 for a pair) keeps its first word pieces (--truncate error refuses it).
privacy budget: every payload is charged to the device ledger (--ledger FILE, default
  $PRIVBERT_EDGE_LEDGER or ~/.local/share/privbert/edge-ledger.json) before it is written or
  sent; --cap sets the ledger's cap (worst-case epsilon), --per-day a cap on any 24 hours (not a
  lifetime bound; the window runs on the boot clock, not the wall clock), and a run that would
  pass either is refused (exit 3) before anything is written or sent; so is a run the server's
  budget refuses (403 budget-exhausted). The ledger is created 0600; one that other users can
  write is refused, one they can read is warned about; a symlinked --ledger charges its target. The same text (same token ids, mechanism,
  parameters, bundle) gets the payload stored the first time, at no cost (--no-memo: fresh draws).
bundles: the first bundle a server names for a model is pinned (pins.json beside the bundle
  cache, shared with edge-agent); another one later is refused until accepted with
  --accept-bundle ID; a model renamed with a new bundle is refused the same way. privbert-edge
  knows the bundles the project makes from public data; --trusted-bundles IDS (default
  $${TRUSTED_ENV}, comma-separated) adds ids this app trusts as they are. Any other bundle is
  unverified: it must also pass the text floor (a public sample privatized with it; what a
  server decodes, and the tokenizer's pieces per word), and the summary says "unverified";
  --refuse-unverified (or $${DEVICE.cache.refuse_env}=1) refuses it outright.
privacy floor: measured on the bundle at every run (tokens drawn with OS entropy, privatized
  at --eta); a degenerate table or an eta that leaves more than ${fmtG(100 * THRESHOLD)}% of tokens unchanged is
  refused (exit 2) unless --allow-weak-privacy.
randomness: OS entropy (crypto.getRandomValues). --seed makes the noise reproducible (numpy's
  default_rng(seed), as edge-agent --seed) and predictable: experiments only.
`;

function num(name: string, v: string | undefined, int = false): number | undefined {
  if (v === undefined) return undefined;
  const x = Number(v);
  if (v.trim() === "" || !Number.isFinite(x) || (int && !Number.isInteger(x))) {
    throw new ArgError(`argument --${name}: invalid ${int ? "int" : "float"} value: '${v}'`);
  }
  return x;
}

function choice<T extends string>(name: string, v: string | undefined, allowed: readonly T[], dflt: T): T {
  if (v === undefined) return dflt;
  if (!(allowed as readonly string[]).includes(v)) {
    throw new ArgError(`argument --${name}: invalid choice: '${v}' (choose from ${allowed.map((a) => `'${a}'`).join(", ")})`);
  }
  return v as T;
}

function info(msg: string): void {
  process.stderr.write(`${PROG}: ${msg}\n`);
}

function warn(msg: string): void {
  process.stderr.write(`${PROG}: warning: ${msg}\n`);
}

const BASE_OPTIONS = {
  mechanism: { type: "string" },
  bundle: { type: "string" },
  server: { type: "string" }, model: { type: "string" }, "api-key": { type: "string" },
  output: { type: "string", short: "o" }, post: { type: "string" }, task: { type: "string" },
  tsv: { type: "boolean" }, header: { type: "string" }, ledger: { type: "string" },
  cap: { type: "string" }, "per-day": { type: "string" }, "no-memo": { type: "boolean" }, empty: { type: "string" },
  truncate: { type: "string" }, "max-length": { type: "string" }, "batch-size": { type: "string" },
  "post-batch": { type: "string" }, float16: { type: "boolean" }, seed: { type: "string" },
  "allow-weak-privacy": { type: "boolean" }, timeout: { type: "string" }, retries: { type: "string" },
  format: { type: "string" }, help: { type: "boolean", short: "h" },
  "accept-bundle": { type: "string", multiple: true }, "trusted-bundles": { type: "string" },
  "refuse-unverified": { type: "boolean" },
} as const;
type OptionSpec = { type: "string" | "boolean"; short?: string; multiple?: boolean };
const OPTIONS: Readonly<Record<string, OptionSpec>> = {
  ...Object.fromEntries(PARAM_FLAGS.map((f) => [f.name, { type: "string" }])), ...BASE_OPTIONS,
};

/** The parsed flags: the fixed ones typed, the mechanism parameters' as strings by flag name. */
type Values = ReturnType<typeof parseArgs<{ options: typeof BASE_OPTIONS; allowPositionals: true }>>["values"]
  & Readonly<Record<string, string | boolean | string[] | undefined>>;

function parse(argv: string[]): { command: string | undefined; positionals: string[]; v: Values } {
  // "--eta -1": a negative number is the flag's value, as argparse reads it (then refused)
  const args: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    const name = a.startsWith("--") ? a.slice(2) : null;
    const next = argv[i + 1];
    if (name !== null && name in OPTIONS && OPTIONS[name]!.type === "string"
        && next !== undefined && /^-(\d|\.\d|inf|nan)/i.test(next)) {
      args.push(`${a}=${next}`);
      i++;
    } else {
      args.push(a);
    }
  }
  argv = args;
  try {
    const { values, positionals } = parseArgs({ args: argv, options: OPTIONS, allowPositionals: true, strict: true });
    return { command: positionals[0], positionals: positionals.slice(1), v: values as Values };
  } catch (exc) {
    throw new ArgError((exc as Error).message.split("\n")[0]!.replace(/\. To specify a positional.*$/, ""));
  }
}

// -- the ledger -------------------------------------------------------------------------------
function openLedger(path: string | undefined): Ledger {
  const store = new FileLedgerStore(path ?? defaultLedgerPath());
  let warning: string | null;
  try {
    warning = store.open();
  } catch (exc) {
    throw new CliError((exc as Error).message);
  }
  if (warning !== null) warn(warning);
  return new Ledger(store, nodeClock());
}

/** --cap and --per-day, when given: a number >= 0, or none. */
async function setCaps(ledger: Ledger, v: Values): Promise<void> {
  for (const [flag, name] of [["cap", "cap"], ["per-day", "per_day"]] as const) {
    const text = v[flag];
    if (text === undefined) continue;
    const value = text.trim().toLowerCase() === "none" ? null : num(flag, text)!;
    if (value !== null && value < 0) throw new UsageError(`--${flag} must be >= 0 or none, got ${text}`);
    try {
      await ledger.setCap(name, value);
    } catch (exc) {
      throw new CliError(`${ledger.store.where}: cannot write the privacy ledger (${(exc as Error).message})`);
    }
  }
}

async function runBudget(v: Values): Promise<number> {
  const ledger = openLedger(v.ledger);
  await setCaps(ledger, v);
  const st = await ledger.status();
  const left = (spent: number, cap: number | null): number | null => (cap === null ? null : Math.max(0, cap - spent));
  process.stdout.write(JSON.stringify({ ledger: st.where, units: "worst-case epsilon", spent: st.spent,
    cap: st.cap, remaining: left(st.spent, st.cap), sends: st.sends,
    families: st.families, memoized: st.memoized,
    per_day: st.perDay === null ? null : { cap: st.perDay, spent_last_24h: st.daySpent,
      remaining: left(st.daySpent, st.perDay), note: "a daily cap is not a lifetime bound" } }) + "\n");
  return 0;
}

// -- privatize --------------------------------------------------------------------------------
interface Options {
  file: string;
  mechanism: Mechanism;
  /** the mechanism's parameters, each given value or its default, in the spec's order */
  params: Record<string, number | string>;
  output: string | null;
  post: "predict" | "records" | null;
  task: string | null;
  tsv: boolean;
  header: "auto" | "yes" | "no";
  empty: "skip" | "error";
  truncate: "first" | "error";
  maxLength: number | null;
  batchSize: number;
  postBatch: number;
  float16: boolean;
  seed: number | null;
  memo: boolean;
}

/** A mechanism parameter's value from its flag's text, by the spec's JSON type, as argparse
 * reads it (its messages). */
function paramValue(f: ParamFlag, text: string): number | string {
  if (f.choices) return choice(f.name, text, f.choices, f.choices[0]!);
  if (f.type === "string") return text;
  return num(f.name, text, f.type === "integer")!;
}

function options(positionals: string[], v: Values): Options {
  if (positionals.length !== 1) throw new UsageError("privatize takes one FILE (- for stdin)");
  const mech = v.mechanism ?? DEFAULT_MECHANISM;
  const elsewhere = refusal(mech, "cli");
  if (elsewhere !== null) throw new UsageError(elsewhere);
  const mechanism = choice("mechanism", mech, mechanismNames(), DEFAULT_MECHANISM);
  // the mechanism flags given: every parameter flag, and the edge options the web edge has
  const given = [...PARAM_FLAGS.map((f) => f.name), "float16"].filter((f) => v[f] !== undefined && v[f] !== false);
  const allowed = mechanismFlags(mechanism);
  const stray = given.filter((f) => !allowed.includes(f))
    .sort((a, b) => (a.replaceAll("-", "_") < b.replaceAll("-", "_") ? -1 : 1));
  if (stray.length) {
    throw new UsageError(`${stray.map((f) => `--${f}`).join(", ")} do(es) not apply to --mechanism ${mechanism}`);
  }
  for (const p of neededParams(mechanism)) {
    const f = PARAM_FLAGS.find((x) => x.param === p)!;
    if (v[f.name] === undefined) throw new UsageError(`--mechanism ${mechanism} needs --${f.name}`);
  }
  const values: Record<string, number | string> = {};
  for (const f of PARAM_FLAGS) {
    const text = v[f.name];
    if (typeof text === "string") values[f.param] = paramValue(f, text);
  }
  const o: Options = {
    file: positionals[0]!, mechanism, params: mechanismParams(mechanism, values),
    output: v.output ?? null,
    post: v.post === undefined ? null : choice("post", v.post, ["predict", "records"] as const, "predict"),
    task: v.task ?? null,
    tsv: v.tsv ?? false,
    header: choice("header", v.header, ["auto", "yes", "no"] as const, "auto"),
    empty: choice("empty", v.empty, ["skip", "error"] as const, "skip"),
    truncate: choice("truncate", v.truncate, ["first", "error"] as const, "first"),
    maxLength: num("max-length", v["max-length"], true) ?? null,
    batchSize: num("batch-size", v["batch-size"], true) ?? 256,
    postBatch: num("post-batch", v["post-batch"], true) ?? 64,
    float16: v.float16 ?? false,
    seed: num("seed", v.seed, true) ?? null,
    memo: !(v["no-memo"] ?? false),
  };
  if (v.format !== undefined && v.format !== "jsonl") throw new UsageError("--format text is for edge-agent; privbert-edge writes jsonl");
  if (o.batchSize < 1 || o.postBatch < 1) throw new UsageError("--batch-size and --post-batch must be integers >= 1");
  if (o.post && !v.server) throw new UsageError(`--post ${o.post} needs --server URL`);
  if (o.post === "records" && (!o.task || !o.tsv)) throw new UsageError("--post records needs --task T and labelled input (--tsv)");
  if (o.task && o.post !== "records") throw new UsageError("--task goes with --post records");
  if (v.model && !v.server) throw new UsageError("--model needs --server");
  if (!v.bundle && !v.server) throw new UsageError("give --bundle DIR or --server URL (the web edge ships no default bundle)");
  if (o.seed !== null && o.seed < 0) throw new UsageError(`--seed must be an integer >= 0, got ${o.seed}`);
  return o;
}

function readInput(file: string): Uint8Array {
  try {
    if (file === "-") return new Uint8Array(readFileSync(0));
    if (!existsSync(file)) throw new CliError(`${file}: no such file`);
    if (statSync(file).isDirectory()) throw new CliError(`${file}: is a directory, not a text file`);
    return new Uint8Array(readFileSync(file));
  } catch (exc) {
    if (exc instanceof CliError) throw exc;
    throw new CliError(`${file}: ${(exc as NodeJS.ErrnoException).code ?? (exc as Error).message}`);
  }
}

/** Refuse, before sending, a mechanism or parameters the served model does not read. */
function checkModel(model: ModelInfo, name: string, mine: Record<string, number | string>): void {
  const want = model.mechanism;
  let mismatch = want !== undefined && want !== null && want !== name;
  const params = model.params;
  if (!mismatch && params && typeof params === "object") mismatch = !sameParams(name, mine, params);
  if (mismatch) {
    throw new CliError(`model ${model.id} reads ${want} ${JSON.stringify(params)}; this run would send ${name} `
      + `${JSON.stringify(mine)}: set the same mechanism and parameters`);
  }
}

class Output {
  private fd: number | null = null;
  records = 0;

  /** Checked before anything is charged or sent: a folder that is not there or cannot be
   * written is refused now, not after the ledger was charged (issue 42). */
  constructor(private readonly path: string | null) {
    if (path === null || path === "-") return;
    if (existsSync(path) && statSync(path).isDirectory()) {
      throw new CliError(`${path}: is a directory (-o takes a file)`);
    }
    const dir = dirname(resolve(path));
    if (!existsSync(dir)) throw new CliError(`${path}: its folder ${dir} does not exist (create it, or choose another -o)`);
    if (!statSync(dir).isDirectory()) throw new CliError(`${path}: ${dir} is not a folder`);
    try {
      accessSync(existsSync(path) ? path : dir, constants.W_OK);
    } catch {
      throw new CliError(`${path}: cannot be written here (permission denied); choose another -o`);
    }
  }

  write(lines: string[]): void {
    if (lines.length === 0) return;
    if (this.fd === null) this.fd = this.path === null || this.path === "-" ? 1 : openSync(this.path, "w", 0o600);
    writeSync(this.fd, lines.join(""));
    this.records += lines.length;
  }

  close(): void {
    if (this.fd === null && this.path !== null && this.path !== "-") this.fd = openSync(this.path, "w", 0o600);
    if (this.fd !== null && this.fd !== 1) closeSync(this.fd);
  }
}

interface Tokenized {
  lines: Line[];
  items: TokenizedText[];
  skipped: number;
  error: Error | null;
}

function tokenize(o: Options, priv: Privatizer, batch: Batch): Tokenized {
  let lines = batch.lines;
  let error: Error | null = batch.error;
  let skipped = 0;
  if (batch.empty.length && o.empty === "error") {
    const first = batch.empty[0]!;
    lines = lines.filter((l) => l.number < first);
    error = new InputError(`line ${first}: empty line (--empty skip skips them)`);
  } else {
    skipped += batch.empty.length;
  }
  const pairs = lines.length && lines[0]!.textB !== null;
  let items: (TokenizedText | null)[];
  try {
    items = priv.tokenize(lines.map((l) => l.text), pairs ? lines.map((l) => l.textB!) : null, true);
  } catch (exc) {
    if (!(exc instanceof TextError)) throw exc;
    const bad = lines[exc.index]!;
    error = new InputError(`line ${bad.number} ${exc.detail.split(" (")[0]} (--truncate first keeps the first ones)`);
    lines = lines.slice(0, exc.index);
    items = priv.tokenize(lines.map((l) => l.text), pairs ? lines.map((l) => l.textB!) : null, true);
  }
  const keepLines: Line[] = [];
  const keepItems: TokenizedText[] = [];
  for (let i = 0; i < lines.length; i++) {
    const it = items[i];
    if (it) {
      keepLines.push(lines[i]!);
      keepItems.push(it);
    } else if (o.empty === "error") {
      error = new InputError(`line ${lines[i]!.number}: no tokens in the text (--empty skip skips it)`);
      break;
    } else {
      skipped++;
    }
  }
  return { lines: keepLines, items: keepItems, skipped, error };
}

async function runPrivatize(positionals: string[], v: Values): Promise<number> {
  const t0 = performance.now();
  const o = options(positionals, v);
  if (o.seed !== null) {
    warn("--seed makes the noise predictable: anyone who knows the seed can remove the protection; use it for experiments only");
  }
  const data = readInput(o.file);
  const out = new Output(o.output);
  let client: PrivbertClient | null = null;
  let model: ModelInfo | null = null;
  let bundle: EdgeBundle;
  // bundle pinning (edge_agent.service.pins): ids the user accepts, ids the app trusts
  const accept = parseIds(v["accept-bundle"] ?? [], "--accept-bundle");
  const trusted = v["trusted-bundles"] !== undefined ? parseIds(v["trusted-bundles"], "--trusted-bundles")
    : parseIds(process.env[TRUSTED_ENV], `$${TRUSTED_ENV}`);
  const refuse = v["refuse-unverified"] ?? ["1", "true", "yes"].includes((process.env[DEVICE.cache.refuse_env] ?? "").trim().toLowerCase());
  if (v.server) {
    try {
      client = new PrivbertClient(v.server, { apiKey: v["api-key"] ?? process.env.PRIVBERT_API_KEY ?? null,
        timeout: num("timeout", v.timeout) ?? 30, retries: num("retries", v.retries, true) ?? 5, batchSize: o.postBatch,
        audience: "cli" });
    } catch (exc) {
      throw new UsageError((exc as Error).message);
    }
    model = await client.model(v.model ?? null);
    if (o.post === "predict") checkModel(model, o.mechanism, o.params);
  }
  // the privatizer (and its floors) of a bundle, before the bundle is pinned
  let priv: Privatizer | null = null;
  const makePrivatizer = async (b: EdgeBundle): Promise<void> => {
    // --max-length, else for --post predict the served model's own limit (the predict length policy)
    const maxLength = predictMaxLength(o.mechanism, o.maxLength, b.maxLength, o.post === "predict" ? model : null);
    try {
      priv = await Privatizer.create(b, { mechanism: o.mechanism, params: o.params, maxLength, truncate: o.truncate,
        floatDtype: o.float16 ? "float16" : "float32", allowWeakPrivacy: v["allow-weak-privacy"] ?? false,
        threads: 1, backend: searchBackend(), trustedBundles: [...trusted], trustHow: "--trusted-bundles",
        textFloorCache: new FileTextFloorCache() });
    } catch (exc) {
      if (exc instanceof WeakPrivacyError) throw new UsageError(`${exc.message}; --allow-weak-privacy privatizes anyway`);
      if (exc instanceof RangeError) throw new UsageError(exc.message);
      throw exc;
    }
  };
  if (v.bundle) {
    if (!existsSync(v.bundle)) throw new CliError(`${v.bundle}: no such bundle directory`);
    if (!statSync(v.bundle).isDirectory()) throw new CliError(`${v.bundle}: not a directory (--bundle takes a bundle directory)`);
    if (!existsSync(`${v.bundle}/bundle.json`)) {
      throw new CliError(`${v.bundle}: not a bundle directory (no bundle.json); make one with cloud-api export-bundle or edge-agent bundle fetch`);
    }
    bundle = await loadBundleDir(v.bundle);
    checkVouched(bundle.bundleId, trusted, refuse, undefined, undefined, "cli");
    if (model && model.bundle_id !== bundle.bundleId) {
      throw new CliError(`--bundle ${v.bundle} is ${bundle.bundleId.slice(0, 12)}…, but model ${model.id} expects bundle `
        + `${String(model.bundle_id).slice(0, 12)}…; drop --bundle to fetch the right one`);
    }
    await makePrivatizer(bundle);
  } else {
    const cache = new DirBundleCache();
    // the pin is checked before a byte of the bundle is fetched, recorded once it is verified
    // and has passed the floors
    const got = await pinnedBundle(client!, v.server!, model!, cache, new FilePinStore(undefined, warn),
      { accept, trusted, refuseUnverified: refuse, audience: "cli" }, null, makePrivatizer);
    bundle = got.bundle;
    const id = bundle.bundleId.slice(0, 12);
    if (got.pin === "pinned") {
      info(`bundle ${id}… pinned for model ${model!.id}: this device will refuse another one from this server `
        + "unless accepted with --accept-bundle");
    } else if (got.pin === "accepted") {
      info(`bundle ${id}… accepted for model ${model!.id} (--accept-bundle)`);
    }
    info(`bundle ${bundle.bundleId.slice(0, 12)}… of model ${model!.id} ${got.fetched ? "fetched and cached in" : "from cache"} ${cache.path(bundle.bundleId)}`);
  }
  if (priv === null) throw new Error("no privatizer was made for the bundle");
  const p: Privatizer = priv;
  let ledger: Ledger;
  try {
    ledger = openLedger(v.ledger);
    await setCaps(ledger, v);
  } catch (exc) {
    await p.release();
    throw exc;
  }
  try {
    const priv = p;
    if (priv.weakPrivacy) warn(`${priv.weakPrivacy}: the output is close to the raw text (--allow-weak-privacy)`);
    const info_ = { mechanism: priv.name, params: priv.params, bundleId: bundle.bundleId };
    const keys = o.memo ? await ledger.memoKeys({ mechanism: priv.name, params: priv.params, bundle_id: bundle.bundleId }) : null;
    const keyOf = (items: TokenizedText[]): Promise<(string | null)[]> =>
      keys === null ? Promise.resolve(items.map(() => null)) : Promise.all(items.map((it) => keys.keyOf(it.idsA, it.idsB)));
    const costOf = (it: TokenizedText): Cost => priv.cost(it);
    const opts = { tsv: o.tsv, header: o.header, batchSize: o.batchSize };

    // the plan: with a cap, the whole input's cost (memoized texts free) before anything is sent
    const st = await ledger.status();
    if (st.cap !== null || st.perDay !== null) {
      const costs: Cost[] = [];
      const seen = new Set<string>();
      for (const b of batches(data, opts)) {
        const t = tokenize(o, priv, b);
        const k = await keyOf(t.items);
        const stored = await ledger.lookup(k);
        t.items.forEach((it, i) => {
          const key = k[i]!;
          if (key !== null && (stored.has(key) || seen.has(key))) return;
          if (key !== null) seen.add(key);
          costs.push(costOf(it));
        });
        if (t.error) break;
      }
      try {
        await ledger.check(total(costs), "this run");
      } catch (exc) {
        if (exc instanceof BudgetRefused) throw new BudgetRefused(`${exc.message}; nothing was written or sent`);
        throw exc;
      }
    }

    const source = o.seed !== null ? new Pcg64Source(o.seed) : null;
    let nRecords = 0, nTok = 0, nPublic = 0, nTrunc = 0, nSkipped = 0, memoized = 0;
    const charged: Cost[] = [];
    const tLoop = performance.now();
    try {
      for (const b of batches(data, opts)) {
        const t = tokenize(o, priv, b);
        nSkipped += t.skipped;
        if (t.items.length) {
          const dataOut = await priv.privatizeData(t.items, source);
          const fresh = priv.payloads(t.items, dataOut);
          let sent;
          try {
            sent = await ledger.charge(t.items.map(costOf), fresh, await keyOf(t.items), info_);
          } catch (exc) {
            if (exc instanceof BudgetRefused) throw new BudgetRefused(`${exc.message}; ${nRecords} record(s) before it were written`);
            throw exc;
          }
          if (sent.cost) charged.push(sent.cost);
          memoized += sent.memoized;
          let lines: string[];
          if (o.post === "predict") {
            try {
              const preds = await client!.predict(String(v.model ?? model!.id), sent.payloads);
              lines = preds.map((p, i) => JSON.stringify({ line: t.lines[i]!.number, ...p }) + "\n");
            } catch (exc) {
              if (exc instanceof ApiError) {
                out.write(exc.partial.map((p, i) => JSON.stringify({ line: t.lines[i]!.number, ...(p as object) }) + "\n"));
                throw serverFailure(exc, `${nRecords + exc.partial.length} record(s) before it were written`);
              }
              throw exc;
            }
          } else if (o.post === "records") {
            const recs = sent.payloads.map((p, i) => recordLine(p, t.lines[i]!.label).trimEnd());
            try {
              const ids = await client!.postRecords(o.task!, recs);
              lines = ids.map((id, i) => JSON.stringify({ line: t.lines[i]!.number, id }) + "\n");
            } catch (exc) {
              if (exc instanceof ApiError) {
                out.write(exc.partial.map((id, i) => JSON.stringify({ line: t.lines[i]!.number, id }) + "\n"));
                throw serverFailure(exc, `${nRecords + exc.partial.length} record(s) before it were uploaded and written`);
              }
              throw exc;
            }
          } else {
            lines = sent.payloads.map((p, i) => recordLine(p, o.tsv ? t.lines[i]!.label : null));
          }
          out.write(lines);
          nRecords += t.items.length;
          for (const it of t.items) {
            nTok += nTokens(it);
            nPublic += priv.cost(it).public ?? 0;
            if (nTokens(it) < it.nBefore) nTrunc++;
          }
        }
        if (t.error) throw new CliError(`${t.error.message}; ${nRecords} record(s) before it were written`);
      }
    } finally {
      out.close();
    }
    const elapsed = (performance.now() - t0) / 1000;
    const streaming = (performance.now() - tLoop) / 1000;
    // a sentence's worst case over the tokens it privatizes (a token policy's public words are
    // counted apart, as the ledger counts them)
    const line = summary(priv.guarantee(), nRecords ? (nTok - nPublic) / nRecords : null);
    const c = total(charged);
    const after = await ledger.status();
    const spent = c === null ? "charged nothing" : `charged worst-case epsilon ${fmtEps(c.epsilon)} for ${c.sends} payload(s)`;
    info(`${nRecords} records, ${nTok} tokens in ${elapsed.toFixed(2)} s (setup ${((tLoop - t0) / 1000).toFixed(2)} s, `
      + `${Math.round(nTok / Math.max(streaming, 1e-9)).toLocaleString("en-US")} tokens/s streaming); `
      + `${nSkipped} empty line(s) skipped; ${nTrunc} truncated; ${line}; ${trustNote(priv.trust)}; `
      + `ledger: ${spent}${keys ? `, ${memoized} memoized (free)` : ""}; spent ${fmtEps(after.spent)}, `
      + `${after.cap === null ? "no cap" : `cap ${fmtEps(after.cap)}`}`
      + (priv.weakPrivacy ? "; WEAK PRIVACY (--allow-weak-privacy): the output is close to the raw text" : ""));
    return 0;
  } finally {
    await p.release();
  }
}

/** A failed request's error: BudgetRefused (exit 3, as the device's own cap) for the server's
 * 403 budget-exhausted, else CliError; ``done`` says what was written before it. */
function serverFailure(exc: ApiError, done: string): Error {
  const refused = exc.status === 403 && exc.type === BUDGET_EXHAUSTED;
  return new (refused ? BudgetRefused : CliError)(`${exc.message}; ${done}`);
}

// -- tokenize (the conformance check of the tokenizer) ----------------------------------------
async function runTokenize(positionals: string[], v: Values): Promise<number> {
  if (positionals.length !== 1) throw new UsageError("tokenize takes one FILE (- for stdin)");
  if (!v.bundle) throw new UsageError("tokenize needs --bundle DIR");
  const data = readInput(positionals[0]!);
  const bundle = await loadBundleDir(v.bundle);
  const tok = new TextTokenizer(bundle.tokenizerJson);
  const out: string[] = [];
  for (const b of batches(data, { tsv: v.tsv ?? false, header: "auto", batchSize: 256 })) {
    for (const ln of b.lines) out.push(JSON.stringify({ line: ln.number, ids: tok.encode(ln.text) }) + "\n");
    if (b.error) throw new CliError(b.error.message);
  }
  process.stdout.write(out.join(""));
  return 0;
}

// -- entry point -------------------------------------------------------------------------------
function describe(exc: unknown): string {
  const e = exc as Error;
  const text = (e && e.message) || String(exc);
  return text.split("\n").map((s) => s.trim()).filter(Boolean).slice(0, 3).join("; ");
}

/** $PRIVBERT_EDGE_SEARCH: the exact search's candidate pass (auto, int8, ort, loop: the same
 * tokens; tests and benchmarks run a page's loop here). */
function searchBackend(): "auto" | "int8" | "ort" | "loop" {
  const b = process.env.PRIVBERT_EDGE_SEARCH || "auto";
  if (b !== "auto" && b !== "int8" && b !== "ort" && b !== "loop") {
    throw new UsageError(`$PRIVBERT_EDGE_SEARCH must be one of auto, int8, ort, loop, got ${JSON.stringify(b)}`);
  }
  return b;
}

export async function main(argv: string[]): Promise<number> {
  try {
    const { command, positionals, v } = parse(argv);
    if (v.help || command === undefined) {
      process.stderr.write(USAGE);
      return v.help ? 0 : 2;
    }
    if (command === "privatize") return await runPrivatize(positionals, v);
    if (command === "budget") return await runBudget(v);
    if (command === "tokenize") return await runTokenize(positionals, v);
    throw new ArgError(`argument COMMAND: invalid choice: '${command}' (choose from 'privatize', 'budget', 'tokenize')`);
  } catch (exc) {
    if (exc instanceof UsageError) {
      const hint = exc instanceof ArgError ? ` (see ${PROG} --help)` : "";
      process.stderr.write(`${PROG}: error: ${describe(exc)}${hint}\n`);
      return 2;
    }
    process.stderr.write(`${PROG}: error: ${describe(exc)}\n`);
    if (exc instanceof BudgetRefused) return 3;
    if (process.env.PRIVBERT_EDGE_DEBUG && exc instanceof Error) process.stderr.write(`${exc.stack}\n`);
    return 1;
  }
}
