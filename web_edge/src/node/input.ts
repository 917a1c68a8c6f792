/**
 * Input lines for `privbert-edge privatize` (edge_agent/privatize/lines.py): one record per
 * line, strict UTF-8, in batches of 16, 32, 64 … up to the batch size (the Python edge's sizes,
 * so that a seeded run draws the same noise per batch). With ``tsv``: text<TAB>label or
 * text_a<TAB>text_b<TAB>label; a first line whose last column is "label" is a header. Messages
 * name the line and never repeat its text.
 */

export class InputError extends Error {}

export interface Line {
  number: number;
  text: string;
  textB: string | null;
  label: number | string | null;
}

export interface Batch {
  lines: Line[];
  /** numbers of empty lines (skipped and counted) */
  empty: number[];
  /** the error that ends the input after these lines */
  error: InputError | null;
}

const INT = /^[+-]?\d+$/;
// Python's str.isspace characters (str.strip() removes them): JS's trim() differs (\x1c-\x1f,
// \x85 are Python whitespace; \ufeff is not)
// eslint-disable-next-line no-control-regex -- \x1c-\x1f are Python whitespace
const PY_SPACE = /^[\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*$/;

/** Whether Python's ``not text.strip()`` holds. */
export function isBlank(text: string): boolean {
  return PY_SPACE.test(text);
}

/** ``text.strip()`` as Python strips. */
function pyStrip(text: string): string {
  // eslint-disable-next-line no-control-regex -- \x1c-\x1f are Python whitespace
  return text.replace(/^[\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+|[\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+$/g, "");
}
const LABEL = /^[A-Za-z0-9_.:-]{1,64}$/;

export function parseLabel(raw: string, n: number): number | string {
  const r = pyStrip(raw);
  if (INT.test(r)) {
    const digits = r.replace(/^[+-]/, "");
    if (digits.replace(/^0+/, "").length <= 10 && Math.abs(Number(r)) < 2 ** 31) return Number(r);
    throw new InputError(`line ${n}: integer label of ${digits.length} digit(s) is out of range (labels are int32: |label| < 2**31)`);
  }
  if (LABEL.test(r)) return r;
  const what = r ? `has ${r.length} character(s)` : "is empty";
  throw new InputError(`line ${n}: the label column ${what}: neither an integer nor a short class name `
    + "(letters, digits, _.:-, at most 64); is the label the last column?");
}

export function* batchSizes(largest: number, first = 16): Generator<number> {
  let size = Math.max(1, Math.min(first, largest));
  for (;;) {
    yield size;
    size = Math.min(size * 2, largest);
  }
}

/** Batches of the lines of ``data`` (the whole input's bytes). */
export function* batches(data: Uint8Array, opts: { tsv: boolean; header: "auto" | "yes" | "no"; batchSize: number }): Generator<Batch> {
  const decoder = new TextDecoder("utf-8", { fatal: true });
  const sizes = batchSizes(opts.batchSize);
  let size = sizes.next().value as number;
  let batch: Batch = { lines: [], empty: [], error: null };
  let columns: number | null = null;
  let start = 0;
  let n = 0;
  while (start < data.length) {
    let end = data.indexOf(0x0a, start);
    if (end < 0) end = data.length;
    n++;
    let raw = data.subarray(start, end);
    start = end + 1;
    if (raw.length && raw[raw.length - 1] === 0x0d) raw = raw.subarray(0, raw.length - 1);
    let text: string;
    try {
      text = decoder.decode(raw);
    } catch {
      batch.error = new InputError(`line ${n}: not valid UTF-8; convert the input to UTF-8`);
      yield batch;
      return;
    }
    if (n === 1 && text.startsWith("\ufeff")) text = text.slice(1);
    let line: Line | null = null;
    try {
      if (!opts.tsv) {
        line = isBlank(text) ? null : { number: n, text, textB: null, label: null };
      } else if (!isBlank(text)) {
        const cols = text.split("\t");
        const header = n === 1 && (opts.header === "yes" || (opts.header === "auto" && pyStrip(cols[cols.length - 1]!).toLowerCase() === "label"));
        if (header) continue;
        if (cols.length !== 2 && cols.length !== 3) {
          throw new InputError(`line ${n}: expected text<TAB>label or text_a<TAB>text_b<TAB>label, found ${cols.length} column(s)`);
        }
        if (columns === null) columns = cols.length;
        else if (cols.length !== columns) throw new InputError(`line ${n}: ${cols.length} columns where earlier lines have ${columns}`);
        const label = parseLabel(cols[cols.length - 1]!, n);
        if (!isBlank(cols[0]!) && (cols.length === 2 || !isBlank(cols[1]!))) {
          line = { number: n, text: cols[0]!, textB: cols.length === 3 ? cols[1]! : null, label };
        }
      }
    } catch (exc) {
      batch.error = exc as InputError;
      yield batch;
      return;
    }
    if (line === null) batch.empty.push(n);
    else batch.lines.push(line);
    if (batch.lines.length >= size) {
      yield batch;
      batch = { lines: [], empty: [], error: null };
      size = sizes.next().value as number;
    }
  }
  if (batch.lines.length || batch.empty.length) yield batch;
}
