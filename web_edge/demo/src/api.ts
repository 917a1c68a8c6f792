/**
 * The page's view of the service: `config.json` (served beside the page by `cloud-api
 * serve`), then `/v1` with the key it gives (or one typed into the page). Errors become one
 * line a person can act on: the service's problem+json detail, or "unreachable".
 */

export interface PageConfig {
  api_key: string | null;
  api_base: string;
}

export interface ModelInfo {
  id: string;
  version: string | null;
  labels: string[];
  mechanism: string;
  params: { eta: number; [k: string]: unknown };
  bundle_id: string;
  max_length: number | null;
  guarantee: Record<string, unknown> | null;
}

/** `config.json` beside the page; without one (a page served elsewhere) the defaults. */
export async function readConfig(): Promise<PageConfig> {
  let r: Response;
  try {
    r = await fetch("./config.json", { cache: "no-store" });
  } catch (err) {
    throw unreachable(err);
  }
  if (!r.ok) return { api_key: null, api_base: "/v1" };
  return (await r.json()) as PageConfig;
}

export function unreachable(err: unknown): Error {
  return new Error(`the service cannot be reached (${(err as Error).message}): is cloud-api serve running? Nothing was sent.`);
}

/** One line from an error answer: problem+json's detail, else the status. */
export async function problemLine(r: Response): Promise<string> {
  let detail = "";
  try {
    const body = (await r.json()) as { detail?: string; title?: string };
    detail = body.detail || body.title || "";
  } catch {
    /* not JSON: the status says it */
  }
  return `the service answered ${r.status}${detail ? `: ${detail}` : ""}`;
}

export class ApiClient {
  constructor(readonly base: string, public key: string | null) {}

  headers(extra: Record<string, string> = {}): Record<string, string> {
    return { ...(this.key ? { Authorization: `Bearer ${this.key}` } : {}), ...extra };
  }

  async get(path: string): Promise<Response> {
    let r: Response;
    try {
      r = await fetch(`${this.base}${path}`, { headers: this.headers() });
    } catch (err) {
      throw unreachable(err);
    }
    if (!r.ok) throw new Error(await problemLine(r));
    return r;
  }

  async models(): Promise<ModelInfo[]> {
    const r = await this.get("/models");
    return ((await r.json()) as { models: ModelInfo[] }).models;
  }
}
