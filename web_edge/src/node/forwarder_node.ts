/**
 * The forwarder (`@privbert/edge/forwarder`) as a Node `http` / Express handler:
 *
 *     import { createForwarder } from "@privbert/edge/forwarder";
 *     import { nodeHandler } from "@privbert/edge/node";
 *     const forward = nodeHandler(createForwarder({ service, apiKey, authenticate }));
 *     app.use("/privbert", forward);                  // Express: the prefix is kept in req.originalUrl
 *     http.createServer((req, res) => forward(req, res));
 */

import type { IncomingMessage, ServerResponse } from "node:http";
import { Readable } from "node:stream";

import type { Forwarder } from "../forwarder.js";

/** ``forwarder`` answering Node's requests (Express's ``req.originalUrl`` when mounted). */
export function nodeHandler(forwarder: Forwarder): (req: IncomingMessage, res: ServerResponse) => Promise<void> {
  return async (req, res) => {
    const path = (req as IncomingMessage & { originalUrl?: string }).originalUrl ?? req.url ?? "/";
    const headers = new Headers();
    for (const [k, v] of Object.entries(req.headers)) {
      if (v !== undefined) headers.set(k, Array.isArray(v) ? v.join(", ") : v);
    }
    const method = req.method ?? "GET";
    const hasBody = method !== "GET" && method !== "HEAD";
    const request = new Request(`http://${req.headers.host ?? "localhost"}${path}`, {
      method, headers,
      body: hasBody ? (Readable.toWeb(req) as unknown as ReadableStream<Uint8Array>) : undefined,
      ...(hasBody ? { duplex: "half" } : {}),
    });
    const answer = await forwarder(request);
    res.statusCode = answer.status;
    answer.headers.forEach((v, k) => res.setHeader(k, v));
    if (answer.body === null) {
      res.end();
      return;
    }
    Readable.fromWeb(answer.body as import("node:stream/web").ReadableStream<Uint8Array>).on("error", () => res.destroy()).pipe(res);
  };
}
