"""tflite-runtime: the legacy TFLite interpreter wheel, for images that already ship it.

It stopped at 2.14 (2023), was built against NumPy 1.x and so only works with
NumPy < 2, and has no wheel for Python 3.11 on aarch64 (Raspberry Pi OS
Bookworm); LiteRT (``ai-edge-litert``) is its successor with the same API.
This module says so clearly instead of failing inside the extension module.

    >>> from edge.backends import load
    >>> m = load("encoder_int8.tflite", backend="tflite_runtime")
"""

from __future__ import annotations

import numpy as np

from edge.backends import BackendUnavailable
from edge.errors import EdgelearnError

_WHY = ("tflite-runtime stopped at 2.14, works only with NumPy < 2 and has no wheels for "
        "Python 3.11 aarch64")
_FIX = "use backend 'litert' (`pip install ai-edge-litert`), its maintained successor with the same API"


def check_available(numpy_version: str | None = None):
    numpy_version = numpy_version or np.__version__
    if int(numpy_version.split(".")[0]) >= 2:
        # Importing it under NumPy 2 fails deep inside the C extension with a
        # "compiled using NumPy 1.x" message; say what to do instead.
        raise BackendUnavailable(f"backend 'tflite_runtime' cannot run with NumPy {numpy_version}: {_WHY}", fix=_FIX)
    try:
        from tflite_runtime.interpreter import Interpreter  # pyright: ignore[reportMissingImports]
    except ImportError as e:
        raise BackendUnavailable(f"backend 'tflite_runtime' needs the package tflite-runtime ({e}); {_WHY}",
                                 fix=f"`pip install tflite-runtime` where a wheel exists, or {_FIX}") from None
    return Interpreter


def open_model(path, num_threads: int = 1, **options):
    from edge.backends.litert import TFLiteInterpreterBackend

    if options:
        raise EdgelearnError(f"backend 'tflite_runtime' takes no options {sorted(options)}")
    return TFLiteInterpreterBackend(check_available(), path, num_threads, "tflite_runtime")
