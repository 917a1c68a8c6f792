// The same page (index.html, src/page.js, src/privbert-worker.js) built four ways into
// dist/vite, dist/esbuild, dist/webpack and dist/rollup, each with the bundler's defaults where
// it has them. esbuild and Rollup leave onnxruntime-web's `new URL("ort-wasm-simd-threaded.wasm",
// import.meta.url)` as it is; the README's recipe copies the library's own file (ortWasmPath)
// where the page serves it: for esbuild dist/esbuild-wasm/, named by wasmPaths; for Rollup
// beside its output scripts, where onnxruntime-web looks by default. Rollup resolves packages
// with @rollup/plugin-node-resolve({ browser: true }) (the browser builds of the library's
// dependencies).
import { copyFileSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { resolve } from "node:path";

import { ortWasmPath } from "@privbert/edge/node";
import { nodeResolve } from "@rollup/plugin-node-resolve";
import * as esbuild from "esbuild";
import { rollup } from "rollup";
import { build as vite } from "vite";
import webpack from "webpack";

const root = resolve(".");
rmSync("dist", { recursive: true, force: true });
const html = readFileSync("index.html", "utf8");

await vite({ root, logLevel: "warn", base: "./", worker: { format: "es" },
  build: { outDir: "dist/vite", emptyOutDir: true, target: "es2022", reportCompressedSize: false } });

await esbuild.build({ entryPoints: ["src/page.js", "src/privbert-worker.js"], bundle: true, format: "esm",
  splitting: true, outdir: "dist/esbuild", platform: "browser", target: "es2022", logLevel: "warning" });
writeFileSync("dist/esbuild/index.html", html.replace("./src/page.js", "./page.js"));
mkdirSync("dist/esbuild-wasm", { recursive: true });
copyFileSync(ortWasmPath(), "dist/esbuild-wasm/ort-wasm-simd-threaded.wasm");

await new Promise((done, fail) => webpack({
  mode: "production", context: root, entry: { page: "./src/page.js" }, target: "web",
  output: { path: resolve("dist/webpack"), filename: "[name].js", publicPath: "auto", clean: true },
  performance: { hints: false },
}, (err, stats) => {
  if (err) return fail(err);
  if (stats.hasErrors()) return fail(new Error(stats.toString({ all: false, errors: true })));
  done();
}));
writeFileSync("dist/webpack/index.html", html.replace('type="module" src="./src/page.js"', 'defer src="./page.js"'));
const rolled = await rollup({ input: ["src/page.js", "src/privbert-worker.js"], plugins: [nodeResolve({ browser: true })],
  onwarn: (w, warn) => { if (w.code !== "EVAL" && w.code !== "CIRCULAR_DEPENDENCY") warn(w); } });
await rolled.write({ dir: "dist/rollup", format: "es", entryFileNames: "[name].js" });
await rolled.close();
writeFileSync("dist/rollup/index.html", html.replace("./src/page.js", "./page.js"));
copyFileSync(ortWasmPath(), "dist/rollup/ort-wasm-simd-threaded.wasm");
console.log("built dist/vite, dist/esbuild, dist/webpack, dist/rollup");
