"""Trainers for the tail: bias-only, adapter, LoRA, sparse, full; SGD or Adam; exact bytes.

Strategies (what trains; everything else, and the int8 backbone, is frozen):

* ``bias-only`` (TinyTL, Cai et al. 2020): ``proj.b``, ``classifier.b``.
* ``residual-adapter`` (Houlsby et al. 2019): ``adapter.a`` (dim x r), ``adapter.b``
  (r x dim, zero-initialised so training starts from the base model).
* ``lora`` (Hu et al. 2021): ``lora_a`` (cin x r, small random), ``lora_b`` (r x cout,
  zero) beside both weights; ``EmbeddingHead.merged()`` folds them in.
* ``sparse`` (MCUNetV3, Lin et al. 2022): the tensors with the largest contribution
  per byte (squared gradient norm on the adaptation data / bytes it costs to train,
  weights and their optimiser state) picked greedily under ``memory_budget`` bytes.
* ``full``: every tail tensor.

Every step mixes ``replay`` examples (from ``edge.portable.replay``) into the batch.
``step_bytes()`` is the exact accounting of what a step holds beyond inference:
trainable parameters, gradients, optimiser state and the activations kept for
backward (each array's ``nbytes``); ``bench/adapt_memory`` compares it with
tracemalloc and with ``host.partition.training``'s prediction.

    >>> tr = Trainer(EmbeddingHead(base), "lora", optimizer="adam", rank=4)
    >>> for x, y in batches: tr.step(x, y)
    >>> delta = tr.tail.merged()
"""

from __future__ import annotations

import numpy as np

from edge.adapt.strategies import OPTIMIZERS, STRATEGIES  # noqa: F401 (re-exported)
from edge.adapt.head import EmbeddingHead
from edge.errors import EdgelearnError
from edge.replay import sample_slots, slot_arrays

CANDIDATES = ("proj.w", "proj.b", "classifier.w", "classifier.b")


def init_delta(tail: EmbeddingHead, strategy: str, rank: int, rng) -> dict:
    d, c = tail.dim, tail.n_classes
    if strategy == "residual-adapter":
        return {"adapter.a": (rng.standard_normal((d, rank)) / np.sqrt(d)).astype(np.float32),
                "adapter.b": np.zeros((rank, d), np.float32)}
    if strategy == "lora":
        return {"proj.lora_a": (rng.standard_normal((d, rank)) / np.sqrt(d)).astype(np.float32),
                "proj.lora_b": np.zeros((rank, d), np.float32),
                "classifier.lora_a": (rng.standard_normal((d, rank)) / np.sqrt(d)).astype(np.float32),
                "classifier.lora_b": np.zeros((rank, c), np.float32)}
    return {}


def contribution(tail: EmbeddingHead, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Squared gradient norm per candidate tensor on (x, y): its first-order loss reduction per unit step."""
    logits, cache = tail.forward(x, keep=True)
    g = tail.backward(cache, _dlogits(logits, y), set(CANDIDATES))
    return {k: float((v.astype(np.float64) ** 2).sum()) for k, v in g.items()}


def choose_sparse(tail: EmbeddingHead, x, y, memory_budget: int, optimizer: str) -> list[str]:
    per_float = 4 * (2 + (2 if optimizer == "adam" else 0))  # param, grad, moments
    contrib = contribution(tail, x, y)
    cost = {k: tail.p(k).size * per_float for k in CANDIDATES}
    chosen, used = [], 0
    for k in sorted(CANDIDATES, key=lambda k: -contrib[k] / cost[k]):
        if used + cost[k] <= memory_budget:
            chosen.append(k)
            used += cost[k]
    if not chosen:
        raise EdgelearnError(f"memory budget {memory_budget} B fits no tail tensor "
                             f"(smallest needs {min(cost.values())} B)", fix="raise --memory-budget")
    return chosen


def _dlogits(logits: np.ndarray, y: np.ndarray, targets: np.ndarray | None = None) -> np.ndarray:
    """Gradient of the mean cross-entropy w.r.t. the logits: labels ``y``, or soft ``targets`` (n, C)."""
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    if targets is None:
        p[np.arange(len(y)), y] -= 1.0
    else:
        p -= targets
    p /= len(y)
    return p


def _xent(logits: np.ndarray, y: np.ndarray, targets: np.ndarray | None = None) -> float:
    """Mean cross-entropy of the logits against labels ``y`` or soft ``targets``."""
    z = logits - logits.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=1))
    if targets is None:
        return float(np.mean(lse - z[np.arange(len(y)), y]))
    return float(np.mean(lse - (targets * z).sum(axis=1)))


def check_targets(targets, n: int, n_classes: int):
    if targets is None:
        return None
    t = np.asarray(targets, np.float32)
    if t.shape != (n, n_classes):
        raise EdgelearnError(f"soft targets have shape {t.shape}, the batch needs ({n}, {n_classes})",
                             fix="one probability row per input")
    return t


class Resumable:
    """Pause/resume for a trainer with ``tail.delta``, Adam moments ``m``/``v`` and step count ``t``."""

    def state(self) -> dict:
        """Everything needed to resume exactly: delta, optimiser moments, step count."""
        out = {f"delta/{k}": v for k, v in self.tail.delta.items()}
        out.update({f"m/{k}": v for k, v in self.m.items()})
        out.update({f"v/{k}": v for k, v in self.v.items()})
        out["t"] = np.array(self.t)
        return out

    def load_state(self, st: dict) -> None:
        for k, v in st.items():
            kind, _, name = k.partition("/")
            target = {"delta": self.tail.delta, "m": self.m, "v": self.v}.get(kind)
            if target is not None:
                target[name] = np.asarray(v, np.float32)
        self.t = int(st.get("t", 0))


class Trainer(Resumable):
    def __init__(self, tail: EmbeddingHead, strategy: str, optimizer: str = "sgd", lr: float | None = None,
                 rank: int = 4, sparse_tensors: list[str] | None = None, seed: int = 0,
                 weight_decay_to_base: float = 0.0):
        if strategy not in STRATEGIES:
            raise EdgelearnError(f"strategy {strategy!r} is unknown", fix=f"choose one of {STRATEGIES}")
        if optimizer not in OPTIMIZERS:
            raise EdgelearnError(f"optimizer {optimizer!r} is unknown", fix=f"choose one of {OPTIMIZERS}")
        rng = np.random.default_rng(seed)
        self.tail, self.strategy, self.optimizer = tail, strategy, optimizer
        self.lr = lr if lr is not None else (0.01 if optimizer == "adam" else 0.1)
        tail.delta.update({k: v for k, v in init_delta(tail, strategy, rank, rng).items()
                           if k not in tail.delta})
        if strategy == "bias-only":
            names = ["proj.b", "classifier.b"]
        elif strategy == "full":
            names = list(CANDIDATES)
        elif strategy == "sparse":
            if not sparse_tensors:
                raise EdgelearnError("sparse update needs its tensors", fix="pick them with choose_sparse()")
            names = list(sparse_tensors)
        else:
            names = sorted(k for k in tail.delta if k.startswith(("adapter.", "proj.lora", "classifier.lora")))
        for n in names:  # trained tensors live in delta, as copies of the base
            if n not in tail.delta:
                tail.delta[n] = tail.base[n].copy()
        self.names = names
        self.wd = weight_decay_to_base
        self.t = 0
        self.m = {n: np.zeros_like(tail.delta[n]) for n in names} if optimizer == "adam" else {}
        self.v = {n: np.zeros_like(tail.delta[n]) for n in names} if optimizer == "adam" else {}
        self.last_bytes: dict[str, int] = {}

    def step(self, x: np.ndarray, y: np.ndarray, targets=None) -> float:
        """One forward + backward + update on a batch; returns the mean cross-entropy.

        ``targets`` (optional, (n, classes)): soft target rows instead of the one-hot labels.
        """
        x = np.asarray(x, np.float32)
        y = np.asarray(y, np.int64)
        targets = check_targets(targets, len(y), self.tail.n_classes)
        logits, cache = self.tail.forward(x, keep=True)
        keep = self._kept(cache)
        dl = _dlogits(logits, y, targets)
        loss = _xent(logits, y, targets)
        grads = self.tail.backward(keep, dl, set(self.names))
        self.last_bytes = {
            "params": sum(self.tail.delta[n].nbytes for n in self.names),
            "grads": sum(g.nbytes for g in grads.values()),
            "optimizer_state": sum(a.nbytes for a in self.m.values()) + sum(a.nbytes for a in self.v.values()),
            "activations": sum(a.nbytes for a in keep.values() if a is not x),
        }
        self._update(grads)
        return loss

    def _kept(self, cache: dict) -> dict:
        """Only what this strategy's backward reads (bias-only keeps masks, not inputs)."""
        names = set(self.names)
        need = {"h2"} if names & {"classifier.w", "classifier.lora_a"} else set()
        if any(n.startswith(("proj.", "adapter.")) for n in names):
            need.add("mask1")
            if "umask" in cache:
                need.add("umask")
            if "adapter.b" in names:
                need.add("v")
            if "adapter.a" in names:
                need.add("h")
            if names & {"proj.w", "proj.lora_a"}:
                need.add("x")
        return {k: v for k, v in cache.items() if k in need}

    def _update(self, grads: dict) -> None:
        self.t += 1
        for n, g in grads.items():
            p = self.tail.delta[n]
            if self.wd and n in self.tail.base:
                g = g + self.wd * (p - self.tail.base[n])
            if self.optimizer == "sgd":
                g *= self.lr
                p -= g
                continue
            b1, b2, eps = 0.9, 0.999, 1e-8
            m, v = self.m[n], self.v[n]
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * g * g
            lr_t = self.lr * np.sqrt(1 - b2 ** self.t) / (1 - b1 ** self.t)
            p -= lr_t * m / (np.sqrt(v) + eps)

    def step_bytes(self) -> int:
        return sum(self.last_bytes.values())


def mix_replay(x, y, replay, n: int, label_map=None):
    """Append ``n`` class-balanced replay examples to a batch (the anti-forgetting step)."""
    if replay is None or replay.count == 0 or n <= 0:
        return x, y
    rx, ry = slot_arrays(replay, sample_slots(replay, n))
    return np.concatenate([x, rx]), np.concatenate([y, ry])
