/**
 * The sentence-vector mechanisms' common part, as edge_agent/privatize/privatizer.py: the
 * bundle's frozen encoder (`encoder.onnx`, run by onnxruntime-web) on `[CLS] a [SEP] (b [SEP])`,
 * after DPNR word dropout where the mechanism has it (each word, with all its word pieces,
 * removed with probability μ), then the mechanism on the (b, r) vectors; one payload of one
 * array per text. The costs are shared/ledger.py's (the worst-case ε per payload).
 *
 * Draw order is numpy's, so a seeded source draws what the Python edge draws; the encoder's
 * WebAssembly arithmetic differs from onnxruntime's native kernels in the last bits.
 */

import type { EdgeBundle } from "../bundle/bundle.js";
import type { MechanismName } from "../generated/spec.js";
import { epsilonGuarantee, type EpsilonGuarantee } from "../ledger/accounting.js";
import { epsilonCost, type Cost } from "../ledger/ledger.js";
import { loadOrt } from "../runtime/ort.js";
import { resolveSource, type BitSource } from "../random/random.js";
import { payloadJson, type PayloadArray } from "../service/payload.js";
import type { BoundMechanism, Params, PrivatizedData } from "./module.js";
import { SPEC_NAMES, usesEncoder } from "./specs.js";
import type { TokenizedText } from "./tokens.js";

/** "laplace, ome and texthide": the mechanisms of the spec that run the encoder */
const ENCODER_NAMES = ((names: string[]) => names.length > 1
  ? `${names.slice(0, -1).join(", ")} and ${names[names.length - 1]!}` : names.join(""))(SPEC_NAMES.filter(usesEncoder));

/** The bundle's frozen sentence encoder (contract: input_ids, attention_mask, token_type_ids
 * int64 [batch, seq] right-padded with [PAD]; output sentence_embedding float32 [batch, r]). */
export class SentenceEncoder {
  private constructor(private readonly session: import("onnxruntime-web").InferenceSession,
                      private readonly ort: typeof import("onnxruntime-web"),
                      readonly padId: number, readonly outputDim: number,
                      readonly maxLength: number | null, readonly feeds: string[]) {}

  /** The encoder's own length limit as ``bundle`` declares it (null: none). */
  static declaredMaxLength(bundle: EdgeBundle): number | null {
    const desc = bundle.meta.encoder;
    return desc && typeof desc.max_length === "number" ? desc.max_length : null;
  }

  static async fromBundle(bundle: EdgeBundle, threads = 1): Promise<SentenceEncoder> {
    const desc = bundle.meta.encoder;
    if (bundle.encoderOnnx === null || !desc || typeof desc.output_dim !== "number") {
      throw new RangeError(`bundle ${bundle.bundleId.slice(0, 12)}… has no encoder.onnx; ${ENCODER_NAMES} need a bundle with the frozen sentence encoder (made by \`cloud-api export-bundle\`, or fetched with --server)`);
    }
    const ort = await loadOrt(threads);
    const session = await ort.InferenceSession.create(bundle.encoderOnnx, { executionProviders: ["wasm"] });
    const need = ["input_ids", "attention_mask", "token_type_ids"];
    if (!need.filter((n) => n !== "token_type_ids").every((n) => session.inputNames.includes(n))
        || !session.outputNames.includes("sentence_embedding")) {
      throw new RangeError(`encoder.onnx does not follow the contract: inputs ${JSON.stringify(session.inputNames)}, outputs ${JSON.stringify(session.outputNames)}`);
    }
    return new SentenceEncoder(session, ort, bundle.meta.special_ids.pad!, desc.output_dim,
      SentenceEncoder.declaredMaxLength(bundle), need.filter((n) => session.inputNames.includes(n)));
  }

  /** Sentence vectors (b × r float32) of full input sequences ([CLS] … [SEP]). */
  async encode(seqs: number[][], types: number[][]): Promise<Float32Array> {
    const r = this.outputDim;
    const out = new Float32Array(seqs.length * r);
    const order = seqs.map((s, i) => [s.length, i] as const).sort((a, b) => a[0] - b[0] || a[1] - b[1]).map((x) => x[1]);
    for (let s0 = 0; s0 < order.length; s0 += 64) {
      const idx = order.slice(s0, s0 + 64);
      const width = Math.max(...idx.map((i) => seqs[i]!.length));
      const ids = new BigInt64Array(idx.length * width).fill(BigInt(this.padId));
      const mask = new BigInt64Array(idx.length * width);
      const tt = new BigInt64Array(idx.length * width);
      idx.forEach((i, row) => {
        seqs[i]!.forEach((v, k) => {
          ids[row * width + k] = BigInt(v);
          mask[row * width + k] = 1n;
          tt[row * width + k] = BigInt(types[i]![k]!);
        });
      });
      const dims = [idx.length, width];
      const all: Record<string, import("onnxruntime-web").Tensor> = {
        input_ids: new this.ort.Tensor("int64", ids, dims), attention_mask: new this.ort.Tensor("int64", mask, dims),
        token_type_ids: new this.ort.Tensor("int64", tt, dims),
      };
      const res = await this.session.run(Object.fromEntries(this.feeds.map((n) => [n, all[n]!])));
      const vec = res.sentence_embedding!;
      if (vec.dims.length !== 2 || vec.dims[0] !== idx.length || vec.dims[1] !== r) {
        throw new RangeError(`encoder.onnx returned shape [${vec.dims.join(", ")}] for a batch of ${idx.length}; expected (batch, ${r})`);
      }
      const data = vec.data as Float32Array;
      idx.forEach((i, row) => out.set(data.subarray(row * r, (row + 1) * r), i * r));
    }
    if (!out.every(Number.isFinite)) throw new RangeError("encoder.onnx returned NaN or Inf");
    return out;
  }

  async release(): Promise<void> {
    await this.session.release();
  }
}

/** The longest input of a sentence-vector mechanism on ``bundle``: the bundle's, within the
 * encoder's own limit. */
export function encoderLengthLimit(bundle: EdgeBundle): number {
  return Math.min(bundle.maxLength, SentenceEncoder.declaredMaxLength(bundle) ?? bundle.maxLength);
}

/** Encoder inputs [CLS] a [SEP] (b [SEP]) and token types of ``items``, after word dropout at
 * rate ``mu`` (one draw per word, a's then b's, item by item: numpy's order). */
export function encoderInputs(items: readonly TokenizedText[], bundle: EdgeBundle, mu: number,
                              src: BitSource): { seqs: number[][]; types: number[][] } {
  const sp = bundle.meta.special_ids;
  const drop = (ids: number[], words: number[] | undefined | null): number[] => {
    if (mu <= 0 || ids.length === 0) return ids;
    const nw = words![words!.length - 1]! + 1;
    const keep = Array.from({ length: nw }, () => src.nextDouble() >= mu);
    return ids.filter((_, k) => keep[words![k]!]);
  };
  const seqs: number[][] = [];
  const types: number[][] = [];
  for (const it of items) {
    const a = drop(it.idsA, it.wordsA);
    const b = it.idsB === null ? null : drop(it.idsB, it.wordsB);
    const first = [sp.cls!, ...a, sp.sep!];
    if (b === null) {
      seqs.push(first);
      types.push(first.map(() => 0));
    } else {
      const second = [...b, sp.sep!];
      seqs.push([...first, ...second]);
      types.push([...first.map(() => 0), ...second.map(() => 1)]);
    }
  }
  return { seqs, types };
}

/** A sentence-vector mechanism on one bundle: the encoder, then ``perturb`` on the vectors. */
export abstract class EncoderBound implements BoundMechanism {
  readonly floor: Promise<string | null>;

  /** ``weak``: the floor's reason (the analytic check, decided before this is built) */
  constructor(readonly name: MechanismName, readonly bundle: EdgeBundle, readonly encoder: SentenceEncoder,
              readonly sampler: unknown, readonly params: Params, weak: string | null) {
    this.floor = Promise.resolve(weak);
  }

  /** the DPNR word dropout rate (0: none) */
  get wordDropout(): number {
    return 0;
  }

  get needsWords(): boolean {
    return this.wordDropout > 0;
  }

  /** the worst-case ε of one payload (what the ledger charges) */
  abstract worstEpsilon(): number;

  /** the ε the mechanism's paper publishes */
  abstract publishedEpsilon(): number;

  /** The mechanism on the encoder's vectors (b × r): the payload's values for each text. */
  protected abstract perturb(vecs: Float32Array, src: BitSource): PrivatizedData;

  /** Text i's payload array from ``data``. */
  protected abstract array(data: PrivatizedData, i: number): PayloadArray;

  cost(): Cost {
    return epsilonCost(this.name, this.worstEpsilon());
  }

  guarantee(): EpsilonGuarantee {
    return epsilonGuarantee(this.name, this.params, this.publishedEpsilon(), this.worstEpsilon());
  }

  async privatize(items: readonly TokenizedText[], source?: BitSource | null): Promise<PrivatizedData> {
    const src = resolveSource(source);
    const { seqs, types } = encoderInputs(items, this.bundle, this.wordDropout, src);
    return this.perturb(await this.encoder.encode(seqs, types), src);
  }

  payloads(items: readonly TokenizedText[], data: PrivatizedData): string[] {
    return items.map((_, i) => payloadJson(this.name, this.params, this.bundle.bundleId, this.array(data, i)));
  }

  async release(): Promise<void> {
    await this.encoder.release();
  }
}

/** ``make(encoder)`` on the bundle's encoder, released again when it throws. */
export async function withEncoder<T>(bundle: EdgeBundle, threads: number | undefined,
                                     make: (encoder: SentenceEncoder) => T): Promise<T> {
  const encoder = await SentenceEncoder.fromBundle(bundle, threads ?? 1);
  try {
    return make(encoder);
  } catch (exc) {
    await encoder.release();
    throw exc;
  }
}
