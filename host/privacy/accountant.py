"""Rényi-DP accountant for the sampled Gaussian mechanism (DP-FedAvg's user-level guarantee).

Each round samples every user with probability ``q``, clips each user's
update to L2 norm C and adds N(0, (z·C)²) to the sum. Mironov, Talwar and
Zhang (2019, "Rényi Differential Privacy of the Sampled Gaussian Mechanism",
Sec. 3.3) give the RDP of one such step at integer order α exactly:

    A_α = Σ_{i=0..α} C(α,i) (1−q)^{α−i} q^i exp((i²−i)/(2z²)),   ε_RDP(α) = log A_α / (α−1)

computed here in log space. RDP composes by addition over steps; the
conversion to (ε, δ) is Balle et al. 2020 (Thm. 21), the tighter form also
used by Google's dp-accounting, minimised over the orders. Written here (a
few dozen lines) so the aggregator needs no extra dependency; the test
checks it against dp-accounting when that package is installed.

    acc = RdpAccountant()
    acc.step(q=0.01, noise_multiplier=1.1, steps=1000)
    eps = acc.epsilon(delta=1e-5)
"""

from __future__ import annotations

import math

import numpy as np

from edge.errors import EdgelearnError

DEFAULT_ORDERS = tuple(range(2, 129)) + (160, 192, 256, 320, 384, 512, 768, 1024)


def _logsumexp(xs: np.ndarray) -> float:
    m = float(np.max(xs))
    return m + math.log(float(np.sum(np.exp(xs - m))))


def rdp_sampled_gaussian(q: float, z: float, alpha: int) -> float:
    """RDP at integer order ``alpha`` of one step with sampling rate q and noise multiplier z."""
    if q == 0:
        return 0.0
    if z == 0:
        return math.inf
    if q == 1.0:
        return alpha / (2 * z * z)
    i = np.arange(alpha + 1, dtype=np.float64)
    log_binom = np.array([math.lgamma(alpha + 1) - math.lgamma(k + 1) - math.lgamma(alpha - k + 1)
                          for k in range(alpha + 1)])
    terms = log_binom + i * math.log(q) + (alpha - i) * math.log1p(-q) + (i * i - i) / (2 * z * z)
    return _logsumexp(terms) / (alpha - 1)


class RdpAccountant:
    """Accumulates RDP over rounds; ``epsilon(delta)`` is the (ε, δ)-DP guarantee so far."""

    def __init__(self, orders=DEFAULT_ORDERS):
        self.orders = np.asarray(orders, dtype=np.float64)
        self.rdp = np.zeros(len(self.orders))
        self.steps = 0

    def step(self, q: float, noise_multiplier: float, steps: int = 1) -> None:
        if not (0 <= q <= 1) or not noise_multiplier >= 0 or steps < 0:
            raise EdgelearnError(f"sampling rate q={q} must be in [0, 1], noise multiplier "
                                 f"{noise_multiplier} >= 0 and steps {steps} >= 0",
                                 fix="check the DP configuration")
        self.rdp += steps * np.array([rdp_sampled_gaussian(q, noise_multiplier, int(a)) for a in self.orders])
        self.steps += steps

    def epsilon(self, delta: float) -> float:
        if not 0 < delta < 1:
            raise EdgelearnError(f"delta={delta} must be in (0, 1)", fix="use e.g. 1e-5 (below 1/population)")
        a = self.orders
        with np.errstate(invalid="ignore", over="ignore"):
            eps = self.rdp + np.log1p(-1 / a) - (math.log(delta) + np.log(a)) / (a - 1)
        eps = eps[np.isfinite(eps)]
        return max(0.0, float(eps.min())) if eps.size else math.inf

    def state(self) -> dict:
        return {"orders": self.orders.tolist(), "rdp": self.rdp.tolist(), "steps": self.steps}

    @classmethod
    def from_state(cls, s: dict) -> "RdpAccountant":
        acc = cls(s["orders"])
        acc.rdp = np.asarray(s["rdp"], np.float64)
        acc.steps = int(s["steps"])
        return acc
