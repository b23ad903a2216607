"""User-level DP: clipping, noise calibration and the RDP accountant against closed forms and
Google's dp-accounting (when installed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from host.fl.strategies import FedAvg, Median, StrategyError
from host.privacy.accountant import RdpAccountant, rdp_sampled_gaussian
from host.privacy.dp import DPStrategy, clip_delta


def test_full_batch_gaussian_rdp_is_the_closed_form():
    for z in (0.5, 1.0, 3.0):
        for a in (2, 5, 32):
            assert rdp_sampled_gaussian(1.0, z, a) == pytest.approx(a / (2 * z * z))
            # the binomial sum at q=1 collapses to the same value
            assert rdp_sampled_gaussian(1 - 1e-12, z, a) == pytest.approx(a / (2 * z * z), rel=1e-6)


@pytest.mark.parametrize("q,z,steps", [(0.01, 1.1, 1000), (0.1, 2.0, 50), (1.0, 5.0, 10), (0.05, 0.8, 200)])
def test_epsilon_matches_dp_accounting(q, z, steps):
    dpa = pytest.importorskip("dp_accounting")
    from dp_accounting.rdp import rdp_privacy_accountant as rdp
    orders = list(range(2, 129)) + [160, 192, 256, 320, 384, 512, 768, 1024]
    ref = rdp.RdpAccountant(orders)
    ref.compose(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps))
    ours = RdpAccountant()
    ours.step(q, z, steps)
    assert ours.epsilon(1e-5) == pytest.approx(ref.get_epsilon(1e-5), rel=1e-6)


def test_epsilon_grows_with_steps_and_shrinks_with_noise():
    a, b, c = RdpAccountant(), RdpAccountant(), RdpAccountant()
    a.step(0.05, 1.0, 100)
    b.step(0.05, 1.0, 400)
    c.step(0.05, 2.0, 100)
    assert c.epsilon(1e-5) < a.epsilon(1e-5) < b.epsilon(1e-5)
    assert RdpAccountant.from_state(a.state()).epsilon(1e-5) == a.epsilon(1e-5)
    with pytest.raises(Exception):
        a.epsilon(0)


def test_clipping_is_over_the_whole_update_and_noise_has_the_calibrated_scale():
    d = {"a": np.array([3.0, 0.0], np.float32), "b": np.array([4.0], np.float32)}
    c, norm = clip_delta(d, 1.0)
    assert norm == pytest.approx(5.0)
    assert math.sqrt(sum(float(np.sum(v ** 2)) for v in c.values())) == pytest.approx(1.0, rel=1e-6)
    params = {"w": np.zeros(20000, np.float32)}
    s = DPStrategy(FedAvg(), clip_norm=0.5, noise_multiplier=2.0, expected_clients=10, population=100, seed=0)
    acc = s.begin(params)
    for _ in range(10):
        acc.add({"w": np.full(20000, 100.0, np.float32)}, 1000)  # huge update, huge weight: both capped
    new = s.apply(params, acc)["w"]
    clipped_mean = 10 * 0.5 / math.sqrt(20000) / 10
    assert np.mean(new) == pytest.approx(clipped_mean, abs=0.01)
    assert np.std(new) == pytest.approx(2.0 * 0.5 / 10, rel=0.05)
    assert s.accountant.steps == 1 and s.accountant.epsilon(1e-5) > 0


def test_dp_refuses_robust_strategies():
    with pytest.raises(StrategyError):
        DPStrategy(Median(), 1.0, 1.0, 10)
