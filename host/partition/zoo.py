"""DS-CNN variants as int8 TFLite (and int8 ONNX), for the partitioner's "smaller
variant" advice and for checking the planner against the real interpreters.

Untrained (random-weight) variants are exactly as large and as slow as trained
ones, which is all the memory and MAC analysis needs. Built with the project's own
``host.model.build_dscnn`` and ``host.quantize`` converters, cached by shape.

    >>> path = variant_tflite(channels=32, blocks=3, cache_dir=Path("/tmp/zoo"))
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from edge.atomic import atomic_path, atomic_write

# Candidate variants, largest first: (channels, blocks). DS-CNN-S is (64, 4).
VARIANTS = ((64, 4), (48, 4), (32, 4), (32, 3), (24, 3), (16, 2), (8, 2))


def _calib(n: int = 16, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 49, 10, 1)).astype(np.float32)


def _keras(channels: int, blocks: int, classes: int):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    from host.model import build_dscnn

    tf.keras.utils.set_random_seed(channels * 100 + blocks)
    return build_dscnn(num_classes=classes, channels=channels, blocks=blocks)


def variant_tflite(channels: int = 64, blocks: int = 4, classes: int = 12,
                   cache_dir: Path | None = None) -> Path:
    cache = Path(cache_dir or Path.home() / ".cache" / "edgelearn" / "zoo")
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"dscnn_c{channels}_b{blocks}_k{classes}.tflite"
    if not out.exists():
        from host.quantize import to_tflite

        data = to_tflite(_keras(channels, blocks, classes), _calib())
        atomic_write(out, data, mode=None)
    return out


def variant_onnx(channels: int = 64, blocks: int = 4, classes: int = 12,
                 cache_dir: Path | None = None, int8: bool = True) -> Path:
    cache = Path(cache_dir or Path.home() / ".cache" / "edgelearn" / "zoo")
    cache.mkdir(parents=True, exist_ok=True)
    fp32 = cache / f"dscnn_c{channels}_b{blocks}_k{classes}.onnx"
    q = cache / f"dscnn_c{channels}_b{blocks}_k{classes}_int8.onnx"
    if not fp32.exists():
        from host.quantize import to_onnx

        with atomic_path(fp32, mode=None) as tmp:
            to_onnx(_keras(channels, blocks, classes), tmp)
    if int8 and not q.exists():
        from host.quantize import quantize_onnx

        with atomic_path(q, mode=None) as tmp:
            quantize_onnx(fp32, tmp, _calib())
    return q if int8 else fp32
