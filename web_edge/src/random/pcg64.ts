/**
 * A seeded source that reproduces `numpy.random.default_rng(seed)` bit for bit: numpy's
 * SeedSequence (entropy pool of four 32-bit words) and PCG64 (128-bit LCG, XSL-RR output;
 * O'Neill 2014), including numpy's buffering of 32-bit draws. With it, a seeded run of the web
 * edge draws the same noise as the Python edge with the same seed (the conformance tests check
 * it), and the privacy floor picks the same (token, direction) pairs as `shared.floor`.
 *
 * A seed makes the noise predictable: anyone who knows it can remove the protection. Use it for
 * tests and experiments only.
 */

import { BitSource } from "./random.js";

const MASK32 = 0xffffffffn;
const MASK128 = (1n << 128n) - 1n;
const MULT = (2549297995355413924n << 64n) | 4865540595714422341n;

const INIT_A = 0x43b0d7e5;
const MULT_A = 0x931e8875;
const INIT_B = 0x8b51f9dd;
const MULT_B = 0x58f38ded;
const MIX_MULT_L = 0xca01f9dd;
const MIX_MULT_R = 0x4973f715;
const POOL_SIZE = 4;

/** `seed` as little-endian uint32 words (numpy's `_int_to_uint32_array`). */
function seedWords(seed: bigint): number[] {
  if (seed < 0n) throw new Error("seed must be a non-negative integer");
  if (seed === 0n) return [0];
  const out: number[] = [];
  for (let n = seed; n > 0n; n >>= 32n) out.push(Number(n & MASK32));
  return out;
}

/** numpy's SeedSequence(seed).generate_state(nWords, uint32). */
export function seedSequenceState(seed: bigint, nWords: number): Uint32Array {
  const entropy = seedWords(seed);
  const pool = new Uint32Array(POOL_SIZE);
  let hashConst = INIT_A;
  const hashmix = (value: number): number => {
    value = (value ^ hashConst) >>> 0;
    hashConst = Math.imul(hashConst, MULT_A) >>> 0;
    value = Math.imul(value, hashConst) >>> 0;
    return (value ^ (value >>> 16)) >>> 0;
  };
  const mix = (x: number, y: number): number => {
    const r = (Math.imul(MIX_MULT_L, x) - Math.imul(MIX_MULT_R, y)) >>> 0;
    return (r ^ (r >>> 16)) >>> 0;
  };
  for (let i = 0; i < POOL_SIZE; i++) pool[i] = hashmix(i < entropy.length ? entropy[i]! : 0);
  for (let src = 0; src < POOL_SIZE; src++) {
    for (let dst = 0; dst < POOL_SIZE; dst++) {
      if (src !== dst) pool[dst] = mix(pool[dst]!, hashmix(pool[src]!));
    }
  }
  for (let src = POOL_SIZE; src < entropy.length; src++) {
    for (let dst = 0; dst < POOL_SIZE; dst++) pool[dst] = mix(pool[dst]!, hashmix(entropy[src]!));
  }
  const out = new Uint32Array(nWords);
  let hc = INIT_B;
  for (let i = 0; i < nWords; i++) {
    let v = (pool[i % POOL_SIZE]! ^ hc) >>> 0;
    hc = Math.imul(hc, MULT_B) >>> 0;
    v = Math.imul(v, hc) >>> 0;
    out[i] = (v ^ (v >>> 16)) >>> 0;
  }
  return out;
}

/** The 128-bit multiplier as eight 16-bit limbs, least significant first. */
const MULT_LIMBS = limbs16(MULT);

function limbs16(v: bigint): number[] {
  const out: number[] = [];
  for (let k = 0; k < 8; k++) out.push(Number((v >> BigInt(16 * k)) & 0xffffn));
  return out;
}

/** `numpy.random.default_rng(seed)`'s bit generator (PCG64), as a {@link BitSource}. The
 * 128-bit state is kept in eight 16-bit limbs (exact in doubles; no BigInt on the hot path). */
export class Pcg64Source extends BitSource {
  private readonly state = new Array<number>(8).fill(0);
  private readonly inc: number[];
  private readonly acc = new Array<number>(8).fill(0);
  private hasUint32 = false;
  private uinteger = 0;

  constructor(seed: number | bigint) {
    super();
    if (typeof seed === "number" && !Number.isSafeInteger(seed)) {
      throw new Error(`seed must be an integer, got ${seed}`);
    }
    const s = typeof seed === "bigint" ? seed : BigInt(seed);
    const w = seedSequenceState(s, 8);
    const u64 = (k: number): bigint => (BigInt(w[2 * k + 1]!) << 32n) | BigInt(w[2 * k]!);
    const initState = (u64(0) << 64n) | u64(1);
    const initSeq = (u64(2) << 64n) | u64(3);
    const inc = ((initSeq << 1n) | 1n) & MASK128;
    this.inc = limbs16(inc);
    // state = 0; step; state += initstate; step (pcg_setseq_128_srandom_r)
    let st = inc & MASK128;
    st = (st + initState) & MASK128;
    st = (st * MULT + inc) & MASK128;
    const l = limbs16(st);
    for (let k = 0; k < 8; k++) this.state[k] = l[k]!;
  }

  /** state = state · MULT + inc (mod 2^128). */
  private step(): void {
    const a = this.state;
    const acc = this.acc;
    for (let k = 0; k < 8; k++) {
      let sum = this.inc[k]!;
      for (let i = 0; i <= k; i++) sum += a[i]! * MULT_LIMBS[k - i]!;
      acc[k] = sum;
    }
    let carry = 0;
    for (let k = 0; k < 8; k++) {
      const v = acc[k]! + carry;
      const low = v % 65536;
      a[k] = low;
      carry = (v - low) / 65536;
    }
  }

  /** PCG64's next output (XSL-RR of the stepped state) into hi, lo. */
  private output(): void {
    this.step();
    const a = this.state;
    const w0 = a[0]! + a[1]! * 65536;
    const w1 = a[2]! + a[3]! * 65536;
    const w2 = a[4]! + a[5]! * 65536;
    const w3 = a[6]! + a[7]! * 65536;
    let xl = (w0 ^ w2) >>> 0;
    let xh = (w1 ^ w3) >>> 0;
    let rot = w3 >>> 26;
    if (rot >= 32) {
      const t = xl;
      xl = xh;
      xh = t;
      rot -= 32;
    }
    if (rot === 0) {
      this.lo = xl;
      this.hi = xh;
    } else {
      this.lo = ((xl >>> rot) | (xh << (32 - rot))) >>> 0;
      this.hi = ((xh >>> rot) | (xl << (32 - rot))) >>> 0;
    }
  }

  next64(): void {
    this.output();
  }

  next32(): number {
    if (this.hasUint32) {
      this.hasUint32 = false;
      return this.uinteger;
    }
    this.output();
    this.hasUint32 = true;
    this.uinteger = this.hi;
    return this.lo;
  }
}
