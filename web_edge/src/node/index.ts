/** @privbert/edge/node: the Node-only parts (files, the command line). */
export { main } from "./cli.js";
export { FileLedgerStore, defaultLedgerPath, LEDGER_ENV } from "./file_ledger.js";
export { DirBundleCache, cacheRoot, loadBundleDir, CACHE_ENV } from "./caches.js";
export { FilePinStore, PINS_FILE } from "./pins.js";
