"""Every file of a model version (or of a pretrained base) with its SHA-256, in the folder's
``manifest.json``: a folder is served, promoted or built on only when it is whole.

    verified = verify_folder(path)      # IntegrityError (one line) unless the folder is whole
    if not verified.sealed:             # a folder written before manifests existed
        seal(verified)                  # its manifest, from the digests just checked
    update_manifest(path, [ONNX_FILE, CONFIG_FILE])   # a writer that changed those files

A folder with a manifest is whole when every file it lists is there with that digest and no
other file is (names that start with ``.`` aside: temporary files and locks). A folder
without one was written before manifests existed (or outside ``$PRIVBERT_HOME``): it is
checked as far as its files allow, every floating-point tensor of its ``*.safetensors``
files finite, and :func:`seal` then writes its manifest. ``cloud_api.home`` seals a version
when it is registered, and a version from before manifests on its first verified load or
promotion. Only numpy and the standard library: the torch-free serving image verifies too.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MANIFEST_FILE = "manifest.json"
FORMAT = "privbert-manifest"
FORMAT_VERSION = 1
_FLOATS = {"F16": np.float16, "F32": np.float32, "F64": np.float64}
_BF16_EXPONENT = 0x7F80  # bfloat16: all exponent bits set = inf or NaN
# tensors that are log-probabilities with -inf on the tokens that can never occur (the
# dchi-embedding posterior's prior, models/nets/classifiers.py): -inf is their value, not damage
MASKS = ("log_prior",)


class IntegrityError(ValueError):
    """A folder that is not whole (a file changed, missing, added, or non-finite weights);
    the message is one line naming the folder and the file."""


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class Verified:
    """A folder that passed :func:`verify_folder`: its files' digests, and whether they
    came from its manifest (``sealed``) or were computed from a folder without one."""

    path: Path
    digests: dict[str, str] = field(repr=False)
    sealed: bool


def folder_files(path: str | os.PathLike) -> list[str]:
    """The files of a folder as manifest names (relative POSIX paths), sorted; names with a
    part that starts with ``.`` and the manifest itself are not files of the folder."""
    root = Path(path)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith("."):
                continue
            rel = (Path(dirpath) / name).relative_to(root).as_posix()
            if rel != MANIFEST_FILE:
                out.append(rel)
    return sorted(out)


def read_manifest(path: str | os.PathLike) -> dict[str, str] | None:
    """``{name: sha256}`` of a folder's manifest; None when it has none; IntegrityError when
    it is not a manifest."""
    p = Path(path) / MANIFEST_FILE
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise IntegrityError(f"{p}: unreadable ({type(exc).__name__}); the folder cannot be "
                             "verified") from None
    files = doc.get("files") if isinstance(doc, dict) else None
    if (doc.get("format") if isinstance(doc, dict) else None) != FORMAT or \
            doc.get("format_version") != FORMAT_VERSION or not isinstance(files, dict) or \
            not all(isinstance(k, str) and isinstance(v, str) and len(v) == 64
                    for k, v in files.items()):
        raise IntegrityError(f"{p}: not a {FORMAT} of format {FORMAT_VERSION}; the folder "
                             "cannot be verified")
    return dict(files)


def manifest_sha256(path: str | os.PathLike) -> str | None:
    """The SHA-256 of a folder's ``manifest.json`` (what a home records beside the version
    when it seals it), or None when it has none."""
    p = Path(path) / MANIFEST_FILE
    return file_sha256(p) if p.is_file() else None


def check_finite_arrays(root: Path, names: Iterable[str]) -> None:
    """IntegrityError unless every array file among ``names`` (safetensors weights, .npz
    and .npy arrays: the classifier, the denoiser, the channel posterior) holds only finite
    floating-point values (``MASKS`` may hold -inf)."""
    for name in names:
        if name.endswith(".safetensors"):
            check_finite_safetensors(root / name)
        elif name.endswith((".npz", ".npy")):
            check_finite_npy(root / name)


def verify_folder(path: str | os.PathLike, *, digest_unsealed: bool = True,
                  sealed_digest: str | None = None) -> Verified:
    """Check a folder against its manifest (every listed file present with its digest, no
    other file, every array finite), or, without a manifest, that its arrays are finite
    (and, with ``digest_unsealed``, the digests :func:`seal` would write). IntegrityError
    (one line) otherwise.

    ``sealed_digest``: the manifest's SHA-256 recorded when the folder was sealed (a home
    keeps it beside the version, out of the folder): a manifest that is missing, or is not
    that one (deleted, forged or replaced: the folder was laundered), is refused."""
    root = Path(path)
    if not root.is_dir():
        raise IntegrityError(f"{root}: no such folder")
    listed = read_manifest(root)
    present = folder_files(root)
    if listed is None and sealed_digest is not None:
        raise IntegrityError(f"{root}: {MANIFEST_FILE} is missing, but the version was sealed "
                             f"with a manifest of SHA-256 {sealed_digest[:12]}…: the folder was "
                             "changed after it was sealed; restore it from a copy, or reseal "
                             "it on purpose (cloud-api models reseal)")
    if listed is not None and sealed_digest is not None:
        got = manifest_sha256(root)
        if got != sealed_digest:
            raise IntegrityError(f"{root}: {MANIFEST_FILE} is not the one sealed ({str(got)[:12]}… "
                                 f"found, {sealed_digest[:12]}… recorded): a forged or replaced "
                                 "manifest; restore the folder from a copy, or reseal it on "
                                 "purpose (cloud-api models reseal)")
    if listed is None:
        check_finite_arrays(root, present)
        digests = {n: file_sha256(root / n) for n in present} if digest_unsealed else {}
        return Verified(root, digests, sealed=False)
    extra = sorted(set(present) - set(listed))
    if extra:
        raise IntegrityError(f"{root}: {extra[0]} is not in {MANIFEST_FILE} (a file added "
                             "after the folder was sealed); remove it, or restore the "
                             "folder from a copy")
    for name, want in sorted(listed.items()):
        f = root / name
        if not f.is_file():
            raise IntegrityError(f"{root}: {name} is missing (listed in {MANIFEST_FILE}); "
                                 "restore the folder from a copy")
        got = file_sha256(f)
        if got != want:
            raise IntegrityError(f"{root}: {name} does not match its SHA-256 in "
                                 f"{MANIFEST_FILE} ({got[:12]}… found, {want[:12]}… "
                                 "sealed): the file changed or is corrupt; restore it from "
                                 "a copy, or promote another version")
    check_finite_arrays(root, listed)  # a NaN sealed in (issue 42: a NaN posterior.npz)
    return Verified(root, listed, sealed=True)


def seal(verified: Verified) -> Path:
    """Write the manifest of a folder :func:`verify_folder` checked (its digests then);
    returns its path. OSError when the folder cannot be written."""
    if not verified.sealed and not verified.digests and folder_files(verified.path):
        raise ValueError(f"{verified.path}: verified without digests; nothing to seal")
    return _write(verified.path, verified.digests)


def update_manifest(path: str | os.PathLike, names: Iterable[str]) -> None:
    """After a writer replaced or added ``names`` in a sealed folder: their digests now. A
    folder without a manifest is left as it is (it is sealed when verified)."""
    root = Path(path)
    listed = read_manifest(root)
    if listed is None:
        return
    for name in names:
        if (root / name).is_file():
            listed[name] = file_sha256(root / name)
        else:
            listed.pop(name, None)
    _write(root, listed)


def _write(root: Path, digests: dict[str, str]) -> Path:
    doc = {"format": FORMAT, "format_version": FORMAT_VERSION, "algorithm": "sha256",
           "files": dict(sorted(digests.items()))}
    fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST_FILE}.", dir=root)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(doc, indent=2) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, root / MANIFEST_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return root / MANIFEST_FILE


def check_finite_safetensors(path: str | os.PathLike) -> None:
    """IntegrityError unless every floating-point tensor of a safetensors file is finite
    (a NaN or an infinity in a weight makes scores NaN for the inputs that reach it)."""
    p = Path(path)
    size = p.stat().st_size
    with open(p, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        try:
            if not 0 < n <= size - 8:
                raise ValueError("bad header length")
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError):
            raise IntegrityError(f"{p}: not a safetensors file (its header is unreadable)"
                                 ) from None
    if size == 8 + n:
        return
    data = np.memmap(p, dtype=np.uint8, mode="r", offset=8 + n)
    for name, t in header.items():
        if name == "__metadata__" or not isinstance(t, dict):
            continue
        dtype, (a, b) = t.get("dtype"), t.get("data_offsets", (0, 0))
        if not 0 <= a <= b <= data.size:
            raise IntegrityError(f"{p}: tensor {name} lies outside the file (cut short?)")
        raw = data[a:b]
        width = np.dtype(_FLOATS[dtype]).itemsize if dtype in _FLOATS else 2
        if dtype in (*_FLOATS, "BF16") and raw.size % width:
            raise IntegrityError(f"{p}: tensor {name} is not a whole number of {dtype} values")
        masked = name.endswith(MASKS)  # -inf there means "never this token", by design
        if dtype in _FLOATS:
            v = raw.view(_FLOATS[dtype])
            finite = bool((np.isfinite(v) | (masked & np.isneginf(v))).all())
        elif dtype == "BF16":
            bits = raw.view(np.uint16)
            special = (bits & _BF16_EXPONENT) == _BF16_EXPONENT
            if masked:
                special &= bits != 0xFF80  # bfloat16 -inf
            finite = not bool(special.any())
        else:
            continue
        if not finite:
            raise IntegrityError(f"{p}: tensor {name} holds NaN or infinite values (the "
                                 "file is corrupt or the training diverged); restore it "
                                 "from a copy, or promote another version")


def check_finite_npy(path: str | os.PathLike) -> None:
    """IntegrityError unless every floating-point array of a .npz or .npy file is finite
    (arrays named like ``MASKS`` may hold -inf). Never unpickles."""
    p = Path(path)
    try:
        loaded = np.load(p, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise IntegrityError(f"{p}: not a readable numpy file ({type(exc).__name__})") from None
    arrays = dict(loaded.items()) if isinstance(loaded, np.lib.npyio.NpzFile) else {"": loaded}
    if isinstance(loaded, np.lib.npyio.NpzFile):
        loaded.close()
    for name, a in arrays.items():
        if a.dtype.kind not in "fc":
            continue
        ok = np.isfinite(a) | (name.endswith(MASKS) & np.isneginf(a))
        if not bool(ok.all()):
            what = f"array {name}" if name else "its array"
            raise IntegrityError(f"{p}: {what} holds NaN or infinite values (the file is "
                                 "corrupt or the training diverged); restore it from a copy, "
                                 "or promote another version")
