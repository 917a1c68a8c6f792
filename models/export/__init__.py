"""Export: the edge bundle and the ONNX encoder (``writers``), int8 quantization, the ONNX
classifier the onnx serving backend runs (``onnx_classifier``, no torch).
"""
