/**
 * The page's settings: `config.json`, served beside the page by `cloud-api serve` (the demo
 * key, when the operator set one; else the page asks for a key).
 */

export interface PageConfig {
  api_key: string | null;
  api_base: string;
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

