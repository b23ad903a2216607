"""What a bundle carries for the conv tail: its float arrays (``load_tail``; a federated version's
tail ends in the version's head, ``is_federated``), the int8 ``backbone`` and ``tail-prefix``
partitions before it, and ``Backbone``, the frozen int8 network that runs them.

Split from conv.py (the tail's forward and backward) to keep each file about one thing;
``edge.adapt.conv`` imports every name from here.

    >>> tail = ConvTail(load_tail(bundle), qparams=Backbone(bundle).qparams)
"""

from __future__ import annotations

import numpy as np

from edge.errors import EdgelearnError

ARRAYS = ("dw4_w", "dw4_b", "pw4_w", "pw4_b", "cls_w", "cls_b")
FEDERATED_HEAD = ("proj.w", "proj.b", "classifier.w", "classifier.b")  # what a tail can end in


def is_federated(bundle) -> bool:
    """Whether ``bundle`` is a version a federation published (it carries ``head.npz``)."""
    return ((getattr(bundle, "manifest", None) or {}).get("trainable") or {}).get("strategy") == "federated-head"


def load_tail(bundle, head: bool = True) -> dict:
    """The float tail arrays of a bundle (manifest ``trainable.tail``), checked for shape. For a
    federated version (``is_federated``) and ``head``, the tail ends in the version's federated head:
    ``proj_w``/``proj_b`` added and ``cls_w``/``cls_b`` its classifier (what detection scores with);
    ``head=False``: the arrays of ``tail.npz`` as they are."""
    t = _tail_file(bundle)
    if head and is_federated(bundle):
        from edge.fl.model import load_head

        h = load_head(bundle)
        c, k = t["cls_w"].shape
        want = dict(zip(FEDERATED_HEAD, ((c, c), (c,), (c, k), (k,))))
        if set(h) != set(want) or any(h[n].shape != s for n, s in want.items()):
            raise EdgelearnError(f"bundle {bundle.model_id} v{bundle.version}'s federated head holds "
                                 f"{sorted((n, tuple(a.shape)) for n, a in h.items())}, not the projection and "
                                 "classifier a conv tail can end in",
                                 fix="stay on a version whose head.npz holds proj.* and classifier.* only")
        t.update(proj_w=h["proj.w"], proj_b=h["proj.b"], cls_w=h["classifier.w"], cls_b=h["classifier.b"])
    return t


def _tail_file(bundle) -> dict:
    spec = (bundle.manifest.get("trainable") or {}).get("tail")
    if not spec:
        raise EdgelearnError(f"bundle {bundle.model_id} v{bundle.version} carries no trainable tail",
                             fix="use a bundle with a backbone partition and tail.npz (edgelearn model)")
    try:
        with np.load(bundle.path(spec.get("file", "tail.npz"))) as z:
            t = {k: z[k].astype(np.float32) for k in ARRAYS}
    except (OSError, ValueError, KeyError, EdgelearnError) as e:
        raise EdgelearnError(f"bundle {bundle.model_id}: tail arrays unreadable ({e})",
                             fix="rebuild the bundle") from None
    c = t["dw4_b"].shape[0]
    want = {"dw4_w": (3, 3, c), "pw4_w": (c, c), "pw4_b": (c,), "cls_w": (c, t["cls_b"].shape[0])}
    bad = {k: t[k].shape for k, s in want.items() if t[k].shape != s}
    if bad:
        raise EdgelearnError(f"tail arrays have unexpected shapes {bad}", fix="rebuild the bundle")
    return t


def backbone_partition(bundle) -> dict:
    parts = [p for p in bundle.partitions if p.get("role") == "backbone" and p["format"] == "tflite"]
    if not parts:
        raise EdgelearnError(f"bundle {bundle.model_id} has no backbone partition",
                             fix="use a bundle with backbone_int8.tflite")
    return parts[0]


def prefix_partition(bundle) -> dict | None:
    """The bundle's int8 network through dw4's ReLU (role ``tail-prefix``), or None (bundles from
    before it)."""
    parts = [p for p in bundle.partitions if p.get("role") == "tail-prefix" and p["format"] == "tflite"]
    return parts[0] if parts else None


class Backbone:
    """The frozen int8 backbone: normalised features -> int8 (N, 25, 5, 64) and its (scale, zero_point).
    ``part``: another frozen int8 front of the same shape (the ``tail-prefix``)."""

    def __init__(self, bundle, backend: str = "auto", num_threads: int = 1, part: dict | None = None):
        from edge.backends import backend_for, load, quantize

        self._quantize = quantize
        part = part or backbone_partition(bundle)
        self.backend = load(bundle.path(part["file"]), backend=backend_for(backend, part.get("format")),
                            num_threads=num_threads)
        out = self.backend.outputs[0]
        self.qparams = (float(out.scale), int(out.zero_point))

    def __call__(self, feats: np.ndarray) -> np.ndarray:
        x = np.asarray(feats, np.float32).reshape(-1, 49, 10, 1)
        q = self._quantize(x, self.backend.inputs[0])
        return self.backend.invoke(q)[0]
