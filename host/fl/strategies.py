"""Aggregation strategies: FedAvg, FedAvgM, FedAdam, FedProx, trimmed mean and coordinate-wise median.

A strategy has one job: turn a stream of decoded client deltas into a new
model. ``begin(params)`` returns an accumulator; ``add(delta, num_examples,
weight)`` folds one client in and forgets it; ``apply(params, acc)`` returns
the new parameters. FedAvg-family accumulators are a running weighted sum, so
memory is O(model) whatever the number of clients; the robust ones (trimmed
mean, median) must see every value of a coordinate, so they buffer the
round's deltas (O(clients × model), bounded by the round size) and cannot be
combined with secure aggregation, which only ever reveals the sum. Any codec
works with any strategy: they see decoded float32 deltas (top-k frames decode
to sparse deltas whose zeros count, which is what error feedback assumes).
Subset frames (bias-only, adapter-only) are averaged per tensor over the
clients that sent that tensor.

    s = FedAvg()
    acc = s.begin(params)
    for upd in decoded_updates:
        acc.add({t.name: t.values for t in upd.tensors}, upd.header.num_examples)
    params = s.apply(params, acc)
"""

from __future__ import annotations

import numpy as np

from edge.errors import EdgelearnError


class StrategyError(EdgelearnError):
    """A delta does not fit the model, or a strategy was configured impossibly."""


class WeightedSum:
    """Per-tensor running sum of weight × delta in float64 (exact enough for 10^6 clients)."""

    def __init__(self, params: dict):
        self.shapes = {k: np.shape(v) for k, v in params.items()}
        self.sums = {k: np.zeros(s, np.float64) for k, s in self.shapes.items()}
        self.weights = {k: 0.0 for k in self.shapes}
        self.count = 0
        self.examples = 0

    def check(self, delta: dict) -> None:
        """Raise StrategyError unless every tensor is known, well-shaped and finite; changes nothing."""
        if not delta:
            raise StrategyError("the update carries no tensors", fix="send at least one trainable tensor")
        for k, v in delta.items():
            if k not in self.shapes:
                raise StrategyError(f"tensor {k!r} is not part of the federated model "
                                    f"(expected some of {sorted(self.shapes)})", fix="train the current task's tensors")
            if np.shape(v) != self.shapes[k] and np.size(v) != int(np.prod(self.shapes[k])):
                raise StrategyError(f"tensor {k!r} has shape {np.shape(v)}, the model's is {self.shapes[k]}",
                                    fix="fetch the current bundle before training")
            if not np.all(np.isfinite(v)):
                raise StrategyError(f"tensor {k!r} holds NaN or infinity", fix="drop the diverged update")

    def add(self, delta: dict, num_examples: int = 1, weight: float | None = None) -> None:
        self.check(delta)
        w = float(num_examples if weight is None else weight)
        for k, v in delta.items():
            self.sums[k] += w * np.asarray(v, np.float64).reshape(self.shapes[k])
            self.weights[k] += w
        self.count += 1
        self.examples += int(num_examples)

    def mean(self) -> dict:
        """Weighted mean delta per tensor; tensors nobody sent are zero (unchanged)."""
        return {k: (self.sums[k] / self.weights[k] if self.weights[k] > 0 else np.zeros(s)).astype(np.float32)
                for k, s in self.shapes.items()}


class Strategy:
    """Base: FedAvg semantics; subclasses change the server step or the accumulator."""
    name = "base"
    robust = False          # True: needs individual updates (no secure aggregation)
    server_lr = 1.0

    def begin(self, params: dict):
        return WeightedSum(params)

    def client_config(self) -> dict:
        """What a client needs to know to train for this strategy (sent in the task)."""
        return {}

    def step(self, params: dict, mean_delta: dict) -> dict:
        return {k: (np.asarray(params[k], np.float32) + np.float32(self.server_lr) * mean_delta[k]).astype(np.float32)
                for k in params}

    def apply(self, params: dict, acc) -> dict:
        if acc.count == 0:
            raise StrategyError("no updates to aggregate", fix="wait for the quorum")
        return self.step(params, acc.mean())

    # Server-side state that must survive a restart (momentum); arrays only.
    def state(self) -> dict:
        return {}

    def load_state(self, state: dict) -> None:
        pass


class FedAvg(Strategy):
    """McMahan et al. 2017: the mean of client deltas weighted by their example counts."""
    name = "fedavg"

    def __init__(self, server_lr: float = 1.0):
        self.server_lr = float(server_lr)


class FedProx(FedAvg):
    """Li et al. 2020: FedAvg on the server; clients add (mu/2)·||w − w_global||² to their loss."""
    name = "fedprox"

    def __init__(self, mu: float = 0.01, server_lr: float = 1.0):
        super().__init__(server_lr)
        if not mu >= 0:
            raise StrategyError(f"FedProx mu={mu} must be >= 0", fix="use e.g. mu=0.01")
        self.mu = float(mu)

    def client_config(self) -> dict:
        return {"prox_mu": self.mu}


class FedAvgM(FedAvg):
    """Hsu et al. 2019: server momentum v ← β·v + Δ̄, w ← w + lr·v (helps under non-IID data)."""
    name = "fedavgm"

    def __init__(self, momentum: float = 0.9, server_lr: float = 1.0):
        super().__init__(server_lr)
        if not 0 <= momentum < 1:
            raise StrategyError(f"momentum={momentum} must be in [0, 1)", fix="use e.g. 0.9")
        self.momentum = float(momentum)
        self.velocity: dict = {}

    def step(self, params: dict, mean_delta: dict) -> dict:
        for k, d in mean_delta.items():
            v = self.velocity.get(k)
            self.velocity[k] = d.astype(np.float32) if v is None else (self.momentum * v + d).astype(np.float32)
        return super().step(params, self.velocity)

    def state(self) -> dict:
        return {f"velocity:{k}": v for k, v in self.velocity.items()}

    def load_state(self, state: dict) -> None:
        self.velocity = {k.split(":", 1)[1]: np.asarray(v, np.float32)
                         for k, v in state.items() if k.startswith("velocity:")}


class FedAdam(FedAvg):
    """Reddi et al. 2021 ("Adaptive Federated Optimization"): the mean delta Δ̄ is a pseudo-gradient
    for a server-side Adam without bias correction, m ← β1·m + (1 − β1)·Δ̄, v ← β2·v + (1 − β2)·Δ̄²,
    w ← w + η·m / (√v + τ): each coordinate moves by about η whatever the size of the clients' steps.
    The defaults are Flower's ``FedAdam`` (η 0.1, β1 0.9, β2 0.99) with τ 1e-3 (with Flower's 1e-9 any
    coordinate a client moved at all, however little, moves by a full η on the first update: top-k
    frames touch many coordinates by tiny amounts)."""
    name = "fedadam"

    def __init__(self, eta: float = 0.1, beta_1: float = 0.9, beta_2: float = 0.99, tau: float = 1e-3):
        super().__init__(1.0)
        for what, v, ok in (("eta", eta, eta > 0), ("beta_1", beta_1, 0 <= beta_1 < 1),
                            ("beta_2", beta_2, 0 <= beta_2 < 1), ("tau", tau, tau > 0)):
            if not ok or not np.isfinite(v):
                raise StrategyError(f"FedAdam {what}={v} is out of range",
                                    fix="use eta > 0, beta_1 and beta_2 in [0, 1), tau > 0 (e.g. 0.1, 0.9, 0.99, 1e-3)")
        self.eta, self.b1, self.b2, self.tau = float(eta), float(beta_1), float(beta_2), float(tau)
        self.m: dict = {}
        self.v: dict = {}

    def step(self, params: dict, mean_delta: dict) -> dict:
        out = {}
        for k in params:
            d = np.asarray(mean_delta[k], np.float32)
            m = self.m.get(k, np.zeros_like(d))
            v = self.v.get(k, np.zeros_like(d))
            self.m[k] = (self.b1 * m + (1 - self.b1) * d).astype(np.float32)
            self.v[k] = (self.b2 * v + (1 - self.b2) * d * d).astype(np.float32)
            out[k] = (np.asarray(params[k], np.float32)
                      + np.float32(self.eta) * self.m[k] / (np.sqrt(self.v[k]) + np.float32(self.tau))).astype(np.float32)
        return out

    def state(self) -> dict:
        return {**{f"m:{k}": a for k, a in self.m.items()}, **{f"v:{k}": a for k, a in self.v.items()}}

    def load_state(self, state: dict) -> None:
        self.m = {k[2:]: np.asarray(a, np.float32) for k, a in state.items() if k.startswith("m:")}
        self.v = {k[2:]: np.asarray(a, np.float32) for k, a in state.items() if k.startswith("v:")}


class _Buffered(WeightedSum):
    """Keeps every delta (robust statistics need all values of a coordinate), up to ``limit``."""

    def __init__(self, params: dict, limit: int):
        super().__init__(params)
        self.limit = limit
        self.rows: dict = {k: [] for k in self.shapes}

    def add(self, delta: dict, num_examples: int = 1, weight: float | None = None) -> None:
        self.check(delta)
        if self.count >= self.limit:
            raise StrategyError(f"robust aggregation buffers at most {self.limit} updates per round",
                                fix="raise max_updates or use FedAvg")
        for k, v in delta.items():
            self.rows[k].append(np.asarray(v, np.float32).reshape(self.shapes[k]))
            self.weights[k] += 1.0
        self.count += 1
        self.examples += int(num_examples)


class TrimmedMean(Strategy):
    """Yin et al. 2018: per coordinate, drop the ``beta`` fraction of largest and smallest values, average the rest."""
    name = "trimmed_mean"
    robust = True

    def __init__(self, beta: float = 0.1, max_updates: int = 1000, server_lr: float = 1.0):
        if not 0 <= beta < 0.5:
            raise StrategyError(f"trim fraction beta={beta} must be in [0, 0.5)", fix="use e.g. 0.1")
        self.beta, self.max_updates, self.server_lr = float(beta), int(max_updates), float(server_lr)

    def begin(self, params):
        return _Buffered(params, self.max_updates)

    def reduce(self, stack: np.ndarray) -> np.ndarray:
        n = stack.shape[0]
        t = int(np.floor(self.beta * n))
        s = np.sort(stack, axis=0)
        return s[t:n - t].mean(axis=0)

    def apply(self, params, acc):
        if acc.count == 0:
            raise StrategyError("no updates to aggregate", fix="wait for the quorum")
        mean = {k: (self.reduce(np.stack(rows)).astype(np.float32) if rows else np.zeros(acc.shapes[k], np.float32))
                for k, rows in acc.rows.items()}
        return self.step(params, mean)


class Median(TrimmedMean):
    """Coordinate-wise median (Yin et al. 2018): robust to up to half the clients being arbitrary."""
    name = "median"

    def __init__(self, max_updates: int = 1000, server_lr: float = 1.0):
        super().__init__(0.0, max_updates, server_lr)

    def reduce(self, stack):
        return np.median(stack, axis=0)


STRATEGIES = {"fedavg": FedAvg, "fedavgm": FedAvgM, "fedadam": FedAdam, "fedprox": FedProx,
              "trimmed_mean": TrimmedMean, "median": Median}


def make_strategy(name: str, **kwargs) -> Strategy:
    """A strategy by name with keyword options (``make_strategy("fedprox", mu=0.1)``)."""
    cls = STRATEGIES.get(name)
    if cls is None:
        raise StrategyError(f"unknown strategy {name!r}", fix=f"choose one of {', '.join(STRATEGIES)}")
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise StrategyError(f"strategy {name!r}: {e}", fix="check the option names") from None
