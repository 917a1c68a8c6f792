import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, readdirSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { brotliCompressSync, constants, gzipSync } from "node:zlib";

import { defineConfig, type Plugin } from "vite";

/** Types worth compressing (the rest, e.g. images, are compressed already). */
const COMPRESSIBLE = /\.(js|mjs|css|html|wasm|json|svg|map|txt)$/;
/** Where compressed copies of large files are kept between builds, by content (the wasm's
 * brotli takes half a minute and changes only with onnxruntime-web's version). */
const CACHE = join("node_modules", ".cache", "privbert-precompress");

function brotli(data: Buffer): Buffer {
  const big = data.length > 1 << 20;
  return brotliCompressSync(data, { params: {
    [constants.BROTLI_PARAM_QUALITY]: big ? 10 : 11,
    [constants.BROTLI_PARAM_LGWIN]: 24,
    [constants.BROTLI_PARAM_SIZE_HINT]: data.length,
  } });
}

/**
 * Precompressed copies beside the built files (`x.br`, `x.gz`), written once at build time:
 * `cloud-api serve` sends one when the browser accepts it (cloud_api/routes/web.py), so the
 * page's 14 MB WebAssembly travels as about 2.4 MB. A copy is kept only when it saves 10%.
 */
function precompress(): Plugin {
  let outDir = "dist";
  return {
    name: "privbert-precompress",
    apply: "build",
    configResolved(c) {
      outDir = c.build.outDir;
    },
    closeBundle() {
      mkdirSync(CACHE, { recursive: true });
      const walk = (dir: string): string[] => readdirSync(dir).flatMap((f) => {
        const p = join(dir, f);
        return statSync(p).isDirectory() ? walk(p) : [p];
      });
      for (const file of walk(outDir)) {
        if (!COMPRESSIBLE.test(file)) continue;
        const data = readFileSync(file);
        if (data.length < 1024) continue;
        const key = join(CACHE, createHash("sha256").update(data).digest("hex"));
        for (const [ext, make] of [[".br", brotli], [".gz", (d: Buffer) => gzipSync(d, { level: 9 })]] as const) {
          const cached = key + ext;
          const out = existsSync(cached) ? readFileSync(cached) : make(data);
          if (data.length > 1 << 20 && !existsSync(cached)) writeFileSync(cached, out);
          if (out.length <= 0.9 * data.length) writeFileSync(file + ext, out);
        }
      }
    },
  };
}

// relative asset URLs: the page works wherever it is served (cloud-api serve: /demo/)
export default defineConfig({
  base: "./",
  build: { outDir: "dist", emptyOutDir: true, target: "es2022", reportCompressedSize: true },
  // the privatizing Worker is an ES module (it imports onnxruntime-web's code on demand)
  worker: { format: "es" },
  plugins: [precompress()],
});
