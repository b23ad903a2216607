"""LiteRT (``ai-edge-litert``): the TFLite interpreter for Raspberry Pi-class boards.

The same class serves ``tflite_runtime``, whose Interpreter has the same API.
A batch other than the model's is handled with ``resize_tensor_input`` (falling
back to one example at a time if the graph refuses the new shape).

    >>> from edge.backends import load
    >>> m = load("encoder_int8.tflite", backend="litert", num_threads=2)
    >>> logits, = m.run(x)
    >>> ref = load("encoder_int8.tflite", backend="litert", xnnpack=False)

``xnnpack=False`` runs TFLite's built-in kernels without the default XNNPACK
delegate. XNNPACK is faster but rounds int8 differently: on the shipped
encoder its softmax differs from TFLite Micro by up to 6 LSB, the built-in
kernels by at most 1. Use it where outputs must match an MCU bit for bit.
"""

from __future__ import annotations

import numpy as np

from edge.backends import Backend, BackendUnavailable, TensorInfo, dequantize, quantize
from edge.errors import EdgelearnError

PIP_NAME = "ai-edge-litert"


def check_available():
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError as e:
        raise BackendUnavailable(f"backend 'litert' needs the package {PIP_NAME} ({e})",
                                 fix=f"`pip install {PIP_NAME}`") from None
    return Interpreter


def _info(d: dict) -> TensorInfo:
    scale, zp = d.get("quantization", (0.0, 0))
    sig = d.get("shape_signature")
    # The signature keeps -1 for a dynamic axis (usually the batch); "shape" is what is allocated now.
    shape = tuple(int(s) for s in (sig if sig is not None and len(sig) else d["shape"]))
    return TensorInfo(d["name"], shape, np.dtype(d["dtype"]), float(scale), int(zp))


class TFLiteInterpreterBackend(Backend):
    def __init__(self, interpreter_cls, path, num_threads: int, name: str, xnnpack: bool = True):
        self.name, self.path = name, path
        kwargs = {}
        if not xnnpack:
            from importlib import import_module

            resolver = import_module(interpreter_cls.__module__).OpResolverType
            kwargs["experimental_op_resolver_type"] = resolver.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        try:
            self._it = interpreter_cls(model_path=str(path), num_threads=num_threads, **kwargs)
            self._it.allocate_tensors()
        except (ValueError, RuntimeError) as e:
            raise EdgelearnError(f"{path.name}: {name} cannot load it ({str(e).strip().splitlines()[-1]})",
                                 fix="check it is a valid .tflite built by `edgelearn quantize`") from None
        self._in = self._it.get_input_details()
        self._out = self._it.get_output_details()
        self.inputs = [_info(d) for d in self._in]
        self.outputs = [_info(d) for d in self._out]
        self._batch, self._resizable = int(self._in[0]["shape"][0]) if self._in else 1, True
        self._one = (1, *(int(d) for d in self._in[0]["shape"][1:])) if len(self._in) == 1 else None
        self._quantized = [i.quantized for i in self.inputs[:1] + self.outputs]  # run1's, asked once

    def _try_batch(self, batch: int) -> bool:
        if batch == self._batch:
            return True
        if not self._resizable or batch < 1:
            return False
        try:
            for d in self._in:
                self._it.resize_tensor_input(d["index"], [batch, *d["shape"][1:]], strict=False)
            self._it.allocate_tensors()
        except (ValueError, RuntimeError):
            # Some graphs hard-code the batch (e.g. a Reshape to [1, -1]); go back and loop instead.
            self._resizable = False
            for d in self._in:
                self._it.resize_tensor_input(d["index"], list(d["shape"]), strict=False)
            self._it.allocate_tensors()
            return False
        self._batch = batch
        return True

    def run1(self, x) -> list:
        """One example straight into the interpreter (about a third of ``run``'s cost is its checks
        and batch handling at this size); anything ``run`` would have to check or resize goes there."""
        info = self.inputs[0] if self._one is not None else None
        if info is None or self._batch != 1 or np.shape(x) != self._one:
            return self.run(x)
        q = self._quantized
        self._it.set_tensor(self._in[0]["index"], quantize(x, info) if q[0] else np.asarray(x, info.dtype))
        self._it.invoke()
        outs = [self._it.get_tensor(d["index"]) for d in self._out]  # get_tensor returns a copy
        return [dequantize(o, i) if qo else np.asarray(o, np.float32) for o, i, qo in zip(outs, self.outputs, q[1:])]

    def _invoke_one(self, arrays):
        if arrays[0].shape[0] != self._batch and not self._try_batch(arrays[0].shape[0]):
            raise EdgelearnError(f"{self.path.name}: cannot run batch {arrays[0].shape[0]}")
        for d, a in zip(self._in, arrays):
            self._it.set_tensor(d["index"], a)
        self._it.invoke()
        return [self._it.get_tensor(d["index"]).copy() for d in self._out]


def open_model(path, num_threads: int = 1, xnnpack: bool = True, **options):
    if options:
        raise EdgelearnError(f"backend 'litert' takes no options {sorted(options)}",
                             fix="the only option is xnnpack=True|False")
    return TFLiteInterpreterBackend(check_available(), path, num_threads, "litert", xnnpack=bool(xnnpack))
