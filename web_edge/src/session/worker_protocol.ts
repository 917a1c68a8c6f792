/**
 * The messages between an {@link EdgeSession} and its Worker (src/session/remote.ts, src/worker.ts):
 * requests `{ id, op, args }`, answers `{ id, ok, value | error }`, and `{ id, progress }`
 * while a bundle is opened. Errors keep their class and fields across (a TextError's index,
 * an ApiError's status), so a page catches the same errors in either mode.
 */

import { ApiError, BudgetRefused, BundleError, RuntimeLoadError, TextError, WeakPrivacyError } from "../errors.js";

export type Op = "open" | "privatize" | "decode" | "close";

export interface Request {
  id: number;
  op: Op;
  args: unknown;
}

export interface PlainError {
  name: string;
  message: string;
  index?: number;
  reason?: "empty" | "too_long";
  detail?: string;
  status?: number | null;
  type?: string | null;
  url?: string | null;
}

export type Reply =
  | { id: number; ok: true; value: unknown }
  | { id: number; ok: false; error: PlainError }
  | { id: number; progress: unknown };

/** An error as a plain object (structured clone keeps no class). */
export function plainError(exc: unknown): PlainError {
  if (!(exc instanceof Error)) return { name: "Error", message: String(exc) };
  const e = exc as Error & Partial<PlainError>;
  return { name: e.name, message: e.message, index: e.index, reason: e.reason, detail: e.detail,
    status: e.status, type: e.type, url: e.url };
}

/** The error again, of its class. */
export function revive(p: PlainError): Error {
  switch (p.name) {
    case "TextError": return new TextError(p.index ?? 0, p.reason ?? "empty", p.detail ?? p.message);
    case "WeakPrivacyError": return new WeakPrivacyError(p.message);
    case "BundleError": return new BundleError(p.message);
    case "BudgetRefused": return new BudgetRefused(p.message);
    case "ApiError": return new ApiError(p.message, p.status ?? null, p.type ?? null);
    case "RuntimeLoadError": return new RuntimeLoadError(p.message, p.url ?? null);
    case "RangeError": return new RangeError(p.message);
    case "TypeError": return new TypeError(p.message);
    default: {
      const e = new Error(p.message);
      e.name = p.name;
      return e;
    }
  }
}
