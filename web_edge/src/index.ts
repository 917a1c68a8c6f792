/**
 * @privbert/edge: privbert's edge for browsers and Node. Web APIs only (Web Crypto, fetch,
 * IndexedDB, the Cache API); Node-only code (files, the command line) is in "@privbert/edge/node".
 */

export { EdgeBundle, peekBundleShape, type BundleMeta, type BundleShape } from "./bundle/bundle.js";
export {
  BUNDLE_BYTES_HEADER, PrivbertClient, type Audience, type BundleCache, type ClientOptions, type ModelInfo,
  type Prediction, type Progress, type ProgressCallback,
} from "./service/client.js";
export { DChiEmbedding, DChiText, checkDchiEta } from "./mechanisms/dchi.js";
export { ApiError, BudgetRefused, BundleError, RuntimeLoadError, TextError, WeakPrivacyError } from "./errors.js";
export {
  DChiFloor, THRESHOLD, checkDchiFloor, dchiWeakReason, gammaCdf, measureUnchanged, tableProblem, wilsonInterval,
  type FloorOptions,
} from "./floor/floor.js";
export {
  BundleChanged, MemoryPinStore, TRUSTED_ENV, checkPin, checkTrusted, parseIds, pinnedBundle, serverKey,
  type PinOptions, type PinStore,
} from "./service/pins.js";
export { dequantize, type DesignedTable } from "./bundle/table.js";
export {
  Ledger, MemoKeys, MemoryLedgerStore, dchiCost, diameter, fits, fmtEps, total,
  type Charged, type Cost, type LedgerState, type LedgerStore, type MemoSetting, type Status,
} from "./ledger/ledger.js";
export { ExactNearest, LARGE_WORK, UPGRADE_WORK, searchUsesOrt, type NearestOptions } from "./search/nearest.js";
export { runtimeNeeded, warmUp, type WarmUpOptions } from "./runtime/warm_up.js";
export { WASM_FILE, configureRuntime, type WasmPaths } from "./runtime/ort.js";
export { recordLine, tokenPayloadJson, type FloatDtype } from "./service/payload.js";
export { Pcg64Source } from "./random/pcg64.js";
export {
  MECHANISMS, Privatizer, nTokens, segments, trimPair, type Mechanism, type PrivatizerOptions, type TokenizedText,
} from "./mechanisms/privatizer.js";
export { BitSource, CryptoSource } from "./random/random.js";
export { sampleDchiNoise, standardGamma, standardNormal } from "./random/samplers.js";
export { TextTokenizer } from "./bundle/tokenizer.js";
export { CacheApiBundleCache, IndexedDbLedgerStore, IndexedDbPinStore } from "./session/browser_stores.js";
export { guarantee, summary, type Guarantee } from "./ledger/accounting.js";
export { EdgeSession, type Sent, type SessionOptions } from "./session/session.js";
export type { EngineInfo } from "./session/engine.js";
export { Laplace, OME, SentenceEncoder, bitFlipEpsilon } from "./mechanisms/vector.js";
