"""The frozen sentence encoder of the bundle (``encoder.onnx``) run with onnxruntime.

Contract (ARCHITECTURE.md "The edge bundle"): inputs ``input_ids``, ``attention_mask``,
``token_type_ids`` int64 [batch, seq] padded with the [PAD] id (attention 0);
output ``sentence_embedding`` float32 [batch, r]. DPNR, OME and TextHide
privatize these vectors (Lyu et al. 2020; Huang et al. 2020). No torch here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np

if TYPE_CHECKING:
    from shared.bundle import EdgeBundle

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT = "sentence_embedding"


def pad_batch(seqs: list[np.ndarray], types: list[np.ndarray], pad_id: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input_ids, attention_mask, token_type_ids), int64 [b, longest], right-padded."""
    width = max(len(s) for s in seqs)
    ids = np.full((len(seqs), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(seqs), width), dtype=np.int64)
    tt = np.zeros((len(seqs), width), dtype=np.int64)
    for i, (s, t) in enumerate(zip(seqs, types, strict=True)):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
        tt[i, : len(t)] = t
    return ids, mask, tt


class SentenceEncoder:
    """An onnxruntime session over the contract's encoder; batches by sorted length."""

    def __init__(self, onnx_bytes: bytes, pad_id: int, output_dim: int | None = None,
                 max_length: int | None = None, batch_size: int = 64,
                 providers: list[str] | None = None):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3  # warnings about unused initializers are noise here
        available = ort.get_available_providers()
        if providers is None:  # CUDA when present, CPU otherwise
            providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider")
                         if p in available]
        self.session = ort.InferenceSession(onnx_bytes, sess_options=opts, providers=providers)
        names = [i.name for i in self.session.get_inputs()]
        missing = [n for n in INPUTS if n not in names]
        outputs = [o.name for o in self.session.get_outputs()]
        if missing or OUTPUT not in outputs:
            raise ValueError(f"encoder.onnx does not follow the contract: inputs {names} "
                             f"(need {list(INPUTS)}), outputs {outputs} (need {OUTPUT!r})")
        self._feed_names = [n for n in INPUTS if n in names]
        self.pad_id = int(pad_id)
        self.output_dim = output_dim
        self.max_length = max_length
        self.batch_size = int(batch_size)

    @classmethod
    def from_bundle(cls, bundle: EdgeBundle, **kwargs) -> SentenceEncoder:
        """The bundle's encoder, or ValueError naming what to do when it has none."""
        desc = bundle.meta.get("encoder")
        if bundle.encoder_onnx is None or not desc:
            raise ValueError(
                f"bundle {bundle.bundle_id[:12]}… has no encoder.onnx; laplace, ome and "
                "texthide need a bundle with the frozen sentence encoder (made by "
                "`cloud-api export-bundle`, or fetched with --server)")
        return cls(bundle.encoder_onnx, bundle.special_ids["pad"],
                   output_dim=desc.get("output_dim"), max_length=desc.get("max_length"),
                   **kwargs)

    def encode(self, seqs: list[np.ndarray], types: list[np.ndarray]) -> np.ndarray:
        """Sentence vectors (b, r) float32 for full input sequences ([CLS] ... [SEP])."""
        if not seqs:
            return np.zeros((0, self.output_dim or 0), dtype=np.float32)
        order = np.argsort([len(s) for s in seqs], kind="stable")  # little padding per batch
        out: np.ndarray | None = None
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            ids, mask, tt = pad_batch([seqs[i] for i in idx], [types[i] for i in idx],
                                      self.pad_id)
            feeds = dict(zip(INPUTS, (ids, mask, tt), strict=True))
            vec = self.session.run([OUTPUT], {n: feeds[n] for n in self._feed_names})[0]
            vec = np.asarray(vec, dtype=np.float32)
            if vec.ndim != 2 or vec.shape[0] != len(idx):
                raise ValueError(f"encoder.onnx returned shape {vec.shape} for a batch of "
                                 f"{len(idx)}; expected (batch, r)")
            if out is None:
                if self.output_dim is not None and vec.shape[1] != self.output_dim:
                    raise ValueError(f"encoder.onnx returned {vec.shape[1]} values; the bundle "
                                     f"says output_dim={self.output_dim}")
                out = np.empty((len(seqs), vec.shape[1]), dtype=np.float32)
            out[idx] = vec
        out = cast(np.ndarray, out)  # made by the first chunk
        if not np.isfinite(out).all():
            raise ValueError("encoder.onnx returned NaN or Inf")
        return out
