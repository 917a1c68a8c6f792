/** SHA-256 by Web Crypto (`crypto.subtle`, browsers in a secure context and Node ≥ 20). */

export async function sha256Hex(data: Uint8Array): Promise<string> {
  const subtle = (globalThis as { crypto?: Crypto }).crypto?.subtle;
  if (!subtle) {
    throw new Error("no crypto.subtle here (Web Crypto needs a secure context: https or localhost)");
  }
  const digest = new Uint8Array(await subtle.digest("SHA-256", data as Uint8Array<ArrayBuffer>));
  let out = "";
  for (const b of digest) out += b.toString(16).padStart(2, "0");
  return out;
}
