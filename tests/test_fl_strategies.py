"""Strategies: FedAvg over decoded wire updates equals Flower's ``aggregate`` formula; robust ones
equal numpy references; momentum, subsets, and the running sum's O(model) memory."""

from __future__ import annotations

from functools import reduce

import numpy as np
import pytest

from edge.portable.wire import DENSE_F32, FLAG_DELTA, INT8, TOPK_INT8, Header
from host.fl.strategies import FedAvg, FedAvgM, FedProx, Median, StrategyError, TrimmedMean, make_strategy
from host.wire_numpy import TopKEncoder, decode_update, encode_update

KEY = b"k" * 32
SHAPES = {"head/kernel": (16, 5), "head/bias": (5,)}


def flower_aggregate(results):
    """Flower 1.42 ``flwr.server.strategy.aggregate.aggregate``, restated (installing flwr would pin
    cryptography<51, starlette and uvicorn versions this project does not use)."""
    num_examples_total = sum(n for (_, n) in results)
    weighted = [[layer * n for layer in weights] for weights, n in results]
    return [reduce(np.add, layer_updates) / num_examples_total for layer_updates in zip(*weighted)]


def _frames(n_clients, codec, seed=0):
    rng = np.random.default_rng(seed)
    topk = TopKEncoder(fraction=0.2)
    out = []
    for i in range(n_clients):
        deltas = {k: rng.standard_normal(s).astype(np.float32) * rng.uniform(0.01, 2) for k, s in SHAPES.items()}
        hdr = Header(f"d{i}", 1, 1, 1, int(rng.integers(1, 500)), flags=FLAG_DELTA)
        out.append(encode_update(hdr, list(deltas.items()), KEY, codec=codec, topk=topk))
    return out


@pytest.mark.parametrize("codec", [DENSE_F32, INT8, TOPK_INT8])
def test_fedavg_over_decoded_updates_equals_flower_formula(codec):
    params = {k: np.zeros(s, np.float32) for k, s in SHAPES.items()}
    s = FedAvg()
    acc = s.begin(params)
    decoded = []
    for f in _frames(23, codec):
        u = decode_update(f, KEY)
        acc.add({t.name: t.values for t in u.tensors}, u.header.num_examples)
        decoded.append(([u.tensor(k).values for k in SHAPES], u.header.num_examples))
    new = s.apply(params, acc)
    ref = flower_aggregate(decoded)
    for k, r in zip(SHAPES, ref):
        np.testing.assert_allclose(new[k], r, rtol=1e-5, atol=1e-6)
    assert acc.count == 23 and acc.examples == sum(n for _, n in decoded)


def test_running_sum_memory_does_not_grow_with_clients():
    params = {k: np.zeros(s, np.float32) for k, s in SHAPES.items()}
    acc = FedAvg().begin(params)
    frames = _frames(5, INT8)
    acc.add({t.name: t.values for t in decode_update(frames[0], KEY).tensors}, 3)
    before = {k: id(v) for k, v in acc.sums.items()}
    nbytes = sum(v.nbytes for v in acc.sums.values())
    for _ in range(200):
        for f in frames:
            acc.add({t.name: t.values for t in decode_update(f, KEY).tensors}, 3)
    assert {k: id(v) for k, v in acc.sums.items()} == before  # updated in place, nothing retained
    assert sum(v.nbytes for v in acc.sums.values()) == nbytes
    assert set(vars(acc)) == {"shapes", "sums", "weights", "count", "examples"}


def test_subset_updates_average_each_tensor_over_its_senders():
    params = {"a": np.zeros(3, np.float32), "b": np.ones(2, np.float32)}
    s = FedAvg()
    acc = s.begin(params)
    acc.add({"a": np.array([1, 2, 3], np.float32)}, 1)                               # bias-only style frame
    acc.add({"a": np.array([3, 2, 1], np.float32), "b": np.array([2, 2], np.float32)}, 3)
    new = s.apply(params, acc)
    np.testing.assert_allclose(new["a"], [(1 + 9) / 4, 2, (3 + 3) / 4])
    np.testing.assert_allclose(new["b"], [3, 3])  # only the second client sent b


def test_fedavgm_momentum_matches_hand_computation_and_survives_state_roundtrip():
    params = {"w": np.zeros(2, np.float32)}
    s = FedAvgM(momentum=0.5, server_lr=1.0)
    for d in ([1.0, 0.0], [0.0, 1.0]):
        acc = s.begin(params)
        acc.add({"w": np.array(d, np.float32)}, 1)
        params = s.apply(params, acc)
    np.testing.assert_allclose(params["w"], [1 + 0.5, 1])  # v1=(1,0); v2=(0.5,1); w=v1+v2
    s2 = FedAvgM(momentum=0.5)
    s2.load_state(s.state())
    np.testing.assert_allclose(s2.velocity["w"], [0.5, 1])


def test_fedadam_matches_hand_computation_and_survives_state_roundtrip():
    from host.fl.strategies import FedAdam

    params = {"w": np.zeros(2, np.float32)}
    s = FedAdam(eta=0.1, beta_1=0.5, beta_2=0.75, tau=0.01)
    m, v, w = np.zeros(2), np.zeros(2), np.zeros(2)
    for d in ([2.0, 0.0], [0.0, -1.0]):
        acc = s.begin(params)
        acc.add({"w": np.array(d, np.float32)}, 1)
        params = s.apply(params, acc)
        m = 0.5 * m + 0.5 * np.array(d)
        v = 0.75 * v + 0.25 * np.array(d) ** 2
        w = w + 0.1 * m / (np.sqrt(v) + 0.01)
    np.testing.assert_allclose(params["w"], w, rtol=1e-5)
    # a coordinate's step is about eta whatever the size of the clients' deltas (tau small beside them)
    for size in (1e-2, 1.0, 100.0):
        step = FedAdam(eta=0.1, beta_1=0.5, beta_2=0.75, tau=1e-6).step(
            {"w": np.zeros(1, np.float32)}, {"w": np.array([size], np.float32)})["w"][0]
        assert step == pytest.approx(0.1 * 0.5 / np.sqrt(0.25), rel=1e-3)
    s2 = FedAdam(eta=0.1, beta_1=0.5, beta_2=0.75, tau=0.01)
    s2.load_state(s.state())
    np.testing.assert_allclose(s2.m["w"], m, rtol=1e-6)
    np.testing.assert_allclose(s2.v["w"], v, rtol=1e-6)
    assert make_strategy("fedadam", eta=0.01).eta == 0.01
    for bad in ({"eta": 0}, {"beta_1": 1.0}, {"beta_2": -0.1}, {"tau": float("nan")}):
        with pytest.raises(StrategyError, match="FedAdam"):
            make_strategy("fedadam", **bad)


def test_fedprox_sends_mu_to_clients():
    assert FedProx(mu=0.1).client_config() == {"prox_mu": 0.1}
    with pytest.raises(StrategyError):
        FedProx(mu=-1)


def test_trimmed_mean_and_median_match_numpy_and_resist_an_outlier():
    rng = np.random.default_rng(1)
    rows = [rng.standard_normal(6).astype(np.float32) for _ in range(10)]
    rows[3] = np.full(6, 1e4, np.float32)  # a poisoned client
    params = {"w": np.zeros(6, np.float32)}
    for strat, ref in ((TrimmedMean(beta=0.1), lambda a: np.sort(a, 0)[1:9].mean(0)),
                       (Median(), lambda a: np.median(a, 0))):
        acc = strat.begin(params)
        for r in rows:
            acc.add({"w": r}, 5)
        out = strat.apply(params, acc)["w"]
        np.testing.assert_allclose(out, ref(np.stack(rows)), rtol=1e-6)
        assert np.all(np.abs(out) < 10)
    fa = FedAvg()
    acc = fa.begin(params)
    for r in rows:
        acc.add({"w": r}, 5)
    assert np.all(fa.apply(params, acc)["w"] > 100)  # the plain mean is dragged away


def test_bad_deltas_are_rejected_without_changing_the_sum():
    params = {k: np.zeros(s, np.float32) for k, s in SHAPES.items()}
    acc = FedAvg().begin(params)
    for bad in ({"other": np.zeros(3)}, {"head/bias": np.zeros(4)}, {"head/bias": np.full(5, np.nan)}, {}):
        with pytest.raises(StrategyError):
            acc.add(bad, 1)
    assert acc.count == 0 and all(not v.any() for v in acc.sums.values())
    with pytest.raises(StrategyError):
        make_strategy("fedsgd")
    with pytest.raises(StrategyError):
        make_strategy("fedavgm", momentum=1.5)
