"""Serialize a one-node ONNX model to bytes, without the ``onnx`` package.

The edge ships ``onnxruntime`` but not ``onnx`` (31 MiB installed, plus ml_dtypes);
the int8 candidate pass of ``shared.mechanisms.int8_pass`` needs one graph of one
contrib node whose initializer is the quantized table, built on the device from the
bundle. This writes the handful of protobuf fields such a model uses (onnx.proto3:
ModelProto, GraphProto, NodeProto, TensorProto, ValueInfoProto); ``tests`` check the
bytes with ``onnx.checker`` and ``onnx.load_from_string``.
"""

from __future__ import annotations

import numpy as np

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


def _int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _bytes(field: int, payload: bytes | str) -> bytes:
    if isinstance(payload, str):
        payload = payload.encode()
    return _varint((field << 3) | 2) + _varint(len(payload)) + payload


def tensor(name: str, array: np.ndarray) -> bytes:
    """TensorProto: dims (1), data_type (2), name (8), raw_data (9, little-endian)."""
    a = np.ascontiguousarray(array)
    return (b"".join(_int(1, d) for d in a.shape) + _int(2, ELEM_TYPE[a.dtype])
            + _bytes(8, name) + _bytes(9, a.astype(a.dtype.newbyteorder("<"), copy=False)
                                       .tobytes()))


def value_info(name: str, dtype, shape: tuple[int | str, ...] | None) -> bytes:
    """ValueInfoProto with a tensor type; a str dimension is symbolic, None a free shape."""
    tt = _int(1, ELEM_TYPE[np.dtype(dtype)])
    if shape is not None:
        dims = b"".join(_bytes(1, _bytes(2, d) if isinstance(d, str) else _int(1, d))
                        for d in shape)
        tt += _bytes(2, dims)
    return _bytes(1, name) + _bytes(2, _bytes(1, tt))


def one_node_model(op_type: str, domain: str, inputs: list[str], outputs: list[str],
                   graph_inputs: list[bytes], graph_outputs: list[bytes],
                   initializers: dict[str, np.ndarray], opsets: dict[str, int]) -> bytes:
    """ModelProto bytes: ir_version (1), graph (7), opset_import (8). An empty string in
    ``inputs`` is an omitted optional input."""
    node = (b"".join(_bytes(1, i) for i in inputs) + b"".join(_bytes(2, o) for o in outputs)
            + _bytes(3, op_type.lower()) + _bytes(4, op_type) + _bytes(7, domain))
    graph = (_bytes(1, node) + _bytes(2, "g")
             + b"".join(_bytes(5, tensor(k, v)) for k, v in initializers.items())
             + b"".join(_bytes(11, vi) for vi in graph_inputs)
             + b"".join(_bytes(12, vi) for vi in graph_outputs))
    opset = b"".join(_bytes(8, _bytes(1, d) + _int(2, v)) for d, v in opsets.items())
    return _int(1, IR_VERSION) + _bytes(7, graph) + opset
