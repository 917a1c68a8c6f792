/** User Timing entries ("privbert:…") for the phases of opening a bundle and a privatizer: a
 * page's performance panel (or a benchmark, by `performance.getEntriesByType("measure")`)
 * shows where the first privatization's time went. No-ops where User Timing is missing. */

export function now(): number {
  return globalThis.performance?.now() ?? 0;
}

/** A measure ``privbert:name`` from ``start`` (a {@link now} value) to now. */
export function measure(name: string, start: number): void {
  try {
    globalThis.performance?.measure?.(`privbert:${name}`, { start, end: now() });
  } catch {
    // an engine without User Timing level 3: nothing to record
  }
}
