/**
 * Sources of random bits for the mechanisms.
 *
 * Every sampler takes a {@link BitSource}. Without one, the mechanisms use
 * {@link CryptoSource}: fresh OS entropy from `crypto.getRandomValues` (Web Crypto; Node ≥ 20
 * has it as `globalThis.crypto`). The noise protects people only if nobody can predict it, so
 * there is no module-level seeded default: a seeded source ({@link Pcg64Source}) is used only
 * when a caller passes one (tests, reproducible experiments).
 */

const TWO_POW_21 = 2 ** 21;
const TWO_POW_M53 = 2 ** -53;

/** 64 random bits at a time (as two 32-bit halves), 32 at a time, and doubles in [0, 1). */
export abstract class BitSource {
  /** High and low 32 bits of the last {@link next64} draw. */
  hi = 0;
  lo = 0;

  /** Draw 64 bits into {@link hi} and {@link lo}. */
  abstract next64(): void;

  /** 32 random bits as an unsigned integer. */
  abstract next32(): number;

  /** A double in [0, 1) with 53 random bits: (u64 >> 11) · 2^-53, as numpy's next_double. */
  nextDouble(): number {
    this.next64();
    return (this.hi * TWO_POW_21 + (this.lo >>> 11)) * TWO_POW_M53;
  }
}

/** The Web Crypto API's `getRandomValues` (browsers, Node ≥ 20). */
function getRandomValues(): (a: Uint32Array) => Uint32Array {
  const c = (globalThis as { crypto?: Crypto }).crypto;
  if (!c || typeof c.getRandomValues !== "function") {
    throw new Error("no crypto.getRandomValues here: the edge needs OS entropy (Web Crypto)");
  }
  return (a) => c.getRandomValues(a);
}

/** OS entropy from `crypto.getRandomValues`, read 64 KiB at a time (its per-call limit). */
export class CryptoSource extends BitSource {
  private readonly buf = new Uint32Array(16384);
  private pos = this.buf.length;
  private readonly fill = getRandomValues();

  private word(): number {
    if (this.pos === this.buf.length) {
      this.fill(this.buf);
      this.pos = 0;
    }
    return this.buf[this.pos++]!;
  }

  next64(): void {
    this.lo = this.word();
    this.hi = this.word();
  }

  next32(): number {
    return this.word();
  }
}

/** The source to use: the caller's, else fresh OS entropy. */
export function resolveSource(source?: BitSource | null): BitSource {
  return source ?? new CryptoSource();
}
