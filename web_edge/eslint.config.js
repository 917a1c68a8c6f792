// ESLint 9 flat config (`npm run lint`): typescript-eslint's type-aware recommended rules on
// the TypeScript (the library with its Node entry point, checked against tsconfig.node.json;
// the demo page against its own tsconfig), ESLint's recommended rules on the JavaScript
// (tests, bin, examples, the bundler and page drivers).
import { existsSync } from "node:fs";

import js from "@eslint/js";
import globals from "globals";
import tseslint from "typescript-eslint";

// the demo page's types come from its own node_modules (@privbert/edge through file:.., Vite)
const demoInstalled = existsSync(new URL("demo/node_modules/", import.meta.url));
if (!demoInstalled) {
  console.warn("eslint: web_edge/demo/node_modules is missing (cd demo && npm ci): demo/ not linted");
}

export default tseslint.config(
  // test/types/: never run, type-checked by `npm run typecheck` (tsconfig.types.json)
  { ignores: ["dist/", "demo/dist/", "**/node_modules/", "test/bundlers/**/dist/", "test/types/",
    ...(demoInstalled ? [] : ["demo/"])] },
  {
    files: ["**/*.{js,mjs}"],
    extends: [js.configs.recommended],
    languageOptions: { globals: { ...globals.node } },
  },
  {
    // the page scripts, and the drivers whose page.evaluate callbacks run in the browser
    files: ["test/bundlers/src/**/*.js", "test/bundlers/drive.mjs", "demo/test/**/*.mjs"],
    languageOptions: { globals: { ...globals.browser, ...globals.node } },
  },
  {
    files: ["src/**/*.ts"],
    extends: [js.configs.recommended, ...tseslint.configs.recommendedTypeChecked],
    languageOptions: {
      parserOptions: { project: "./tsconfig.node.json", tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      // the stores' async methods answer an async interface from memory or a sync call:
      // `async` keeps a throw a rejection, as callers of the interface expect
      "@typescript-eslint/require-await": "off",
      // `const { a: _a, ...rest } = o` is how an option is left out of the rest
      "@typescript-eslint/no-unused-vars": ["error", { ignoreRestSiblings: true }],
    },
  },
  {
    files: ["demo/src/**/*.ts", "demo/vite.config.ts"],
    extends: [js.configs.recommended, ...tseslint.configs.recommendedTypeChecked],
    languageOptions: {
      parserOptions: { project: "./demo/tsconfig.json", tsconfigRootDir: import.meta.dirname },
    },
  },
  {
    // numpy's ziggurat header and the published Lanczos coefficients, digit for digit: the
    // literal rounds to the nearest double, as the C compiler rounds the same digits
    files: ["src/random/ziggurat_tables.ts", "test/stats.mjs"],
    rules: { "no-loss-of-precision": "off" },
  },
);
