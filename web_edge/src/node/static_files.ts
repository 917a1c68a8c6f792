/**
 * A web app's own files (its page, scripts, onnxruntime-web's WebAssembly) from a folder, for a
 * Node backend such as the forwarder template (examples/forwarder.mjs): every file compressed
 * for the browser that accepts it, cached by the browser, revalidated cheaply.
 *
 * - Compressed: a build's own copy beside the file (`x.br`, `x.gz`: Vite's compression plugin,
 *   `cloud-api`'s demo build) when the browser accepts that encoding; else, for a text or
 *   WebAssembly file, brotli (or gzip) made here once per file version and kept in memory.
 * - Cached: a file named by its content (a hash in its name, as Vite, webpack's
 *   `[contenthash]` and esbuild's `[hash]` write it: {@link contentNamed}) is
 *   `Cache-Control: public, max-age=31536000, immutable`, so a second visit does not ask for
 *   it; any other file is `no-cache` with an `ETag` and `Last-Modified`, so a second visit gets
 *   a 304 of a few hundred bytes.
 * - Only files under the folder; anything else is a 404.
 */

import { createHash } from "node:crypto";
import { existsSync, readFileSync, statSync, type Stats } from "node:fs";
import type { IncomingMessage, ServerResponse } from "node:http";
import { extname, join, normalize, resolve, sep } from "node:path";
import { brotliCompressSync, constants, gzipSync } from "node:zlib";

const TYPES: Readonly<Record<string, string>> = {
  ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".mjs": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8", ".json": "application/json", ".map": "application/json", ".wasm": "application/wasm",
  ".svg": "image/svg+xml", ".txt": "text/plain; charset=utf-8", ".ico": "image/x-icon", ".png": "image/png",
};
/** what is worth compressing (images are compressed already) */
const COMPRESSIBLE = new Set([".html", ".js", ".mjs", ".css", ".json", ".map", ".wasm", ".svg", ".txt"]);
const IMMUTABLE = "public, max-age=31536000, immutable";
const SMALL = 1024;

/**
 * Whether ``file``'s name carries a hash of its content: a part of 8 or more letters, digits,
 * `_` or `-` right before the extension, after a `-` or `.`, with a digit or a capital in it
 * (`index-CL3PAaPt.js`, `1a2b3c4d5e6f7a8b.wasm`, `page.8c1f2e3a.js`; not `ort-wasm-simd-threaded.wasm`).
 */
export function contentNamed(file: string): boolean {
  const name = file.slice(file.lastIndexOf("/") + 1);
  const m = /(?:^|[-.])([A-Za-z0-9_]{8,})\.[A-Za-z0-9]+$/.exec(name);
  return m !== null && /[0-9A-Z]/.test(m[1]!);
}

export interface StaticOptions {
  /** which files are named by their content (immutable); default {@link contentNamed} */
  immutable?: (path: string) => boolean;
  /** file versions whose compressed copies are kept in memory (default 64) */
  keep?: number;
}

/** Whether an Accept-Encoding value admits ``coding`` (q > 0). */
function accepts(header: string | undefined, coding: string): boolean {
  for (const part of (header ?? "").split(",")) {
    const [name, ...params] = part.trim().split(";");
    if (name!.trim().toLowerCase() !== coding && name!.trim() !== "*") continue;
    const q = params.map((x) => x.trim()).find((x) => x.startsWith("q="));
    return q === undefined || Number(q.slice(2)) > 0;
  }
  return false;
}

/** Whether ``header`` (If-None-Match) names ``etag`` (weak comparison, RFC 9110 §13.1.2). */
function matches(header: string | undefined, etag: string): boolean {
  if (!header) return false;
  return header.split(",").some((t) => {
    const tag = t.trim();
    return tag === "*" || tag.replace(/^W\//, "") === etag.replace(/^W\//, "");
  });
}

/**
 * A Node `http` / Express handler for the files under ``root``: answers GET and HEAD of a file
 * there (a folder: its index.html) and returns true; returns false for anything else (the
 * caller answers it: a 404, another route).
 */
export function staticFiles(root: string, options: StaticOptions = {}): (req: IncomingMessage, res: ServerResponse) => boolean {
  const base = resolve(root);
  const immutable = options.immutable ?? contentNamed;
  const keep = options.keep ?? 64;
  const copies = new Map<string, Buffer>();  // "path|mtime|coding" -> bytes, most recent last

  const compressed = (file: string, st: Stats, coding: "br" | "gzip"): Buffer => {
    const key = `${file}|${st.mtimeMs}|${st.size}|${coding}`;
    let out = copies.get(key);
    if (out === undefined) {
      const raw = readFileSync(file);
      out = coding === "br"
        ? brotliCompressSync(raw, { params: { [constants.BROTLI_PARAM_QUALITY]: 5, [constants.BROTLI_PARAM_SIZE_HINT]: raw.length } })
        : gzipSync(raw, { level: 6 });
    } else {
      copies.delete(key);
    }
    copies.set(key, out);
    while (copies.size > keep) copies.delete(copies.keys().next().value!);
    return out;
  };

  return (req, res) => {
    if (req.method !== "GET" && req.method !== "HEAD") return false;
    let rel: string;
    try {
      rel = normalize(decodeURIComponent(new URL(req.url ?? "/", "http://x").pathname)).replace(/^([/\\])+/, "");
    } catch {
      return false;
    }
    let file = join(base, rel);
    if (file !== base && !file.startsWith(base + sep)) return false;
    let st: Stats;
    try {
      st = statSync(file);
      if (st.isDirectory()) {
        file = join(file, "index.html");
        st = statSync(file);
      }
      if (!st.isFile()) return false;
    } catch {
      return false;
    }
    const ext = extname(file);
    const accept = req.headers["accept-encoding"];
    let coding: "br" | "gzip" | null = null;
    let body: Buffer | null = null;
    for (const [c, suffix] of [["br", ".br"], ["gzip", ".gz"]] as const) {
      if (accepts(accept, c) && existsSync(file + suffix)) {
        coding = c;
        body = readFileSync(file + suffix);
        break;
      }
    }
    if (body === null && COMPRESSIBLE.has(ext) && st.size >= SMALL) {
      coding = accepts(accept, "br") ? "br" : accepts(accept, "gzip") ? "gzip" : null;
      if (coding !== null) body = compressed(file, st, coding);
    }
    const version = createHash("sha256").update(`${st.size}|${st.mtimeMs}`).digest("base64url").slice(0, 16);
    const etag = `"${version}${coding === null ? "" : `-${coding}`}"`;
    const headers: Record<string, string> = {
      "Content-Type": TYPES[ext] ?? "application/octet-stream",
      "Cache-Control": immutable(rel) ? IMMUTABLE : "no-cache",
      ETag: etag, "Last-Modified": st.mtime.toUTCString(),
    };
    if (COMPRESSIBLE.has(ext)) headers.Vary = "Accept-Encoding";
    if (matches(req.headers["if-none-match"], etag)) {
      res.writeHead(304, headers).end();
      return true;
    }
    if (coding !== null) headers["Content-Encoding"] = coding;
    const data = body ?? readFileSync(file);
    headers["Content-Length"] = String(data.length);
    res.writeHead(200, headers);
    res.end(req.method === "HEAD" ? undefined : data);
    return true;
  };
}
