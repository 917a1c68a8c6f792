/** Reading the bundle's `embeddings.npy` (NumPy format 1.0/2.0/3.0, little-endian float32,
 * C order, two dimensions): the only array the bundle carries. */

import { BundleError } from "./errors.js";

const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

export interface Matrix {
  rows: number;
  cols: number;
  data: Float32Array;
}

export function readNpyF32(bytes: Uint8Array, where: string): Matrix {
  const magic = [0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59];
  if (bytes.length < 10 || magic.some((m, k) => bytes[k] !== m)) {
    throw new BundleError(`${where}: not a .npy file`);
  }
  const major = bytes[6]!;
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const headerLen = major === 1 ? view.getUint16(8, true) : view.getUint32(8, true);
  const start = (major === 1 ? 10 : 12) + headerLen;
  if (start > bytes.length) throw new BundleError(`${where}: truncated .npy header`);
  const header = new TextDecoder("latin1").decode(bytes.subarray(major === 1 ? 10 : 12, start));
  const descr = /'descr':\s*'([^']*)'/.exec(header)?.[1];
  const fortran = /'fortran_order':\s*(True|False)/.exec(header)?.[1];
  const shape = /'shape':\s*\((\d+),\s*(\d+)\s*,?\)/.exec(header);
  if (descr !== "<f4" || fortran !== "False" || !shape) {
    throw new BundleError(`${where}: expected a 2-D little-endian float32 array in C order`);
  }
  const rows = Number(shape[1]);
  const cols = Number(shape[2]);
  const nbytes = rows * cols * 4;
  if (bytes.length - start !== nbytes) {
    throw new BundleError(`${where}: ${bytes.length - start} bytes of data for shape (${rows}, ${cols})`);
  }
  // copy into an aligned buffer (one memcpy), swapping bytes on a big-endian host
  const data = new Float32Array(rows * cols);
  if (LITTLE_ENDIAN) {
    new Uint8Array(data.buffer).set(bytes.subarray(start, start + nbytes));
  } else {
    const src = new DataView(bytes.buffer, bytes.byteOffset + start, nbytes);
    for (let i = 0; i < data.length; i++) data[i] = src.getFloat32(4 * i, true);
  }
  return { rows, cols, data };
}
