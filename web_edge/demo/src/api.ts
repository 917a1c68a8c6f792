/**
 * The page's settings: `config.json`, served beside the page by `cloud-api serve` (the demo
 * key, when the operator set one; else the page asks for a key).
 */

export interface PageConfig {
  /** the operator's demo key (PRIVBERT_DEMO_KEY), or null: the page asks for one */
  api_key: string | null;
}

/** `config.json` beside the page; without one (a page served elsewhere) the defaults. */
export async function readConfig(): Promise<PageConfig> {
  let r: Response;
  try {
    r = await fetch("./config.json", { cache: "no-store" });
  } catch (err) {
    throw unreachable(err);
  }
  if (!r.ok) return { api_key: null };
  return (await r.json()) as PageConfig;
}

export function unreachable(err: unknown): Error {
  return new Error(`the service cannot be reached (${(err as Error).message}): is cloud-api serve running? Nothing was sent.`);
}

