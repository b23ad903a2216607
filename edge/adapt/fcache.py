"""Device-side feature cache: int8 backbone outputs of the local data, so epochs never rerun the backbone.

Adaptation trains only the float tail, so every epoch over the same clips would
recompute the same backbone output (about 80 % of the network's MACs). The cache
keeps those outputs as the backbone produced them (int8, 8000 bytes per 1 s
window) in ``<state>/adapt/features-<key>.npy``, where the key hashes the bundle's
backbone file and the exact audio, so a new bundle or new clips recompute. The
file is written atomically; a cache that is unreadable (empty, truncated, garbled) or
not the shape and type the backbone gives is recomputed, not trusted.

    >>> x = cached_features(state_dir, backbone, km, windows)   # (N, 25, 5, 64) int8
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from edge.atomic import atomic_file


def cache_key(backbone, windows: np.ndarray) -> str:
    h = hashlib.sha256(Path(backbone.backend.path).read_bytes())
    h.update(np.ascontiguousarray(windows).tobytes())
    return h.hexdigest()[:16]


def cached_features(state_dir, backbone, km, windows: np.ndarray, batch: int = 64) -> np.ndarray:
    """Backbone outputs (int8) of 1 s PCM windows, from ``<state>/adapt/`` when already computed."""
    windows = np.asarray(windows)
    path = Path(state_dir) / "adapt" / f"features-{cache_key(backbone, windows)}.npy"
    dims = tuple(backbone.backend.outputs[0].shape[1:])
    if path.exists():
        try:
            x = np.load(path, allow_pickle=False, mmap_mode="r")  # a lying header cannot allocate
            if x.dtype == np.int8 and x.ndim == 1 + len(dims) and len(x) == len(windows) \
                    and all(not isinstance(d, int) or d < 1 or d == s for d, s in zip(dims, x.shape[1:])):
                return np.array(x)
        except Exception:  # noqa: BLE001 - whatever a damaged cache raises (tokenize errors too), it is recomputed
            pass
    x = np.concatenate([backbone(km.features(windows[i:i + batch])) for i in range(0, len(windows), batch)])
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob("features-*.npy"):  # one dataset's cache at a time bounds the disk use
        old.unlink(missing_ok=True)
    with atomic_file(path) as f:
        np.save(f, x)
    return x
