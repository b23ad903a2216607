"""User-level DP for FedAvg-family strategies: clip each client's whole update, add Gaussian noise.

DP-FedAvg (McMahan et al. 2018): every client's delta is scaled to L2 norm
at most C (over all its tensors together, so the guarantee is per user, not
per tensor), clients count equally, and N(0, (z·C)²) is added to the sum,
which is divided by the *expected* number of clients so one client's presence
changes the result by at most C / expected. The accountant then reports ε at
δ for sampling rate q = expected / population.

    dp = DPStrategy(FedAvg(), clip_norm=1.0, noise_multiplier=1.0, expected_clients=10)
    acc = dp.begin(params); acc.add(delta, n); params = dp.apply(params, acc)
"""

from __future__ import annotations

import numpy as np

from host.fl.strategies import Strategy, StrategyError, WeightedSum
from host.privacy.accountant import RdpAccountant


def clip_delta(delta: dict, clip_norm: float) -> tuple[dict, float]:
    """Scale ``delta`` so its global L2 norm is at most ``clip_norm``; returns (clipped, original norm)."""
    norm = float(np.sqrt(sum(float(np.sum(np.square(np.asarray(v, np.float64)))) for v in delta.values())))
    f = 1.0 if norm <= clip_norm or norm == 0 else clip_norm / norm
    return {k: np.asarray(v, np.float32) * np.float32(f) for k, v in delta.items()}, norm


class _ClippedSum(WeightedSum):
    def __init__(self, params, clip_norm):
        super().__init__(params)
        self.clip_norm = clip_norm
        self.clipped = 0

    def add(self, delta, num_examples=1, weight=None):
        self.check(delta)
        d, norm = clip_delta(delta, self.clip_norm)
        self.clipped += norm > self.clip_norm
        super().add(d, num_examples, weight=1.0)


class DPStrategy(Strategy):
    """Wraps a FedAvg-family strategy with user-level clipping, Gaussian noise and an RDP accountant."""

    def __init__(self, inner: Strategy, clip_norm: float, noise_multiplier: float, expected_clients: int,
                 population: int | None = None, seed=None):
        if inner.robust:
            raise StrategyError(f"DP noise calibration here assumes a sum; {inner.name} is not a sum",
                                fix="use fedavg, fedavgm or fedprox with DP")
        if not clip_norm > 0 or not noise_multiplier >= 0 or expected_clients < 1:
            raise StrategyError("DP needs clip_norm > 0, noise_multiplier >= 0 and expected_clients >= 1",
                                fix="e.g. clip_norm=1.0, noise_multiplier=1.0")
        self.inner = inner
        self.name = f"dp-{inner.name}"
        self.clip_norm, self.z, self.expected = float(clip_norm), float(noise_multiplier), int(expected_clients)
        self.population = population
        self.rng = np.random.default_rng(seed)
        self.accountant = RdpAccountant()

    def begin(self, params):
        return _ClippedSum(params, self.clip_norm)

    def client_config(self):
        return {**self.inner.client_config(), "clip_norm": self.clip_norm}

    def noisy_mean(self, acc) -> dict:
        sigma = self.z * self.clip_norm
        return {k: ((acc.sums[k] + self.rng.normal(0.0, sigma, acc.sums[k].shape)) / self.expected).astype(np.float32)
                for k in acc.shapes}

    def apply(self, params, acc):
        if acc.count == 0:
            raise StrategyError("no updates to aggregate", fix="wait for the quorum")
        q = min(1.0, self.expected / self.population) if self.population else 1.0
        self.accountant.step(q, self.z)
        return self.inner.step(params, self.noisy_mean(acc))

    def state(self):
        return self.inner.state()

    def load_state(self, state):
        self.inner.load_state(state)
