/** The errors of the web edge: each message is one line that says what to do. */

/** A bundle that cannot be used: missing or corrupted file, wrong hash, wrong format. */
export class BundleError extends Error {
  override name = "BundleError";
}

/** Parameters weaker than the privacy floor (shared.floor.WeakPrivacyError). */
export class WeakPrivacyError extends RangeError {
  override name = "WeakPrivacyError";
}

/** The privacy budget refuses (spent + needed would pass the cap, or the ledger cannot be
 * written): nothing was sent. */
export class BudgetRefused extends Error {
  override name = "BudgetRefused";
}

/** An error answer of the service, or no answer; `partial` holds what earlier requests of
 * the same call returned. */
export class ApiError extends Error {
  override name = "ApiError";
  partial: unknown[] = [];
  constructor(message: string, readonly status: number | null = null,
              readonly type: string | null = null) {
    super(message);
  }
}

/** A text that cannot be privatized (empty, or over the length limit with truncation
 * "error"); `index` is its position in the batch. */
export class TextError extends RangeError {
  override name = "TextError";
  constructor(readonly index: number, readonly reason: "empty" | "too_long", readonly detail: string) {
    super(`text ${index + 1} ${detail}`);
  }
}

/** onnxruntime-web's WebAssembly could not be loaded: `url` is the URL tried (null when the
 * page could not tell, or in Node); the message says what came back and how to fix it. */
export class RuntimeLoadError extends Error {
  override name = "RuntimeLoadError";
  constructor(message: string, readonly url: string | null) {
    super(message);
  }
}
