/**
 * @privbert/edge: privbert's edge for browsers and Node. Web APIs only (Web Crypto, fetch,
 * IndexedDB, the Cache API); Node-only code (files, the command line) is in "@privbert/edge/node".
 *
 * The public surface is what README.md's "Public API" documents, and the types its signatures
 * name; everything else is internal (tests import the built modules under dist/ directly).
 */

export { ApiError, BudgetRefused, BundleError, RuntimeLoadError, TextError, WeakPrivacyError } from "./errors.js";

export { EdgeBundle, type BundleMeta, type BundleShape } from "./bundle/bundle.js";
export { TokenPolicy, keptPublic } from "./bundle/policy.js";
export {
  PrivbertClient, type Audience, type BundleCache, type ClientOptions, type ModelInfo, type Prediction, type Progress,
  type ProgressCallback,
} from "./service/client.js";
export {
  BundleChanged, MemoryPinStore, checkPin, checkVouched, parseIds, pinnedBundle, serverKey, type PinOptions,
  type PinStore,
} from "./service/pins.js";
export type { FloatDtype } from "./service/payload.js";

export { EdgeSession, type Sent, type SessionOptions } from "./session/session.js";
export type { EngineInfo } from "./session/engine.js";
export {
  CacheApiBundleCache, IndexedDbLedgerStore, IndexedDbPinStore, IndexedDbTextFloorCache,
} from "./session/browser_stores.js";
export { KNOWN, trust, trustNote, vouched, type Trust, type TrustKind } from "./bundle/trust.js";
export {
  checkTextFloor, measureText, textFloorReason, type TextFloorOptions, type TextFloorResult, type TextMeasure,
} from "./floor/text_floor.js";
export { MemoryTextFloorCache, type TextFloorCache } from "./floor/text_floor_cache.js";

export { DChiEmbedding, DChiText } from "./mechanisms/dchi.js";
export { Laplace } from "./mechanisms/laplace.js";
export { OME } from "./mechanisms/ome.js";
export { SentenceEncoder } from "./mechanisms/encoder.js";
export { Privatizer, type Mechanism, type PrivatizerOptions } from "./mechanisms/privatizer.js";
export { nTokens, type TokenizedText } from "./mechanisms/tokens.js";
export { DEFAULT_MECHANISM, mechanismModule, mechanismNames } from "./mechanisms/registry.js";
export { predictMaxLength } from "./mechanisms/specs.js";
export type { BoundMechanism, BuildOptions, MechanismModule, Params, PrivatizedData } from "./mechanisms/module.js";

export {
  DChiFloor, checkDchiFloor, dchiWeakReason, floorTokens, measureUnchanged, tableProblem, wilsonInterval,
  type FloorOptions,
} from "./floor/floor.js";

export {
  Ledger, MemoryLedgerStore, dchiCost, diameter, epsilonCost, fits, total, type Charged, type Cost, type LedgerState,
  type LedgerStore, type MemoKeys, type MemoSetting, type Status,
} from "./ledger/ledger.js";
export {
  dropoutEpsilon, epsilonGuarantee, guarantee, summary, type AnyGuarantee, type EpsilonGuarantee, type Guarantee,
  type PolicyClause,
} from "./ledger/accounting.js";

export { ExactNearest, LARGE_WORK, UPGRADE_WORK, searchUsesOrt, type NearestOptions } from "./search/nearest.js";
export { runtimeNeeded, warmUp, type WarmUpOptions } from "./runtime/warm_up.js";
export { configureRuntime, type WasmPaths } from "./runtime/ort.js";

export { BitSource, CryptoSource } from "./random/random.js";
export { Pcg64Source } from "./random/pcg64.js";
export { sampleDchiNoise, standardGamma, standardNormal } from "./random/samplers.js";
