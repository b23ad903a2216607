"""The real trainable tail of the network: float dw4 -> pw4 -> pool -> classifier on the int8 backbone.

The bundle's ``backbone`` partition (int8, frozen, never changed on the device)
ends at ``pw3_relu``: a (25, 5, 64) feature map. ``tail.npz`` holds the rest in
float32 with batch norm folded (``host/tail_export.py`` has the reference)::

    a1 = dwconv3x3(x, dw4_w) + dw4_b ; y1 = relu(a1)             P = 125 positions, C = 64
    a2 = y1 @ pw4_w + pw4_b [+ s (y1 A) B]   [+ relu(a2 Ad) Bd]  LoRA / residual adapter on pw4
    y2 = relu(a2) ; e = mean_p(y2)                               e: the 64-d embedding
    logits = e @ cls_w + cls_b [+ s (e A) B] [+ relu(l Ad) Bd]   LoRA / residual adapter on cls

A federated version (manifest ``trainable.strategy == "federated-head"``) scores with the head the
federation trained (``head.npz``: ``relu(e @ proj.w + proj.b) @ classifier.w + classifier.b``), so
its tail ends in that head (``load_tail``): ``proj_w``/``proj_b``, frozen, between the pool and the
classifier, and ``cls_w``/``cls_b`` are the head's classifier. A context adapted on such a version
trains on, and detects with, the federated head (without it the tail's own classifier masked it)::

    h = relu(e @ proj_w + proj_b) ; logits = h @ cls_w + cls_b [...]   (only when the base has proj_w)

``delta`` overrides ``base`` by name (replaced tensors, LoRA and adapter factors),
so contexts swap by swapping ``delta``. ``train_dw=False`` freezes dw4 into the
forward (the tail the host's training-memory model describes: it cannot model a
depthwise layer); the default trains the whole tail.

Whatever lies before the first trained tensor is a fixed function of the example, so
a trainer computes it once per example (``prefix``) instead of every step, the same
way the int8 backbone's output is cached: ``frozen_stage`` names the deepest such
point (``"x"`` the backbone output, ``"y1"`` dw4's output, ``"z2"`` pw4's output
before its bias), and ``Prefix`` holds it as int16 with a scale per example.

ReLU masks are kept bit-packed (``np.packbits``) unless ``pack_masks=False`` (one
byte each, the host model's definition). ``ConvTrainer`` is in ``edge.adapt.convtrain``.

What a bundle carries for the tail (``load_tail``, ``is_federated``, the ``backbone`` and
``tail-prefix`` partitions, ``Backbone``) is ``edge.adapt.convbundle``; its names are importable
from here.

    >>> tail = ConvTail(load_tail(bundle))
    >>> probs = tail.probs(tail.to_float(features_int8))
"""

from __future__ import annotations

import numpy as np

# what a bundle carries for the tail has a module of its own; every name stays importable from here
from edge.adapt.convbundle import (  # noqa: F401 (those not used here: re-exported)
    ARRAYS, FEDERATED_HEAD, Backbone, _tail_file, backbone_partition, is_federated, load_tail, prefix_partition)
from edge.adapt.prefix import STAGES, Prefix
from edge.errors import EdgelearnError

LINEAR = ("pw4", "cls")
CLS_NAMES = ("cls_w", "cls_b", "cls.lora_a", "cls.lora_b", "cls.adapter_a", "cls.adapter_b")


def dwconv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Depthwise 3x3, same padding, stride 1, on (B, H, W, C).

    The zero-padded map's rows are laid end to end, so each of the nine taps is one
    contiguous slice (a shift by ``i (W + 2) + j`` positions), viewed as (B, H, W + 2, C)
    and multiplied by the tap's weights tiled to one row (W + 2, C): numpy multiplies
    same-shape inner blocks about 3x faster than it broadcasts a C-vector over every
    position (1 window: 33 instead of 57 us). The padding columns' outputs are computed
    and dropped (the result is a (B, H, W, C) view).
    """
    b, h, wd, c = x.shape
    row = wd + 2
    n = h * row
    xp = np.zeros((b, (h + 2) * row + 2, c), x.dtype)  # +2: the last taps read past the last row
    xp[:, : (h + 2) * row].reshape(b, h + 2, row, c)[:, 1:-1, 1:-1] = x
    taps = np.ascontiguousarray(np.broadcast_to(w.reshape(9, 1, c).astype(x.dtype), (9, row, c)))
    y = np.multiply(xp[:, :n].reshape(b, h, row, c), taps[0])
    tmp = np.empty_like(y)
    for k in range(1, 9):
        off = (k // 3) * row + k % 3
        np.multiply(xp[:, off:off + n].reshape(b, h, row, c), taps[k], out=tmp)
        y += tmp
    return y[:, :, :wd]


def dwconv_grad(x: np.ndarray, dy: np.ndarray, out: np.ndarray) -> None:
    """out[i, j, c] = sum over positions of x(shifted by (i-1, j-1)) * dy, for the 3x3 depthwise weight."""
    _, h, wd, _ = x.shape
    for i in range(3):
        di = i - 1
        ys, xs = slice(max(0, -di), h - max(0, di)), slice(max(0, di), h + min(0, di))
        for j in range(3):
            dj = j - 1
            yc, xc = slice(max(0, -dj), wd - max(0, dj)), slice(max(0, dj), wd + min(0, dj))
            out[i, j] = np.einsum("bhwc,bhwc->c", x[:, xs, xc], dy[:, ys, yc])


class ConvTail:
    """Forward/backward of the conv tail; ``delta`` overrides ``base``."""

    def __init__(self, base: dict, delta: dict | None = None, lora_scale: float = 1.0,
                 qparams: tuple | None = None, train_dw: bool = True, pack_masks: bool = True):
        self.base, self.delta = base, dict(delta or {})
        self.lora_scale, self.qparams = lora_scale, qparams
        self.train_dw, self.pack_masks = train_dw, pack_masks

    def p(self, name: str):
        return self.delta[name] if name in self.delta else self.base.get(name)

    @property
    def channels(self) -> int:
        return self.base["pw4_w"].shape[0]

    @property
    def n_classes(self) -> int:
        return self.base["cls_w"].shape[1]

    def to_float(self, x: np.ndarray) -> np.ndarray:
        """int8 backbone output -> float32 (needs ``qparams``); float input passes through."""
        x = np.asarray(x)
        if x.dtype.kind == "f":
            return x
        if x.dtype != np.int8 or self.qparams is None:
            raise EdgelearnError(f"tail input is {x.dtype}", fix="pass float32, or int8 with qparams")
        s, zp = self.qparams
        out = x.astype(np.float32)
        out -= zp
        out *= s
        return out

    def frozen_stage(self, wanted) -> str:
        """The deepest point of the forward that no tensor in ``wanted`` changes (see ``STAGES``)."""
        w = set(wanted)
        if self.train_dw and w & {"dw4_w", "dw4_b"}:
            return "x"
        if w & {"pw4_w", "pw4.lora_a", "pw4.lora_b"}:
            return "y1"
        return "z2"

    def prefix(self, x: np.ndarray, stage: str, chunk: int = 1):
        """The tail's frozen prefix of backbone outputs ``x`` up to ``stage`` (``x`` itself at ``"x"``).

        ``chunk`` examples at a time (float32 working memory: a few maps of one chunk); the
        int16 result is written in place, so the whole set is never held in float32.
        """
        if stage not in STAGES:
            raise EdgelearnError(f"stage {stage!r} is unknown", fix=f"choose one of {STAGES}")
        if stage == "x" or isinstance(x, Prefix):
            return x
        n, hh, ww = np.shape(x)[:3]
        out = Prefix(np.empty((n, hh * ww, self.channels), np.int16), np.empty(n, np.float32), stage)
        for a in range(0, n, chunk):
            xf = self.to_float(x[a:a + chunk])
            y1 = dwconv(xf, self.p("dw4_w"))
            del xf
            y1 += self.p("dw4_b")
            np.maximum(y1, 0, out=y1)
            y1 = y1.reshape(len(y1), hh * ww, -1)
            if stage == "z2":
                y1 = self._pre_bias(y1, "pw4")
            part = Prefix.of(y1, stage)
            out.q[a:a + chunk], out.scale[a:a + chunk] = part.q, part.scale
        return out

    def _pre_bias(self, x, layer):
        """``x W`` (plus a frozen, unmerged LoRA term): the linear layer before its bias."""
        y = x @ self.p(f"{layer}_w")
        a = self.p(f"{layer}.lora_a")
        if a is not None:
            t = (x @ a) @ self.p(f"{layer}.lora_b")
            t *= self.lora_scale
            y += t
        return y

    def _linear(self, x, layer, keep, need_in, pre=None):
        """``x W + b`` (+ LoRA, + adapter); ``pre``: ``x W`` already computed (a ``"z2"`` prefix)."""
        w, b = self.p(f"{layer}_w"), self.p(f"{layer}_b")
        y = x @ w if pre is None else pre
        y += b
        a = self.p(f"{layer}.lora_a") if pre is None else None
        if a is not None:
            u = x @ a
            t = u @ self.p(f"{layer}.lora_b")
            t *= self.lora_scale
            y += t
            del t
            if keep is not None:
                keep[f"{layer}.u"] = u
        if keep is not None and need_in:
            keep[f"{layer}.x"] = x
        ad = self.p(f"{layer}.adapter_a")
        if ad is not None:
            h = y @ ad
            if keep is not None:
                keep[f"{layer}.ma"] = h > 0
                keep[f"{layer}.y"] = y
            np.maximum(h, 0, out=h)
            z = h @ self.p(f"{layer}.adapter_b")
            z += y
            if keep is not None:
                keep[f"{layer}.h"] = h
            y = z
        return y

    def _mask(self, a):
        m = a > 0
        return (np.packbits(m, axis=-1), m.shape) if self.pack_masks else (m, None)

    def unmask(self, kept):
        m, shape = kept
        return m if shape is None else np.unpackbits(m, axis=-1, count=shape[-1]).view(bool)

    def forward(self, x: np.ndarray, wanted: set | None = None, chunk: int | None = None):
        """Logits, the kept tensors backward needs (if ``wanted``: trained tensor names), embeddings.

        ``chunk`` runs the forward that many examples at a time: its working memory is then
        one chunk's, and only what backward needs is kept for the whole batch (for bias-only
        that is bit-packed masks, so training memory no longer grows with the batch's forward).
        """
        if wanted is not None and isinstance(x, Prefix) \
                and STAGES.index(x.stage) > STAGES.index(self.frozen_stage(wanted)):
            raise EdgelearnError(f"a {x.stage!r} prefix skips tensors this step trains ({sorted(wanted)})",
                                 fix="prepare the inputs with this trainer (ConvTrainer.prepare)")
        n = len(x)
        if chunk is None or n <= chunk:
            return self._forward(x, wanted)
        float_in = not isinstance(x, Prefix) and np.asarray(x).dtype.kind == "f"
        logits, embs, keep = [], [], None
        for a in range(0, n, chunk):
            lg, kc, e = self._forward(x[a:a + chunk], wanted)
            logits.append(lg)
            embs.append(e)
            if kc is None:
                continue
            if float_in:
                kc.pop("x", None)  # the caller's own array is kept whole below, not copied
            if keep is None:
                keep = {k: _alloc(v, n) for k, v in kc.items()}
            for k, v in kc.items():
                _put(keep[k], v, a)
            del kc
        if keep is not None and float_in and "dw4_w" in wanted and self.train_dw:
            keep["x"] = x
        return np.concatenate(logits), keep, np.concatenate(embs)

    def _forward(self, x, wanted: set | None = None):
        """One forward from the backbone output, or from a ``Prefix`` (what no trained tensor changes)."""
        keep = None if wanted is None else {}
        w = wanted or set()
        stage = x.stage if isinstance(x, Prefix) else "x"
        dw_train = self.train_dw and bool(w & {"dw4_w", "dw4_b"})
        pw_deep = bool(w & {"pw4_w", "pw4.lora_a", "pw4.adapter_a"}) or dw_train
        if stage == "x":
            x = self.to_float(x)
            b, hh, ww, c = x.shape
            y1 = dwconv(x, self.p("dw4_w"))
            y1 += self.p("dw4_b")
            if keep is not None and dw_train:
                keep["mask1"] = self._mask(y1)
                if "dw4_w" in w:
                    keep["x"] = x
            np.maximum(y1, 0, out=y1)
            y1 = y1.reshape(b, hh * ww, c)
            npos = hh * ww
        else:
            y1 = x.to_float()
            npos = y1.shape[1]
        need_in = keep is not None and bool(w & {"pw4_w", "pw4.lora_a"})
        pre = y1 if stage == "z2" else None
        a2 = self._linear(y1, "pw4", keep if keep is not None and pw_deep else None, need_in, pre=pre)
        del y1, pre
        if keep is not None and (pw_deep or "pw4_b" in w):
            if pw_deep:
                keep["mask2"] = self._mask(a2)
            else:  # TinyTL's lite path: per-channel active counts replace the P x C mask
                keep["count2"] = (a2 > 0).sum(axis=1, dtype=np.float32)
        np.maximum(a2, 0, out=a2)
        e = a2.mean(axis=1)
        del a2
        need_e = keep is not None and bool(w & {"cls_w", "cls.lora_a"})
        h = e
        pw = self.base.get("proj_w")
        if pw is not None:  # a federated version's head: relu(e P + p) before its classifier
            h = e @ pw
            h += self.base["proj_b"]
            if keep is not None and w - set(CLS_NAMES):
                keep["maskp"] = h > 0
            h = np.maximum(h, 0)
        logits = self._linear(h, "cls", keep, need_e)
        if keep is not None:
            keep["P"] = npos
        return logits, keep, e

    def probs(self, x: np.ndarray, batch: int = 256) -> np.ndarray:
        return self.infer(x, batch)[1]

    def infer(self, x: np.ndarray, batch: int = 256):
        """(embedding, probs) in batches (the inference forward, nothing kept)."""
        embs, probs = [], []
        for i in range(0, len(x), batch):
            logits, _, e = self.forward(x[i:i + batch])
            logits -= logits.max(axis=1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=1, keepdims=True)
            embs.append(e)
            probs.append(p)
        return np.concatenate(embs), np.concatenate(probs)

    def merged(self) -> dict:
        """Delta with LoRA folded into the weights (zero extra inference cost)."""
        out = {k: v for k, v in self.delta.items() if ".lora_" not in k}
        for layer in LINEAR:
            a = self.p(f"{layer}.lora_a")
            if a is not None:
                out[f"{layer}_w"] = (self.p(f"{layer}_w") + self.lora_scale * (a @ self.p(f"{layer}.lora_b"))
                                     ).astype(np.float32)
        return out


def _alloc(v, n):
    """A whole-batch buffer for one chunk's kept value (array, packed mask or a plain number)."""
    if isinstance(v, tuple):
        return np.empty((n,) + v[0].shape[1:], v[0].dtype), (n,) + tuple(v[1][1:])
    if isinstance(v, np.ndarray):
        return np.empty((n,) + v.shape[1:], v.dtype)
    return v


def _put(dst, v, a):
    if isinstance(v, tuple):
        dst[0][a:a + len(v[0])] = v[0]
    elif isinstance(v, np.ndarray):
        dst[a:a + len(v)] = v


class TailModel:
    """Backbone + (adapted) conv tail with ``KeywordModel``'s interface: ``infer(feats) -> (emb, probs)``.

    When the delta keeps the base's dw4 (bias-only as ``device adapt`` runs it, LoRA, adapters) and
    the bundle ships the ``tail-prefix`` partition, the int8 interpreter runs dw4 and its ReLU too
    (``prefix``, set; else None) and numpy starts at pw4: the float depthwise layer was half the
    tail's cost per window. dw4's output is then int8 (as inside the int8 encoder) instead of float."""

    def __init__(self, bundle, delta: dict | None = None, backend: str = "auto", num_threads: int = 1):
        from edge.kws import KeywordModel

        self.km = KeywordModel(bundle, backend=backend, num_threads=num_threads)
        self.bundle, self.labels, self.scale = bundle, self.km.labels, self.km.scale
        self.backbone = Backbone(bundle, backend=backend, num_threads=num_threads)
        self.tail = ConvTail(load_tail(bundle), delta, qparams=self.backbone.qparams)
        part = prefix_partition(bundle)
        self.prefix = None
        if part is not None and not {"dw4_w", "dw4_b"} & set(self.tail.delta):
            self.prefix = Backbone(bundle, backend=backend, num_threads=num_threads, part=part)
        # Custom keywords score the embedding they were enrolled on, the bundle's own: a delta that
        # changes the tail before the classifier (pw4's bias already) gets the base tail beside it,
        # run on the same backbone output. Scored on the adapted embedding, `full`, LoRA, sparse
        # and the speaker recipe silenced every enrolled keyword (QA pass 3).
        self.base_tail = None
        if any(k not in CLS_NAMES for k in self.tail.delta):
            self.base_tail = ConvTail(load_tail(bundle), None, qparams=self.backbone.qparams)

    def features(self, pcm) -> np.ndarray:
        return self.km.features(pcm)

    def _input(self, feats: np.ndarray):
        """The tail's input: the backbone's output, or dw4's (int8) from the prefix partition."""
        if self.prefix is None:
            return self.backbone(feats)
        y1 = self.prefix(feats)
        s, zp = self.prefix.qparams
        q = y1.reshape(len(y1), -1, y1.shape[-1]).astype(np.int16)
        q -= zp
        return Prefix(q, np.full(len(q), s, np.float32), "y1")

    def infer(self, feats: np.ndarray):
        return self.tail.infer(self._input(feats))

    def infer_enrolled(self, feats: np.ndarray):
        """(adapted embedding, adapted probs, the embedding custom keywords were enrolled on): what
        ``edge.detect.Detector`` scores when custom keywords ride along."""
        x = self._input(feats)
        emb, probs = self.tail.infer(x)
        return emb, probs, (emb if self.base_tail is None else self.base_tail.infer(x)[0])
