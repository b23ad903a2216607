"""ONNX Runtime: the float / QDQ int8 ``.onnx`` encoder, on the Pi or in the serving shim.

QDQ models take and return float32 (quantisation is inside the graph), so
``invoke`` and ``run`` agree for them. A symbolic batch axis is passed through
as is; a fixed batch of 1 is run one example at a time.

    >>> from edge.backends import load
    >>> m = load("encoder_int8.onnx", num_threads=2)
    >>> emb, = m.run(x)
"""

from __future__ import annotations

import numpy as np

from edge.backends import Backend, BackendUnavailable, TensorInfo
from edge.errors import EdgelearnError

_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
           "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(int16)": np.int16,
           "tensor(int32)": np.int32, "tensor(int64)": np.int64, "tensor(bool)": np.bool_}


def check_available():
    try:
        import onnxruntime
    except ImportError as e:
        raise BackendUnavailable(f"backend 'onnxruntime' needs the package onnxruntime ({e})",
                                 fix="`pip install onnxruntime`") from None
    return onnxruntime


def _info(node) -> TensorInfo:
    if node.type not in _DTYPES:
        raise EdgelearnError(f"tensor {node.name!r} has unsupported type {node.type}", fix="export float32 or int8 tensors")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in node.shape)
    return TensorInfo(node.name, shape, np.dtype(_DTYPES[node.type]))


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"

    def __init__(self, path, num_threads: int = 1, providers=None):
        ort = check_available()
        self.path = path
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = num_threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        try:
            self._sess = ort.InferenceSession(str(path), sess_options=opts,
                                              providers=providers or ["CPUExecutionProvider"])
        except Exception as e:  # ORT raises its own exception classes (Fail, InvalidGraph, ...)
            raise EdgelearnError(f"{path.name}: onnxruntime cannot load it ({str(e).strip().splitlines()[0][:200]})",
                                 fix="check it is a valid .onnx built by `edgelearn quantize`") from None
        self.inputs = [_info(n) for n in self._sess.get_inputs()]
        self.outputs = [_info(n) for n in self._sess.get_outputs()]
        self._names = [n.name for n in self._sess.get_outputs()]

    def _try_batch(self, batch: int) -> bool:
        return self.inputs[0].shape[0] == -1 and batch >= 1

    def _invoke_one(self, arrays):
        return list(self._sess.run(self._names, {i.name: a for i, a in zip(self.inputs, arrays)}))


def open_model(path, num_threads: int = 1, providers=None, **options):
    if options:
        raise EdgelearnError(f"backend 'onnxruntime' takes no options {sorted(options)}", fix="use providers= only")
    return OnnxRuntimeBackend(path, num_threads, providers)
