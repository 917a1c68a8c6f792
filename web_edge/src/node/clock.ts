/**
 * The per-day window's monotonic clock in Node (ledger.ts, {@link MonotonicClock}): on Linux the
 * boot clock (`/proc/uptime`: CLOCK_BOOTTIME, suspend counted), one epoch per boot named by
 * `/proc/sys/kernel/random/boot_id`, so runs of the CLI share it as edge-agent's do; elsewhere
 * `process.hrtime`, one epoch per process.
 */

import { readFileSync } from "node:fs";

import type { MonotonicClock } from "../ledger/ledger.js";

const BOOT_ID = "/proc/sys/kernel/random/boot_id";
const UPTIME = "/proc/uptime";

function uptimeMs(): number {
  const s = Number(readFileSync(UPTIME, "ascii").split(" ")[0]);
  if (!Number.isFinite(s) || s < 0) throw new Error(`${UPTIME}: not a time`);
  return s * 1000;
}

/** The boot clock where the system has one (Linux), else null. */
export function bootClock(): MonotonicClock | null {
  try {
    const epoch = readFileSync(BOOT_ID, "ascii").trim();
    uptimeMs();
    return epoch ? { epoch, sinceBoot: true, read: uptimeMs } : null;
  } catch {
    return null;
  }
}

/** process.hrtime, one epoch per process. */
export function processClock(): MonotonicClock {
  const epoch = `process:${Array.from(crypto.getRandomValues(new Uint8Array(8)), (b) => b.toString(16).padStart(2, "0")).join("")}`;
  return { epoch, sinceBoot: false, read: () => Number(process.hrtime.bigint()) / 1e6 };
}

let once: MonotonicClock | null = null;

/** This process's clock: the boot clock where there is one, else {@link processClock}. */
export function nodeClock(): MonotonicClock {
  once ??= bootClock() ?? processClock();
  return once;
}
