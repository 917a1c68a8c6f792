// Types of "#ort" (package.json "imports"): onnxruntime-web's Node build under Node, its
// WebAssembly-only build in a browser; both have onnxruntime-web's API.
export * from "onnxruntime-web";
