"""Trainers for the conv tail: bias-only, residual adapter, LoRA, sparse, full; SGD or Adam; exact bytes.

What trains (everything else, and the int8 backbone, is frozen):

* ``bias-only`` (TinyTL, Cai et al. 2020): ``dw4_b``, ``pw4_b``, ``cls_b``. Backward needs
  no layer inputs, only the ReLU masks (bit-packed); with dw4 frozen, pw4's mask
  collapses to per-channel active counts (the pooled statistics).
* ``residual-adapter`` (Houlsby et al. 2019): ``z = y + relu(y Ad) Bd`` after pw4 and
  after the classifier, ``Bd`` zero-initialised so training starts from the base.
* ``lora`` (Hu et al. 2021): rank-r ``A`` (small random), ``B`` (zero) beside pw4 and
  the classifier; ``ConvTail.merged()`` folds them in.
* ``sparse`` (MCUNetV3, Lin et al. 2022): all biases, plus the weight tensors with the
  largest contribution per byte (squared gradient norm on the adaptation data / the
  bytes training it costs: weight, gradient, optimiser state, kept input) picked
  greedily under ``memory_budget``.
* ``full``: every tail tensor.

``last_bytes`` after a step is the exact accounting of what the step held beyond
inference (each array's ``nbytes``): trainable parameters, gradients, optimiser
state, the activations kept for backward, and the backward/update workspace (the
largest set of temporaries alive at once). ``probe`` (optional) is called after
every allocation of backward and update, so a test can sample tracemalloc there.

    >>> tr = ConvTrainer(ConvTail(load_tail(bundle), qparams=bb.qparams), "bias-only", "adam")
    >>> loss = tr.step(x_int8, y)
"""

from __future__ import annotations

import numpy as np

from edge.adapt.conv import CLS_NAMES, ConvTail, dwconv_grad
from edge.adapt.prefix import Prefix
from edge.adapt.trainer import OPTIMIZERS, STRATEGIES, Resumable, _dlogits, _xent, check_targets
from edge.errors import EdgelearnError

WEIGHTS = ("dw4_w", "pw4_w", "cls_w")
PREFIX_PER_RAW = 3  # prefix examples per forward chunk for each raw one (see gradients)


def trained_names(tail: ConvTail, strategy: str, sparse_weights=()) -> list[str]:
    biases = (["dw4_b"] if tail.train_dw else []) + ["pw4_b", "cls_b"]
    if strategy == "bias-only":
        return biases
    if strategy == "full":
        return (["dw4_w"] if tail.train_dw else []) + ["pw4_w", "cls_w"] + biases
    if strategy == "sparse":
        return list(sparse_weights) + biases
    kind = "lora" if strategy == "lora" else "adapter"
    return [f"{layer}.{kind}_{ab}" for layer in ("pw4", "cls") for ab in "ab"]


def init_delta(tail: ConvTail, strategy: str, rank: int, rng) -> dict:
    c, k = tail.channels, tail.n_classes
    out = {}
    if strategy == "lora":
        for layer, cin, cout in (("pw4", c, c), ("cls", c, k)):
            out[f"{layer}.lora_a"] = (rng.standard_normal((cin, rank)) / np.sqrt(cin)).astype(np.float32)
            out[f"{layer}.lora_b"] = np.zeros((rank, cout), np.float32)
    elif strategy == "residual-adapter":
        for layer, cout in (("pw4", c), ("cls", k)):
            out[f"{layer}.adapter_a"] = (rng.standard_normal((cout, rank)) / np.sqrt(cout)).astype(np.float32)
            out[f"{layer}.adapter_b"] = np.zeros((rank, cout), np.float32)
    return out


class ConvTrainer(Resumable):
    def __init__(self, tail: ConvTail, strategy: str, optimizer: str = "sgd", lr: float | None = None,
                 rank: int = 4, sparse_weights=(), seed: int = 0, workspace_budget: int = 16 * 1024,
                 forward_chunk: int | None = 1):
        if strategy not in STRATEGIES:
            raise EdgelearnError(f"strategy {strategy!r} is unknown", fix=f"choose one of {STRATEGIES}")
        if optimizer not in OPTIMIZERS:
            raise EdgelearnError(f"optimizer {optimizer!r} is unknown", fix=f"choose one of {OPTIMIZERS}")
        bad = [w for w in sparse_weights if w not in WEIGHTS or (w == "dw4_w" and not tail.train_dw)]
        if bad:
            raise EdgelearnError(f"sparse weights {bad} are not trainable tail weights",
                                 fix=f"choose from {WEIGHTS} (pick them with choose_sparse())")
        self.tail, self.strategy, self.optimizer = tail, strategy, optimizer
        self.workspace_budget, self.forward_chunk = workspace_budget, forward_chunk
        self.lr = lr if lr is not None else (0.005 if optimizer == "adam" else 0.05)
        for k, v in init_delta(tail, strategy, rank, np.random.default_rng(seed)).items():
            tail.delta.setdefault(k, v)
        self.names = trained_names(tail, strategy, sparse_weights)
        for n in self.names:  # trained tensors live in delta, as copies of the base
            if n not in tail.delta:
                tail.delta[n] = tail.base[n].copy()
        self.grads = {n: np.zeros_like(tail.delta[n]) for n in self.names}
        adam = optimizer == "adam"
        self.m = {n: np.zeros_like(tail.delta[n]) for n in self.names} if adam else {}
        self.v = {n: np.zeros_like(tail.delta[n]) for n in self.names} if adam else {}
        self.t = 0
        self.last_bytes: dict[str, int] = {}
        self._probe = None
        self._ws = self._kept = 0

    # -- the frozen prefix -----------------------------------------------------------
    @property
    def stage(self) -> str:
        """Where this trainer's forward starts (``ConvTail.frozen_stage`` of its tensors)."""
        return self.tail.frozen_stage(self.names)

    def prepare(self, x):
        """What no trained tensor changes, computed once: pass the result to ``step`` instead of ``x``."""
        return self.tail.prefix(x, self.stage)

    # -- accounting ----------------------------------------------------------------
    def _hold(self, *temps) -> None:
        """Record the workspace of the temporaries alive now; let a test sample memory here."""
        self._ws = max(self._ws, sum(t.nbytes for t in temps if t is not None))
        if self._probe is not None:
            self._probe()

    def step_bytes(self) -> int:
        return sum(self.last_bytes.values())

    # -- one step --------------------------------------------------------------------
    def step(self, x, y: np.ndarray, probe=None, targets=None) -> float:
        """Forward + backward + update on a batch; returns the mean loss.

        ``x``: backbone outputs (int8 or float), or ``prepare(x)`` (the same step, with the
        frozen prefix computed once per example instead of every step).

        ``targets`` (optional, (n, classes)): soft target rows instead of the one-hot labels
        (``edge.adapt.run.train`` uses them to distil the base model on replay examples).
        """
        loss = self.gradients(x, y, probe, targets)
        self._update()
        self._probe = None
        self.last_bytes = {
            "params": sum(self.tail.delta[n].nbytes for n in self.names),
            "grads": sum(a.nbytes for a in self.grads.values()),
            "optimizer_state": sum(a.nbytes for a in self.m.values()) + sum(a.nbytes for a in self.v.values()),
            "activations": self._kept,
            "workspace": self._ws,
        }
        return loss

    def gradients(self, x, y: np.ndarray, probe=None, targets=None) -> float:
        """Forward + backward only: fills ``self.grads`` with the mean-loss gradients; returns the loss."""
        y = np.asarray(y, np.int64)
        if len(x) != len(y) or len(y) == 0:
            raise EdgelearnError(f"batch has {len(x)} inputs and {len(y)} labels", fix="pass one label per input")
        if y.min() < 0 or y.max() >= self.tail.n_classes:
            raise EdgelearnError(f"labels must be 0..{self.tail.n_classes - 1}, got {y.min()}..{y.max()}",
                                 fix="use the bundle's label ids")
        targets = check_targets(targets, len(y), self.tail.n_classes)
        wanted = set(self.names)
        chunk = self.forward_chunk
        if chunk is not None and isinstance(x, Prefix):
            # a raw example's forward holds at least three float maps (input, padded copy, depthwise
            # output and temporary); a prefix's holds one: three prefix examples per chunk hold no more
            chunk *= PREFIX_PER_RAW
        logits, keep, e = self.tail.forward(x, wanted, chunk=chunk)
        del e
        loss = _xent(logits, y, targets)
        g = _dlogits(logits, y, targets)
        del logits
        self._probe, self._ws = probe, 0
        if probe is not None:
            probe("forward")
        # the caller's own float input is not a copy the step holds; a dequantised int8 input is
        self._kept = sum(_nbytes(v) for k, v in keep.items() if not (k == "x" and v is x))
        self._backward(keep, g, wanted)
        del keep
        return loss

    def _linear_back(self, keep, layer, g, wanted, need_dx):
        """Gradients of one linear layer (and its LoRA/adapter); returns the gradient of its input."""
        t, G, s = self.tail, self.grads, self.tail.lora_scale
        flat = g.reshape(-1, g.shape[-1])
        if f"{layer}.adapter_a" in wanted:
            h = keep.pop(f"{layer}.h")
            np.matmul(h.reshape(-1, h.shape[-1]).T, flat, out=G[f"{layer}.adapter_b"])
            dh = g @ t.p(f"{layer}.adapter_b").T
            self._hold(g, dh)
            dh *= keep.pop(f"{layer}.ma")
            yk = keep.pop(f"{layer}.y")
            np.matmul(yk.reshape(-1, yk.shape[-1]).T, dh.reshape(-1, dh.shape[-1]), out=G[f"{layer}.adapter_a"])
            tt = dh @ t.p(f"{layer}.adapter_a").T
            self._hold(g, dh, tt)
            del dh
            tt += g
            g = tt
            flat = g.reshape(-1, g.shape[-1])
        if f"{layer}_b" in wanted:
            flat.sum(axis=0, out=G[f"{layer}_b"])
        if f"{layer}_w" in wanted:
            xin = keep.pop(f"{layer}.x")
            np.matmul(xin.reshape(-1, xin.shape[-1]).T, flat, out=G[f"{layer}_w"])
        dx = None
        if need_dx:
            dx = g @ t.p(f"{layer}_w").T
            self._hold(g, dx)
        if f"{layer}.lora_a" in wanted:
            u = keep.pop(f"{layer}.u")
            np.matmul(u.reshape(-1, u.shape[-1]).T, flat, out=G[f"{layer}.lora_b"])
            G[f"{layer}.lora_b"] *= s
            du = g @ t.p(f"{layer}.lora_b").T
            self._hold(g, dx, du)
            xin = keep.pop(f"{layer}.x")
            np.matmul(xin.reshape(-1, xin.shape[-1]).T, du.reshape(-1, du.shape[-1]), out=G[f"{layer}.lora_a"])
            G[f"{layer}.lora_a"] *= s
            if dx is not None:
                tt = du @ t.p(f"{layer}.lora_a").T
                self._hold(g, dx, du, tt)
                tt *= s
                dx += tt
                del tt
            del du
        return dx

    def _backward(self, keep: dict, g: np.ndarray, wanted: set) -> None:
        t = self.tail
        below = wanted - set(CLS_NAMES)
        de = self._linear_back(keep, "cls", g, wanted, need_dx=bool(below))
        self._hold(de)
        if not below:
            return
        if "maskp" in keep:  # through a federated head's projection (ConvTail: relu(e P + p))
            de *= keep.pop("maskp")
            de = de @ t.base["proj_w"].T
            self._hold(de)
        p = keep["P"]
        if "count2" in keep:  # bias-only on the bottom layer: C-vectors only
            de *= keep.pop("count2")
            de /= p
            de.sum(axis=0, out=self.grads["pw4_b"])
            self._hold(de)
            return
        b, c = de.shape
        de /= p
        dw_train = bool(wanted & {"dw4_w", "dw4_b"})
        if dw_train and not wanted & {"dw4_w", "pw4_w", "pw4.lora_a", "pw4.adapter_a"}:
            self._biases_by_chunks(keep, de)
            return
        mask2 = keep.pop("mask2")
        da2 = t.unmask(mask2).reshape(b, p, c).astype(de.dtype)
        self._hold(de, da2)
        da2 *= de[:, None, :]
        del de
        dy1 = self._linear_back(keep, "pw4", da2, wanted, need_dx=dw_train)
        del da2, mask2  # the host model keeps a layer's mask until its backward is done; so do we
        if not dw_train:
            return
        x = keep.pop("x", None)
        m1 = t.unmask(keep.pop("mask1"))
        self._hold(dy1, m1)
        dy1 = dy1.reshape(m1.shape)
        dy1 *= m1
        del m1
        if "dw4_b" in wanted:
            dy1.sum(axis=(0, 1, 2), out=self.grads["dw4_b"])
        if "dw4_w" in wanted:
            dwconv_grad(x, dy1, self.grads["dw4_w"])
            self._hold(dy1)

    def _biases_by_chunks(self, keep: dict, de: np.ndarray) -> None:
        """pw4_b and dw4_b gradients a few positions at a time: no P x C map is ever built.

        Only the bit-packed masks are read, so the workspace is ``chunk x C`` floats
        (TinyTL's point: bias gradients need no stored activations).
        """
        t, g = self.tail, self.grads
        b, c = de.shape
        (m2, shape2), (m1, shape1) = keep.pop("mask2"), keep.pop("mask1")
        p = keep["P"]
        m1 = m1.reshape(b, p, -1)  # (B, H, W, C or C/8) -> positions flattened, like mask2
        # at least 8 positions per chunk: fewer makes the Python loop, not the maths, the cost
        step = max(8, self.workspace_budget // (2 * b * c * 4))
        g["pw4_b"].fill(0)
        g["dw4_b"].fill(0)
        w_t = t.p("pw4_w").T
        for a in range(0, p, step):
            sl = slice(a, min(p, a + step))
            da2 = t.unmask((m2[:, sl], shape2)).astype(de.dtype)
            da2 *= de[:, None, :]
            g["pw4_b"] += da2.sum(axis=(0, 1))
            dy1 = da2 @ w_t
            self._hold(de, da2, dy1)
            dy1 *= t.unmask((m1[:, sl], shape1))
            g["dw4_b"] += dy1.sum(axis=(0, 1))

    def _update(self) -> None:
        self.t += 1
        b1, b2, eps = 0.9, 0.999, 1e-8
        lr_t = self.lr * np.sqrt(1 - b2 ** self.t) / (1 - b1 ** self.t)
        for n, g in self.grads.items():
            p = self.tail.delta[n]
            if self.optimizer == "sgd":
                g *= self.lr
                p -= g
                self._hold()
                continue
            m, v = self.m[n], self.v[n]
            m *= b1
            tmp = (1 - b1) * g
            self._hold(tmp)
            m += tmp
            np.multiply(g, g, out=g)
            g *= 1 - b2
            v *= b2
            v += g
            np.sqrt(v, out=g)
            g += eps
            np.divide(m, g, out=g)
            g *= lr_t
            p -= g
            del tmp

    def mix_replay(self, x, y, replay, n: int):
        """Append ``n`` replay examples (tail inputs) to a batch; see ``convreplay.mix_replay``."""
        from edge.adapt.convreplay import mix_replay

        return mix_replay(x, y, replay, n, to_float=self.tail.to_float)

    def replay_pool(self, replay, shape, teacher=None):
        """The replay buffer prepared for this trainer's runs (``convreplay.ReplayPool``; None if
        it is empty); ``shape``: one tail input's."""
        from edge.adapt.convreplay import ReplayPool

        if replay is None or replay.count == 0:
            return None
        return ReplayPool(replay, self, shape, teacher)


def _nbytes(v) -> int:
    if isinstance(v, tuple):  # a packed mask and its shape
        return v[0].nbytes
    return getattr(v, "nbytes", 0)


def contribution(tail: ConvTail, x, y) -> dict[str, float]:
    """Squared gradient norm of each tail weight on (x, y): its first-order loss reduction per unit step."""
    probe = ConvTail(tail.base, dict(tail.delta), tail.lora_scale, tail.qparams, tail.train_dw)
    tr = ConvTrainer(probe, "full", "sgd")
    tr.gradients(x, y)
    return {k: float((g.astype(np.float64) ** 2).sum()) for k, g in tr.grads.items()}


def choose_sparse(tail: ConvTail, x, y, memory_budget: int, optimizer: str = "sgd") -> list[str]:
    """Weights to train besides all biases: best contribution per byte, greedily, within the budget."""
    per_float = 4 * (2 + (2 if optimizer == "adam" else 0))  # param, grad, two moments
    n, p = len(x), int(np.prod(np.shape(x)[1:3]))
    biases = [k for k in trained_names(tail, "bias-only")]
    used = sum(tail.base[k].size * per_float for k in biases)
    contrib = contribution(tail, x, y)
    c = tail.channels
    kept_input = {"dw4_w": n * p * c * 4, "pw4_w": n * p * c * 4, "cls_w": n * c * 4}  # batch of len(x)
    cost = {k: tail.base[k].size * per_float + kept_input[k] for k in WEIGHTS if k in contrib}
    if used > memory_budget:
        raise EdgelearnError(f"memory budget {memory_budget} B does not even fit the biases ({used} B)",
                             fix="raise --memory-budget or use bias-only")
    chosen = []
    for k in sorted(cost, key=lambda k: -contrib[k] / cost[k]):
        if used + cost[k] <= memory_budget:
            chosen.append(k)
            used += cost[k]
    return chosen
