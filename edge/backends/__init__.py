"""Interpreter backends behind one small interface, chosen by name and imported lazily.

Backends (``edge/backends/<name>.py``): ``litert`` (ai-edge-litert), ``tflite_runtime``
(the legacy tflite-runtime wheel), ``onnxruntime`` and ``tflite_micro`` (TFLite Micro
itself, host-only, to check what an MCU would compute). ``backend="auto"`` picks
litert, then tflite_runtime, for ``.tflite`` and onnxruntime for ``.onnx``.

``invoke`` takes and returns the model's raw tensors (int8 for an int8 model);
``run`` takes float32, quantises with each input's scale/zero-point and returns
dequantised float32. A leading batch dimension different from the model's is
handled by resizing the interpreter where the backend can (LiteRT,
tflite-runtime, ONNX models with a symbolic batch axis) and otherwise by
running one example at a time and stacking the results (TFLite Micro, ONNX
models with a fixed batch of 1, or a TFLite model whose ops refuse a resize).

    >>> from edge.backends import load
    >>> enc = load("encoder_int8.tflite")              # auto: LiteRT
    >>> emb, = enc.run(features[None, :, :, None])     # float in, float out
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge.errors import EdgelearnError

BACKENDS = ("litert", "tflite_runtime", "onnxruntime", "tflite_micro")
AUTO = {".tflite": ("litert", "tflite_runtime"), ".onnx": ("onnxruntime",)}
READS = {"litert": "tflite", "tflite_runtime": "tflite", "tflite_micro": "tflite", "onnxruntime": "onnx"}


def backend_for(backend: str, fmt: str) -> str:
    """The backend to open a model of format ``fmt`` ("tflite" | "onnx") with when the user chose
    ``backend`` for the bundle: that one if it reads the format, else ``auto``. A device's
    ``--backend onnxruntime`` picks the encoder's ONNX partition; the models a bundle ships only as
    .tflite (backbone, phone model) still run, on the TFLite interpreter."""
    return backend if backend == "auto" or READS.get(backend) == fmt else "auto"


class BackendUnavailable(EdgelearnError):
    """The Python package a backend needs is not installed (or cannot work here)."""


@dataclass(frozen=True)
class TensorInfo:
    """One model input or output. ``shape`` uses -1 for a dynamic axis; scale 0.0 means not quantised."""

    name: str
    shape: tuple
    dtype: np.dtype
    scale: float = 0.0
    zero_point: int = 0

    @property
    def quantized(self) -> bool:
        return self.scale != 0.0 and np.issubdtype(self.dtype, np.integer)


def quantize(x, info: TensorInfo) -> np.ndarray:
    """float -> the tensor's integer type with round-half-to-even and saturation (as TFLite does)."""
    lo, hi = _limits(info.dtype)
    q = np.asarray(x, np.float32) / np.float32(info.scale)
    np.rint(q, out=q)
    q += info.zero_point
    np.maximum(q, lo, out=q)   # np.clip(q, lo, hi), in place (the detector quantizes a window every 80 ms)
    np.minimum(q, hi, out=q)
    return q.astype(info.dtype)


@functools.lru_cache(maxsize=None)
def _limits(dtype) -> tuple[int, int]:
    lim = np.iinfo(dtype)
    return int(lim.min), int(lim.max)


def dequantize(q, info: TensorInfo) -> np.ndarray:
    """The tensor's integers -> float32 ``(q - zero_point) * scale``, in float32 throughout: each
    product is rounded once, as through float64 before (|q - zero_point| < 2^17), at 2/3 the cost."""
    out = np.asarray(q).astype(np.float32)
    out -= np.float32(info.zero_point)
    out *= np.float32(info.scale)
    return out


class Backend:
    """Base class: subclasses set name/inputs/outputs and implement ``_invoke_one``."""

    name = "?"
    inputs: list
    outputs: list
    path: Path

    def _invoke_one(self, arrays: list) -> list:
        raise NotImplementedError

    def _try_batch(self, batch: int) -> bool:
        """Make the interpreter accept this leading batch size; False means loop instead."""
        return False

    def _check(self, arrays) -> list:
        if len(arrays) != len(self.inputs):
            raise EdgelearnError(f"{self.path.name}: takes {len(self.inputs)} input(s), got {len(arrays)}",
                                 fix=f"pass arrays for {[i.name for i in self.inputs]}")
        out = []
        for a, info in zip(arrays, self.inputs):
            a = np.asarray(a)
            if a.dtype != info.dtype:
                raise EdgelearnError(f"{self.path.name}: input {info.name!r} is {info.dtype}, got {a.dtype}",
                                     fix="use run() for float input, or cast/quantise the array first")
            tail = tuple(info.shape[1:])
            if a.ndim != len(info.shape) or any(s not in (-1, d) for s, d in zip(tail, a.shape[1:])):
                raise EdgelearnError(f"{self.path.name}: input {info.name!r} has shape {a.shape}, model expects "
                                     f"{info.shape} (-1 = any)", fix="reshape the input; the batch axis comes first")
            out.append(np.ascontiguousarray(a))
        return out

    def invoke(self, *arrays) -> list:
        """Raw tensors in, raw tensors out; any batch size along axis 0."""
        arrays = self._check(arrays)
        batches = {a.shape[0] for a in arrays}
        if len(batches) != 1:
            raise EdgelearnError(f"{self.path.name}: inputs have different batch sizes {sorted(batches)}",
                                 fix="give every input the same first dimension")
        n = batches.pop()
        model_batch = self.inputs[0].shape[0]
        if n == model_batch or self._try_batch(n):
            return self._invoke_one(arrays)
        if n == 0:
            raise EdgelearnError(f"{self.path.name}: empty batch", fix="pass at least one example")
        parts = [self._invoke_one([a[i:i + 1] for a in arrays]) for i in range(n)]
        return [np.concatenate([p[k] for p in parts], axis=0) for k in range(len(self.outputs))]

    def run(self, *float_arrays) -> list:
        """Float32 in, float32 out: quantises inputs and dequantises outputs of an int8 model."""
        ins = [quantize(a, info) if info.quantized else np.asarray(a, info.dtype)
               for a, info in zip(float_arrays, self.inputs)] if len(float_arrays) == len(self.inputs) else float_arrays
        outs = self.invoke(*ins)
        return [dequantize(o, info) if info.quantized else np.asarray(o, np.float32)
                for o, info in zip(outs, self.outputs)]

    def run1(self, x) -> list:
        """``run`` for one example of a one-input model: the streaming detector's call, a dozen
        times a second. The same quantisation and outputs; a backend may skip the batch checks."""
        return self.run(x)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {self.path.name} in={self.inputs} out={self.outputs}>"


def _module(name: str):
    if name not in BACKENDS:
        raise EdgelearnError(f"unknown backend {name!r}", fix=f"choose one of {', '.join(BACKENDS)} or 'auto'")
    return importlib.import_module(f"edge.backends.{name}")


def available() -> dict:
    """{backend: None if usable here, else the reason it is not} (imports each candidate)."""
    out = {}
    for name in BACKENDS:
        try:
            _module(name).check_available()
            out[name] = None
        except BackendUnavailable as e:
            out[name] = str(e)
    return out


def load(model_path, backend: str = "auto", num_threads: int = 1, **options) -> Backend:
    """Open a .tflite or .onnx model with the named backend (``auto``: the first that is installed)."""
    path = Path(model_path)
    if not path.is_file():
        raise EdgelearnError(f"{path}: model file not found", fix="check the path or the bundle")
    if type(num_threads) is not int or num_threads < 1:
        raise EdgelearnError(f"num_threads must be a positive integer, got {num_threads!r}")
    if backend != "auto":
        return _module(backend).open_model(path, num_threads=num_threads, **options)
    suffix = path.suffix.lower()
    if suffix not in AUTO:
        raise EdgelearnError(f"{path.name}: cannot choose a backend for {suffix or 'no'} extension",
                             fix="use a .tflite or .onnx file, or pass backend= explicitly")
    reasons = []
    for name in AUTO[suffix]:
        try:
            mod = _module(name)
            mod.check_available()
        except BackendUnavailable as e:
            reasons.append(str(e))
            continue
        return mod.open_model(path, num_threads=num_threads, **options)
    raise BackendUnavailable(f"{path.name}: no backend for {suffix} is usable ({' | '.join(reasons)})",
                             fix="`pip install ai-edge-litert`" if suffix == ".tflite" else "`pip install onnxruntime`")
