"""The trainable tail: the layers on top of the frozen int8 encoder's 64-d embedding.

The encoder (int8, never changed on the device) ends in global average pooling
to a non-negative 64-d embedding ``e`` and a dense classifier. The device's
tail is two float32 dense layers on ``e``::

    z1 = e @ W1 + b1 [+ s * (e @ A1) @ B1]         "proj": 64 -> 64, identity-initialised
    h  = relu(z1)                                  (= e at start, since e >= 0)
    h2 = h [+ relu(h @ Ad) @ Bd]                   residual bottleneck adapter (rank r)
    logits = h2 @ W2 + b2 [+ s * (h2 @ A2) @ B2]   "classifier": the bundle's, recovered exactly

so before any training the tail computes exactly the bundle's posteriors. The
bundle's classifier weights are recovered from its float32 encoder by least
squares on its own outputs: centred log-softmax is linear in the embedding,
so 512 random inputs pin ``W2``, ``b2`` down to float rounding (no TensorFlow,
no flatbuffer parsing on the device).

Base parameters and adapted parameters are separate dicts: ``EmbeddingHead(base, delta)``
uses ``delta[name]`` where present (a replaced tensor, or LoRA/adapter factors)
and the base otherwise, so contexts are swapped by swapping ``delta``.

    >>> base = classifier_from_bundle(bundle)
    >>> tail = EmbeddingHead(base, {})
    >>> probs = tail.probs(embeddings)
"""

from __future__ import annotations

import numpy as np

from edge.errors import EdgelearnError

LINEAR = ("proj", "classifier")


def classifier_from_bundle(bundle, samples: int = 512, seed: int = 0) -> dict[str, np.ndarray]:
    """Base tail parameters: identity projection + the bundle's classifier (float32)."""
    from edge.kws import KeywordModel

    try:
        km = KeywordModel(bundle, precision="float32")
    except EdgelearnError as e:
        raise EdgelearnError(f"cannot recover the classifier: {e}",
                             fix="use a bundle with a float32 encoder partition") from None
    rng = np.random.default_rng(seed)
    emb, probs = km.infer(rng.standard_normal((samples, 49, 10)).astype(np.float32) * 1.5)
    if km.part.get("precision") != "float32":
        raise EdgelearnError(f"bundle {bundle.model_id} has no float32 encoder",
                             fix="the classifier can only be recovered exactly from float32 outputs")
    logp = np.log(np.maximum(probs.astype(np.float64), 1e-300))
    logp -= logp.mean(axis=1, keepdims=True)
    a = np.c_[emb.astype(np.float64), np.ones(len(emb))]
    sol, *_ = np.linalg.lstsq(a, logp, rcond=None)
    err = float(np.abs(a @ sol - logp).max())
    if err > 1e-3:
        raise EdgelearnError(f"the bundle's classifier is not a dense layer on its embedding "
                             f"(least-squares residual {err:.3g})", fix="adapt needs a DS-CNN-style bundle")
    dim = emb.shape[1]
    return {"proj.w": np.eye(dim, dtype=np.float32), "proj.b": np.zeros(dim, np.float32),
            "classifier.w": sol[:-1].astype(np.float32), "classifier.b": sol[-1].astype(np.float32)}


class EmbeddingHead:
    """Forward/backward of the tail for one strategy; ``delta`` overrides ``base``."""

    def __init__(self, base: dict, delta: dict | None = None, lora_scale: float = 1.0):
        self.base = base
        self.delta = dict(delta or {})
        self.lora_scale = lora_scale

    def p(self, name: str):
        return self.delta[name] if name in self.delta else self.base.get(name)

    @property
    def dim(self) -> int:
        return self.base["proj.w"].shape[0]

    @property
    def n_classes(self) -> int:
        return self.base["classifier.w"].shape[1]

    def _linear(self, x, layer):
        y = x @ self.p(f"{layer}.w") + self.p(f"{layer}.b")
        a = self.p(f"{layer}.lora_a")
        if a is not None:
            y += self.lora_scale * ((x @ a) @ self.p(f"{layer}.lora_b"))
        return y

    def forward(self, x: np.ndarray, keep: bool = False):
        """Logits, and (if keep) the activations backward needs."""
        z1 = self._linear(x, "proj")
        h = np.maximum(z1, 0.0)
        cache = {"x": x, "mask1": z1 > 0} if keep else None
        ad = self.p("adapter.a")
        if ad is not None:
            u = h @ ad
            v = np.maximum(u, 0.0)
            h2 = h + v @ self.p("adapter.b")
            if keep:
                cache.update(h=h, v=v, umask=u > 0)
        else:
            h2 = h
        if keep:
            cache["h2"] = h2
        return self._linear(h2, "classifier"), cache

    def probs(self, x: np.ndarray) -> np.ndarray:
        logits, _ = self.forward(np.asarray(x, np.float32))
        logits -= logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        return e / e.sum(axis=1, keepdims=True)

    def backward(self, cache: dict, dlogits: np.ndarray, wanted: set) -> dict:
        """Gradients of the parameters named in ``wanted`` (and only what they need)."""
        g = {}
        s = self.lora_scale
        h2 = cache.get("h2")
        if "classifier.b" in wanted:
            g["classifier.b"] = dlogits.sum(axis=0)
        if "classifier.w" in wanted:
            g["classifier.w"] = h2.T @ dlogits
        if "classifier.lora_a" in wanted:
            a, b = self.p("classifier.lora_a"), self.p("classifier.lora_b")
            g["classifier.lora_b"] = s * ((h2 @ a).T @ dlogits)
            g["classifier.lora_a"] = s * (h2.T @ (dlogits @ b.T))
        lower = {n for n in wanted if n.startswith(("proj.", "adapter."))}
        if not lower:
            return g
        dh2 = dlogits @ self.p("classifier.w").T
        if self.p("classifier.lora_a") is not None:
            dh2 += s * ((dlogits @ self.p("classifier.lora_b").T) @ self.p("classifier.lora_a").T)
        dh = dh2
        if self.p("adapter.a") is not None:
            if "adapter.b" in wanted:
                g["adapter.b"] = cache["v"].T @ dh2
            du = (dh2 @ self.p("adapter.b").T) * cache["umask"]
            if "adapter.a" in wanted:
                g["adapter.a"] = cache["h"].T @ du
            dh = dh2 + du @ self.p("adapter.a").T
        if not any(n.startswith("proj.") for n in wanted):
            return g
        dz1 = dh * cache["mask1"]
        x = cache.get("x")
        if "proj.b" in wanted:
            g["proj.b"] = dz1.sum(axis=0)
        if "proj.w" in wanted:
            g["proj.w"] = x.T @ dz1
        if "proj.lora_a" in wanted:
            a, b = self.p("proj.lora_a"), self.p("proj.lora_b")
            g["proj.lora_b"] = s * ((x @ a).T @ dz1)
            g["proj.lora_a"] = s * (x.T @ (dz1 @ b.T))
        return g

    def merged(self) -> dict:
        """Delta with LoRA folded into the weights (zero extra inference cost)."""
        out = {k: v for k, v in self.delta.items() if ".lora_" not in k}
        for layer in LINEAR:
            a = self.p(f"{layer}.lora_a")
            if a is not None:
                out[f"{layer}.w"] = (self.p(f"{layer}.w") + self.lora_scale * (a @ self.p(f"{layer}.lora_b"))
                                     ).astype(np.float32)
        return out
