"""Serialize a one-node ONNX model to bytes, without the ``onnx`` package.

The edge ships ``onnxruntime`` but not ``onnx`` (31 MiB installed, plus ml_dtypes);
the int8 candidate pass of ``shared.mechanisms.int8_pass`` needs one graph of one
contrib node whose initializer is the quantized table, built on the device from the
bundle. This writes the handful of protobuf fields such a model uses (onnx.proto3:
ModelProto, GraphProto, NodeProto, TensorProto, ValueInfoProto); ``tests`` check the
bytes with ``onnx.checker`` and ``onnx.load_from_string``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

# TensorProto.DataType codes (onnx.proto3)
ELEM_TYPE = {np.dtype(np.float32): 1, np.dtype(np.uint8): 2, np.dtype(np.int8): 3,
             np.dtype(np.int32): 6, np.dtype(np.int64): 7, np.dtype(np.bool_): 9}
IR_VERSION = 8


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


# A message is a list of byte strings (joined once at the end: the table is megabytes).
Parts = list[bytes]


def _int(field: int, value: int) -> Parts:
    return [_varint(field << 3), _varint(value)]


def _len(field: int, payload: Parts | bytes | str) -> Parts:
    if isinstance(payload, str):
        payload = payload.encode()
    if isinstance(payload, bytes):
        payload = [payload]
    return [_varint((field << 3) | 2), _varint(sum(len(p) for p in payload)), *payload]


def tensor(name: str, array: np.ndarray) -> Parts:
    """TensorProto: dims (1), data_type (2), name (8), raw_data (9, little-endian)."""
    a = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    out: Parts = []
    for d in a.shape:
        out += _int(1, d)
    return out + _int(2, ELEM_TYPE[np.dtype(a.dtype.type)]) + _len(8, name) + _len(9, a.tobytes())


def value_info(name: str, dtype: npt.DTypeLike, shape: tuple[int | str, ...] | None) -> Parts:
    """ValueInfoProto with a tensor type; a str dimension is symbolic, None a free shape."""
    tt = _int(1, ELEM_TYPE[np.dtype(dtype)])
    if shape is not None:
        dims: Parts = []
        for d in shape:
            dims += _len(1, _len(2, d) if isinstance(d, str) else _int(1, d))
        tt += _len(2, dims)
    return _len(1, name) + _len(2, _len(1, tt))


def one_node_model(op_type: str, domain: str, inputs: list[str], outputs: list[str],
                   graph_inputs: list[Parts], graph_outputs: list[Parts],
                   initializers: dict[str, np.ndarray], opsets: dict[str, int]) -> bytes:
    """ModelProto bytes: ir_version (1), graph (7), opset_import (8). An empty string in
    ``inputs`` is an omitted optional input."""
    node: Parts = []
    for i in inputs:
        node += _len(1, i)
    for o in outputs:
        node += _len(2, o)
    node += _len(3, op_type.lower()) + _len(4, op_type) + _len(7, domain)
    graph = _len(1, node) + _len(2, "g")
    for k, v in initializers.items():
        graph += _len(5, tensor(k, v))
    for vi in graph_inputs:
        graph += _len(11, vi)
    for vi in graph_outputs:
        graph += _len(12, vi)
    model = _int(1, IR_VERSION) + _len(7, graph)
    for domain, version in opsets.items():
        model += _len(8, _len(1, domain) + _int(2, version))
    return b"".join(model)
