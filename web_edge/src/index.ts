/**
 * @privbert/edge: privbert's edge for browsers and Node. Web APIs only (Web Crypto, fetch,
 * IndexedDB, the Cache API); Node-only code (files, the command line) is in "@privbert/edge/node".
 */

export { EdgeBundle, peekBundleShape, type BundleMeta, type BundleShape } from "./bundle.js";
export {
  BUNDLE_BYTES_HEADER, PrivbertClient, type Audience, type BundleCache, type ClientOptions, type ModelInfo,
  type Prediction, type Progress, type ProgressCallback,
} from "./client.js";
export { DChiEmbedding, DChiText, checkDchiEta } from "./dchi.js";
export { ApiError, BudgetRefused, BundleError, RuntimeLoadError, TextError, WeakPrivacyError } from "./errors.js";
export {
  DChiFloor, THRESHOLD, checkDchiFloor, dchiWeakReason, gammaCdf, measureUnchanged, tableProblem, wilsonInterval,
  type FloorOptions,
} from "./floor.js";
export {
  BundleChanged, MemoryPinStore, TRUSTED_ENV, checkPin, checkTrusted, parseIds, pinnedBundle, serverKey,
  type PinOptions, type PinStore,
} from "./pins.js";
export { dequantize, type DesignedTable } from "./table.js";
export {
  Ledger, MemoKeys, MemoryLedgerStore, dchiCost, diameter, fits, fmtEps, total,
  type Charged, type Cost, type LedgerState, type LedgerStore, type MemoSetting, type Status,
} from "./ledger.js";
export { ExactNearest, LARGE_WORK, UPGRADE_WORK, searchUsesOrt, type NearestOptions } from "./nearest.js";
export { runtimeNeeded, warmUp, type WarmUpOptions } from "./warm_up.js";
export { WASM_FILE, configureRuntime, type WasmPaths } from "./ort.js";
export { recordLine, tokenPayloadJson, type FloatDtype } from "./payload.js";
export { Pcg64Source } from "./pcg64.js";
export {
  MECHANISMS, Privatizer, nTokens, segments, trimPair, type Mechanism, type PrivatizerOptions, type TokenizedText,
} from "./privatizer.js";
export { BitSource, CryptoSource } from "./random.js";
export { sampleDchiNoise, standardGamma, standardNormal } from "./samplers.js";
export { TextTokenizer } from "./tokenizer.js";
export { CacheApiBundleCache, IndexedDbLedgerStore, IndexedDbPinStore } from "./browser_stores.js";
export { guarantee, summary, type Guarantee } from "./accounting.js";
export { EdgeSession, type Sent, type SessionOptions } from "./session.js";
export type { EngineInfo } from "./engine.js";
export { Laplace, OME, SentenceEncoder, bitFlipEpsilon } from "./vector.js";
