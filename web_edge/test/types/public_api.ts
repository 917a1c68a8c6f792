// Compiled by `npm run typecheck` (tsconfig.types.json, strict), never run: what a web developer
// writes against the public API must type-check as the README shows it.
import { EdgeSession, summary, type AnyGuarantee } from "../../src/index.js";

export async function guaranteeLine(session: EdgeSession): Promise<string> {
  // session.guarantee is a union (dχ per token, or an ε per payload): summary takes any of them
  const g: AnyGuarantee = session.guarantee;
  return `${summary(g)} / ${summary(session.guarantee, 12)}`;
}
