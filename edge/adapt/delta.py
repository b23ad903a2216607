"""What an adapted delta is: its tensors, their checks, and its bytes on disk (``.npz``).

A delta holds only the tensors that differ from the bundle's tail: the conv tail's (and its LoRA
or adapter factors) or the embedding head's, never both. ``npz_arrays`` reads one with every
member's size checked before anything is allocated; ``check_delta`` refuses anything a tail
could not run. ``edge.adapt.store`` keeps the versions; this module says what each may hold.

    >>> check_delta(npz_arrays(path), delta_shapes(bundle))    # ValueError when it is no delta
"""

from __future__ import annotations

import io
import json
import math
import struct
import tokenize
import zipfile
import zlib
from pathlib import Path

import numpy as np

from edge.errors import EdgelearnError

MAX_NPZ_BYTES = 256 << 20
# what a delta may hold: the conv tail's tensors and factors, or the embedding head's
CONV_NAMES = ("dw4_w", "dw4_b", "pw4_w", "pw4_b", "cls_w", "cls_b", "pw4.lora_a", "pw4.lora_b", "cls.lora_a",
              "cls.lora_b", "pw4.adapter_a", "pw4.adapter_b", "cls.adapter_a", "cls.adapter_b")
HEAD_NAMES = ("proj.w", "proj.b", "classifier.w", "classifier.b", "adapter.a", "adapter.b", "proj.lora_a",
              "proj.lora_b", "classifier.lora_a", "classifier.lora_b")
CONV_TAIL, EMBEDDING_HEAD = "conv-tail", "embedding-head"  # the two kinds of adapted delta
READ_ERRORS = (OSError, ValueError, EOFError, KeyError, SyntaxError, TypeError, OverflowError, struct.error,
                zlib.error, zipfile.BadZipFile, NotImplementedError, RuntimeError, tokenize.TokenError)


def npz_arrays(path: Path) -> dict:
    """The arrays of an .npz, each member's header checked against its size before it is read (a
    garbled shape cannot ask for gigabytes); raises one of ``READ_ERRORS`` when damaged."""
    if path.stat().st_size > MAX_NPZ_BYTES:
        raise ValueError(f"{path.stat().st_size} bytes, more than an adapted delta can be")
    out = {}
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if not info.filename.endswith(".npy") or info.file_size > MAX_NPZ_BYTES:
                raise ValueError(f"member {info.filename!r} is not an array")
            raw = zf.read(info)  # CRC checked
            f = io.BytesIO(raw)
            version = np.lib.format.read_magic(f)
            header = np.lib.format.read_array_header_2_0 if version >= (2, 0) else np.lib.format.read_array_header_1_0
            shape, _, dtype = header(f)
            if dtype.hasobject:
                raise ValueError(f"member {info.filename!r} holds Python objects")
            if math.prod(shape) * dtype.itemsize != len(raw) - f.tell():
                raise ValueError(f"member {info.filename!r} is not the {shape} {dtype} its header says")
            out[info.filename[:-4]] = np.load(io.BytesIO(raw), allow_pickle=False)
    return out


def npz_info(arrays: dict) -> dict:
    raw = arrays.pop("__info__", None)
    if raw is None:
        return {}
    if not (isinstance(raw, np.ndarray) and raw.dtype == np.uint8 and raw.ndim == 1):
        raise ValueError("its __info__ is not a JSON byte string")
    info = json.loads(bytes(raw).decode())
    if not isinstance(info, dict):
        raise ValueError("its __info__ is not a JSON object")
    return info


def delta_shapes(bundle) -> dict | None:
    """Allowed shape per delta tensor for this bundle (None in a factor's rank), or None when the
    bundle carries no tail to check against."""
    if not getattr(bundle, "manifest", None):
        return None
    from edge.adapt.conv import load_tail

    try:
        t = load_tail(bundle)
    except EdgelearnError:
        return None
    c, k = t["pw4_w"].shape[0], t["cls_w"].shape[1]
    shapes = {n: tuple(t[n].shape) for n in ("dw4_w", "dw4_b", "pw4_w", "pw4_b", "cls_w", "cls_b")}
    shapes.update({"pw4.lora_a": (c, None), "pw4.lora_b": (None, c), "cls.lora_a": (c, None),
                   "cls.lora_b": (None, k), "pw4.adapter_a": (c, None), "pw4.adapter_b": (None, c),
                   "cls.adapter_a": (k, None), "cls.adapter_b": (None, k),
                   "proj.w": (c, c), "proj.b": (c,), "classifier.w": (c, k), "classifier.b": (k,),
                   "adapter.a": (c, None), "adapter.b": (None, c), "proj.lora_a": (c, None),
                   "proj.lora_b": (None, c), "classifier.lora_a": (c, None), "classifier.lora_b": (None, k)})
    return shapes


def delta_kind(delta) -> str | None:
    """Which tail ``delta`` adapts: ``EMBEDDING_HEAD`` when it holds embedding-head tensors
    (``HEAD_NAMES``: the bundle's encoder runs, and this head on its embedding), ``CONV_TAIL``
    otherwise (the conv tail on the int8 backbone: ``edge.adapt.TailModel``), None when empty (the
    base model). A stored delta is of one kind (``check_delta`` refuses a mix)."""
    names = set(delta or ())
    if not names:
        return None
    return EMBEDDING_HEAD if names & set(HEAD_NAMES) else CONV_TAIL


def check_delta(arrays: dict, shapes: dict | None) -> None:
    """Raise ValueError unless ``arrays`` is a delta a tail can run: known names of one kind (conv
    tail or embedding head), finite float tensors, the bundle's shapes, matching factor ranks."""
    names = set(arrays)
    unknown = sorted(names - set(CONV_NAMES) - set(HEAD_NAMES))
    if unknown:
        raise ValueError(f"tensors {unknown} are no tail's")
    if names & set(CONV_NAMES) and names & set(HEAD_NAMES):
        raise ValueError("it mixes conv-tail and embedding-head tensors")
    ranks = {}
    for name, a in arrays.items():
        if not isinstance(a, np.ndarray) or a.dtype.kind != "f" or a.ndim not in (1, 2, 3) or a.size == 0:
            raise ValueError(f"{name} is not a float vector, matrix or depthwise kernel ({getattr(a, 'dtype', type(a))}, "
                             f"shape {getattr(a, 'shape', None)})")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{name} holds NaN or inf")
        want = (shapes or {}).get(name)
        if want is not None and (len(want) != a.ndim or any(w is not None and w != s for w, s in zip(want, a.shape))):
            raise ValueError(f"{name} has shape {a.shape}, this bundle's tail needs {want}")
        if name.endswith(("_a", ".a")) and a.ndim == 2:
            ranks.setdefault(name[:-1], [None, None])[0] = a.shape[1]
        if name.endswith(("_b", ".b")) and a.ndim == 2 and ("lora" in name or "adapter" in name):
            ranks.setdefault(name[:-1], [None, None])[1] = a.shape[0]
    for stem, (ra, rb) in ranks.items():
        if ("lora" in stem or "adapter" in stem) and ra != rb:
            raise ValueError(f"factors {stem}a/{stem}b have ranks {ra} and {rb}")


# -- which head a delta was trained against, and carrying it to another (issue 18) ------------------
REBASED = ("cls_w", "cls_b")  # delta tensors that replace the classifier a tail ends in


def head_key(bundle) -> str | None:
    """What a conv tail of ``bundle`` ends in: the sha256 of a federated version's ``head.npz``
    (``edge.adapt.conv.load_tail``), or None (``tail.npz``'s own classifier)."""
    from edge.adapt.conv import is_federated

    if not is_federated(bundle):
        return None
    name = (bundle.manifest.get("trainable") or {}).get("file", "head.npz")
    return (bundle.manifest.get("files", {}).get(name) or {}).get("sha256") or "?"


def trained_on(bundle, base: dict, names) -> dict:
    """The ``trained_on`` record a committed delta carries (its ``__info__``): the bundle's model and
    version, the head its tail ended in (``head_key``), and the base values of the classifier tensors
    among ``names`` (``REBASED``), so ``rebase`` can carry what training changed to another head."""
    return {"model": bundle.model_id, "version": bundle.version, "head": head_key(bundle),
            "cls": {n: np.asarray(base[n], np.float32).ravel().tolist() for n in REBASED if n in set(names)}}


def stale(info: dict, bundle) -> bool:
    """Whether a delta with ``info`` was trained against another head than ``bundle``'s tail ends in
    (a delta of before the record was trained on ``tail.npz``'s classifier: head None)."""
    rec = info.get("trained_on") if isinstance(info, dict) else None
    return (rec.get("head") if isinstance(rec, dict) else None) != head_key(bundle)


def rebase(delta: dict, info: dict, bundle, base: dict) -> dict:
    """``delta`` (trained against the head ``info`` names) carried onto ``bundle``'s tail ``base``:
    the conv layers' tensors and factors as they are (the backbone and ``tail.npz`` are the same,
    ``Device.carry_to`` checks), each replaced classifier tensor as the base's plus what training
    changed (``cls_b`` trained to b' from b becomes base + (b' - b): the personal offset on each
    label's logit, on the new head); the classifier's LoRA and adapter factors as they are. A delta
    of before the record (no ``trained_on``) was trained from ``tail.npz``'s classifier."""
    if not stale(info, bundle):
        return delta
    rec = info.get("trained_on") if isinstance(info.get("trained_on"), dict) else {}
    was = rec.get("cls") if isinstance(rec.get("cls"), dict) else None
    raw = None
    out = dict(delta)
    for n in REBASED:
        if n not in delta:
            continue
        old = was.get(n) if was is not None else None
        if old is None:
            if raw is None:
                from edge.adapt.conv import load_tail

                raw = load_tail(bundle, head=False)
            old = raw[n]
        old = np.asarray(old, np.float32).reshape(base[n].shape)
        out[n] = (base[n] + (delta[n] - old)).astype(np.float32)
    return out
