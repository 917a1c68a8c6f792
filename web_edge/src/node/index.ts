/** @privbert/edge/node: the Node-only parts (files, the command line). */
export { main } from "./cli.js";
export { FileLedgerStore, defaultLedgerPath, LEDGER_ENV, checkPrivate, resolvedPath } from "./file_ledger.js";
export { nodeClock, bootClock, processClock } from "./clock.js";
export { DirBundleCache, FileTextFloorCache, cacheRoot, loadBundleDir, CACHE_ENV } from "./caches.js";
export { FilePinStore, PINS_FILE } from "./pins.js";
export { nodeHandler } from "./forwarder_node.js";
export { contentNamed, staticFiles, type StaticOptions } from "./static_files.js";
export { ortWasmPath } from "./wasm_file.js";
