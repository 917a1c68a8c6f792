import { defineConfig } from "vite";

// relative asset URLs: the page works wherever it is served (cloud-api serve: /demo/)
export default defineConfig({
  base: "./",
  build: { outDir: "dist", emptyOutDir: true, target: "es2022", reportCompressedSize: true },
});
