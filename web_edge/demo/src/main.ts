/**
 * The privacy explorer: the page's wiring. Everything that privatizes, verifies, encodes and
 * counts is the library's (`./edge.ts` adapts it); this file reads the form, calls it in the
 * order the Python edge does (text policy, privacy floor, ledger charge committed, then the
 * send) and shows what happened, or one visible message and nothing sent.
 */

import { summary, type ModelInfo, type PrivbertClient, type Progress } from "@privbert/edge";

import { readConfig } from "./api.js";
import { Edge, NEAR_RANK, explain, type Privatized, type TokenKind } from "./edge.js";
import { notes } from "./guarantee.js";

const $ = <T extends HTMLElement>(id: string): T => {
  const el = document.getElementById(id);
  if (!el) throw new Error(`page element #${id} is missing`);
  return el as T;
};

const ui = {
  text: $<HTMLTextAreaElement>("text"),
  model: $<HTMLSelectElement>("model"),
  eta: $<HTMLInputElement>("eta"),
  etaRange: $<HTMLInputElement>("eta-range"),
  keyRow: $("key-row"),
  key: $<HTMLInputElement>("key"),
  go: $<HTMLButtonElement>("go"),
  preview: $<HTMLButtonElement>("preview"),
  status: $("status"),
  progress: $<HTMLProgressElement>("progress"),
  bundleNote: $("bundle-note"),
  error: $("error"),
  sentNote: $("sent-note"),
  tokens: $<HTMLOListElement>("tokens"),
  tokenCounts: $("token-counts"),
  payload: $("payload"),
  timing: $("timing"),
  guarantee: $("guarantee"),
  guaranteeNotes: $<HTMLUListElement>("guarantee-notes"),
  inversion: $("inversion"),
  prediction: $("prediction"),
  spent: $("ledger-spent"),
  publicWords: $("ledger-public"),
  cap: $("ledger-cap"),
  remaining: $("ledger-remaining"),
  sends: $("ledger-sends"),
  capInput: $<HTMLInputElement>("cap"),
  setCap: $<HTMLButtonElement>("set-cap"),
};

let client: PrivbertClient;
let models: ModelInfo[] = [];
let edge: Edge | null = null;
let busy = false;
let inversionRun = 0;
let measuredEta: number | null = null;

function status(text: string): void {
  ui.status.textContent = text;
}

/** One visible message; the caller has sent nothing (or says what was). */
function fail(err: unknown): void {
  ui.error.textContent = explain(err);
  ui.error.hidden = false;
  status("");
}

function clearError(): void {
  ui.error.hidden = true;
  ui.error.textContent = "";
}

function selected(): ModelInfo | undefined {
  return models.find((m) => m.id === ui.model.value);
}

function eta(): number {
  return Number(ui.eta.value);
}

async function start(): Promise<void> {
  const t0 = performance.now();
  status("connecting to the service…");
  const config = await readConfig();
  if (!config.api_key) {
    ui.keyRow.hidden = false;
    ui.key.addEventListener("change", () => {
      clearError();
      client = Edge.client(ui.key.value.trim() || null);
      void loadModels(t0).catch(fail);
    });
    status("enter an application key to start");
    return;
  }
  client = Edge.client(config.api_key);
  await loadModels(t0);
}

async function loadModels(t0: number): Promise<void> {
  models = (await client.models()).filter((m) => m.mechanism === "dchi-text");
  if (models.length === 0) throw new Error("the service serves no dchi-text model: nothing to explore");
  ui.model.replaceChildren(...models.map((m) => new Option(`${m.id} (${(m.version as string | null | undefined) ?? "?"}, η = ${String(m.params.eta)})`, m.id)));
  const wanted = new URLSearchParams(location.search).get("model");
  if (wanted && models.some((m) => m.id === wanted)) ui.model.value = wanted;
  ui.model.disabled = false;
  await selectModel(t0);
}

async function selectModel(t0: number = performance.now()): Promise<void> {
  const m = selected();
  if (!m) return;
  ui.go.disabled = ui.preview.disabled = true;
  setEta(Number(m.params.eta));
  status("downloading the word list…");
  const previous = edge;
  edge = null;
  await previous?.close();
  let bytes: number | null = null;
  try {
    edge = await Edge.open(client, m, (p) => {
      showProgress(p);
      if (p.phase === "download") bytes = p.total ?? p.loaded;
    });
  } finally {
    ui.progress.hidden = true;
  }
  const size = bytes === null ? "kept in this browser from an earlier visit" : `${mb(bytes)} downloaded`;
  status(`Ready: the word list of ${edge.vocabSize.toLocaleString("en-US")} word pieces is here (${size}, ` +
    `checked) after ${((performance.now() - t0) / 1000).toFixed(1)} s.`);
  ui.bundleNote.title = `bundle ${m.bundle_id} (${edge.vocabSize} × ${edge.dim}, SHA-256 of every file checked)`;
  document.body.dataset.bundleMs = String(performance.now() - t0);
  // when the page's script started (ms after navigation), then the phases of opening
  document.body.dataset.phases = JSON.stringify({ scriptMs: t0, ...edge.phases });
  ui.go.disabled = ui.preview.disabled = false;
  document.body.dataset.readyAt = String(performance.now());
  // the privacy floor is measured while the page is ready to privatize in it: a refusal is
  // shown as soon as it comes, and nothing is ever sent before it passes
  const opened = edge;
  opened.floorChecked(Number(m.params.eta)).catch((err: unknown) => {
    if (edge !== opened) return;
    ui.go.disabled = ui.preview.disabled = true;
    ui.tokens.replaceChildren();
    ui.tokenCounts.textContent = "";
    fail(err);
  });
  await showLedger();
}

function mb(bytes: number): string {
  return `${(bytes / 1e6).toFixed(bytes < 1e7 ? 1 : 0)} MB`;
}

const progressLog: (Progress & { at: number })[] = [];

/** The opening's progress: the download (of its total when the service says), the check,
 * the preparation of the search. */
function showProgress(p: Progress): void {
  ui.progress.hidden = false;
  if (p.phase === "download") {
    if (p.total) {
      ui.progress.value = p.loaded / p.total;
      status(`downloading the word list: ${mb(p.loaded)} of ${mb(p.total)} (${Math.floor((100 * p.loaded) / p.total)}%)`);
    } else {
      ui.progress.removeAttribute("value");
      status(`downloading the word list: ${mb(p.loaded)}`);
    }
  } else if (p.phase === "verify") {
    ui.progress.removeAttribute("value");
    status(p.cached ? "checking the word list kept in this browser…" : "checking the word list against its fingerprint…");
  } else {
    ui.progress.removeAttribute("value");
    status("preparing the search for nearby word pieces…");
  }
  progressLog.push({ ...p, at: Math.round(performance.now()) });
  document.body.dataset.progress = JSON.stringify(progressLog);  // for the browser test
}

function setEta(v: number): void {
  ui.eta.value = String(v);
  ui.etaRange.value = String(v);
}

async function showLedger(): Promise<void> {
  if (!edge) return;
  const s = await edge.ledgerStatus();
  ui.spent.textContent = s.spent.toFixed(1);
  ui.cap.textContent = s.cap === null ? "none" : s.cap.toFixed(1);
  ui.remaining.textContent = s.cap === null ? "–" : Math.max(0, s.cap - s.spent).toFixed(1);
  ui.sends.textContent = String(s.sends);
  ui.publicWords.textContent = String(s.families.dchi?.public ?? 0);
}

function showTokens(tokens: string[], unchanged: boolean[]): void {
  ui.tokens.replaceChildren(...tokens.map((tok, i) => {
    const li = document.createElement("li");
    li.textContent = tok;
    if (unchanged[i]) {
      li.className = "same";
      li.title = "sent as typed: unchanged by the noise in this draw";
    }
    return li;
  }));
  ui.tokenCounts.textContent = "";
  delete document.body.dataset.tokenKinds;
}

const KIND_CLASS: Record<TokenKind, string> = { public: "public", typed: "same", near: "near", far: "far" };

/** What happened to each word piece, and the count of each kind for the sentence (after the
 * tokens are painted: it reads the whole table once per word piece). */
function showTokenKinds(p: Privatized): void {
  if (!edge) return;
  const kinds = edge.tokenKinds(p);
  const items = [...ui.tokens.children] as HTMLElement[];
  kinds.forEach((k, i) => {
    const li = items[i];
    if (!li) return;
    li.className = KIND_CLASS[k.kind];
    li.title = k.kind === "public" ? `sent as is: “${p.typed[i]!}” is on the model's public list (a word that `
        + "carries no secret: sent as typed with probability 1 − p, outside the guarantee)"
      : k.kind === "typed" ? `sent as typed: “${p.typed[i]!}” was unchanged by the noise in this draw`
      : `you typed “${p.typed[i]!}”; sent “${p.tokens[i]!}”, the ${ordinal(k.rank)} nearest word piece to it `
        + (k.kind === "near" ? "(a near word)" : `(an unrelated word: not among its ${NEAR_RANK} nearest)`);
  });
  const count = (kind: TokenKind): number => kinds.filter((k) => k.kind === kind).length;
  ui.tokenCounts.textContent = `Of ${kinds.length} word pieces: `
    + (edge.policy ? `${count("public")} public words sent as is, ` : "")
    + `${count("typed")} sent as typed, `
    + `${count("near")} replaced by a near word, ${count("far")} replaced by an unrelated word.`;
  document.body.dataset.tokenKinds = JSON.stringify(kinds.map((k) => k.kind));
}

function ordinal(n: number): string {
  const tail = n % 100 >= 11 && n % 100 <= 13 ? "th" : ({ 1: "st", 2: "nd", 3: "rd" } as Record<number, string>)[n % 10] ?? "th";
  return `${n.toLocaleString("en-US")}${tail}`;
}

function showPrivatized(p: Privatized): void {
  showTokens(p.tokens, p.unchanged);
  ui.payload.textContent = "(made once the privacy floor has passed at this η)";
  ui.timing.textContent = p.ms.toFixed(1);
  document.body.dataset.privatizeMs = String(p.ms);
  const g = p.guarantee;
  ui.guarantee.textContent = `${summary(g, p.tokens.length)}; ${edge!.trustNote}`; // known or unverified
  ui.guaranteeNotes.replaceChildren(...notes(g).map((n) => {
    const li = document.createElement("li");
    li.textContent = n;
    return li;
  }));
}

/** The privatization on screen (its kinds and payload are filled in after it is shown). */
let shown: Privatized | null = null;

async function run(send: boolean): Promise<void> {
  if (busy || !edge) return;
  shown = null;
  document.body.dataset.clickAt = String(performance.now());
  const m = selected()!;
  busy = true;
  clearError();
  ui.prediction.textContent = "–";
  try {
    const e = eta();
    // the text policy first; then the tokens are shown (they stay in this page), and the
    // payload is made once the privacy floor has passed: a refusal leaves nothing charged and
    // nothing sent
    const p = await edge.privatize(ui.text.value, e);
    showPrivatized(p);
    shown = p;
    if (!send) {
      ui.sentNote.textContent = "Privatized in this page only: nothing was sent and nothing charged.";
      status("");
      p.payload().then((json) => {
        if (shown === p) ui.payload.textContent = json;
      }, (err: unknown) => {
        if (shown === p) fail(err);
      });
      return;
    }
    const payloadJson = await p.payload();
    ui.payload.textContent = payloadJson;
    if (e !== Number(m.params.eta)) {  // exploring another η: shown here, never sent
      ui.sentNote.textContent = `Not sent: model ${m.id} reads payloads made at η = ${String(m.params.eta)} ` +
        `(the service refuses any other); this one is at η = ${e}. Nothing was charged.`;
      status("");
      return;
    }
    status("charging the device ledger, then sending the payload…");
    ui.sentNote.textContent = "Charged to the device ledger; sending…";
    const answer = await edge.send(p);  // charged (committed) before the request leaves
    if (answer.payloadJson !== payloadJson) {  // a memoized repeat: the stored payload left
      ui.payload.textContent = answer.payloadJson;
      shown = edge.asSent(p, answer.payloadJson);
      showTokens(shown.tokens, shown.unchanged);
    }
    ui.sentNote.textContent = answer.repeat
      ? "Sent again: a repeat of an earlier sentence sends the same payload and costs nothing."
      : "Sent: only these token ids (and the mechanism, η and bundle id).";
    const best = answer.prediction;
    ui.prediction.textContent = `${best.label} (` + Object.entries(best.scores)
      .map(([k, v]) => `${k} ${(v * 100).toFixed(1)}%`).join(", ") + `) — model ${answer.modelId}`;
    status("");
  } catch (err) {
    fail(err);
  } finally {
    busy = false;
    await showLedger().catch(fail);
    document.body.dataset.done = "1";  // for the browser test: this click is answered
    document.body.dataset.doneAt = String(performance.now());
    document.dispatchEvent(new Event("privbert-answered"));
    const p = shown;
    if (p !== null && ui.tokens.children.length) {  // after the answer is painted
      requestAnimationFrame(() => setTimeout(() => {
        if (shown === p) showTokenKinds(p);
      }, 0));
    }
    if (ui.error.hidden && measuredEta !== eta()) {
      // after the answer is painted: the measurement takes the main thread for a while
      requestAnimationFrame(() => setTimeout(refreshInversion, 0));
    }
  }
}

/** The inversion rate at the current η, measured in the page; newer runs supersede older. */
function refreshInversion(): void {
  if (!edge) return;
  const e = eta();
  const run = ++inversionRun;
  measuredEta = e;
  ui.inversion.textContent = "measuring…";
  edge.inversionRate(e).then((r) => {
    if (run !== inversionRun) return;
    ui.inversion.textContent = `${(r.rate * 100).toFixed(1)}% ± ${(r.se * 100).toFixed(1)}% ` +
      `of ${r.tokens} random regular tokens come out unchanged at η = ${e}`;
  }).catch((err) => {
    if (run === inversionRun) ui.inversion.textContent = `not measured: ${(err as Error).message}`;
  });
}

ui.go.addEventListener("click", () => void run(true));
ui.preview.addEventListener("click", () => void run(false));
ui.model.addEventListener("change", () => void selectModel().catch(fail));
ui.eta.addEventListener("change", () => {
  ui.etaRange.value = ui.eta.value;
});
ui.etaRange.addEventListener("change", () => {
  ui.eta.value = ui.etaRange.value;
});
ui.setCap.addEventListener("click", () => {
  if (!edge) return;
  const raw = ui.capInput.value.trim();
  const cap = raw === "" ? null : Number(raw);
  clearError();
  edge.setCap(cap).then(showLedger).catch(fail);
});

start().catch(fail);
