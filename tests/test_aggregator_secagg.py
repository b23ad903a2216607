"""Secure aggregation through the aggregator's HTTP interface with the real device client: a round
with a drop-out after key sharing publishes exactly FedAvg of the survivors (fixed-point precision),
no individual update is ever stored, and too few survivors fail the round without a new version."""

from __future__ import annotations

import numpy as np
import pytest

from edge.errors import EdgelearnError
from edge.fl_client import FLClient
from edge.portable.wire import INT8, Header
from host.aggregator.app import build_app
from host.aggregator.config import AggregatorConfig
from host.aggregator.models import load_params
from host.aggregator.testing import TestTransport, make_state, small_params
from host.wire_numpy import encode_update

AWAKE = {"battery": 1.0, "charging": True, "network": "wifi"}


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def _fleet(tmp_path, **cfg):
    clock = Clock()
    state, keys = make_state(tmp_path, AggregatorConfig(clients_per_round=5, overselect=1.2, max_overselect=1.2,
                                                        round_timeout=600, secure_aggregation=True,
                                                        secagg_phase_timeout=20, **cfg), n_devices=6)
    app = build_app(state, clock=clock, tick_interval=0)
    return clock, state, keys, app


def _deltas(keys):
    rng = np.random.default_rng(1)
    return {d: ({k: (rng.standard_normal(v.shape) * 0.05).astype(np.float32) for k, v in small_params().items()},
                int(rng.integers(1, 40))) for d in keys}


def _drive(clients, tasks, deltas, active, steps=12):
    views = {}
    for _ in range(steps):
        for d in active:
            views[d] = clients[d].secure_step(tasks[d], *deltas[d])
    return views


def test_secure_round_publishes_fedavg_of_the_survivors(tmp_path):
    clock, state, keys, app = _fleet(tmp_path)
    deltas = _deltas(keys)
    with TestTransport(app) as t:
        clients = {d: FLClient(t, d, k, tmp_path / "dev" / d, trusted_keys=state / "keys") for d, k in keys.items()}
        tasks = {d: c.checkin(AWAKE)["task"] for d, c in clients.items()}
        assert all(tk["codec"] == "secagg" and tk["secagg"]["dim"] == 64 * 64 + 64 + 64 * 37 + 37 + 1
                   for tk in tasks.values())
        # a plain frame is refused: this aggregator only takes masked inputs
        d0 = "dev0"
        frame = encode_update(Header(d0, tasks[d0]["round_id"], tasks[d0]["model_version"], 1, 3),
                              list(deltas[d0][0].items()), keys[d0], codec=INT8)
        s, raw = t.request("POST", "/v1/updates", frame, {"X-Edgelearn-Device": d0})
        assert s == 409 and b"SecureAggregationRequired" in raw
        devs = sorted(keys)
        for d in devs:  # everyone advertises and shares keys
            clients[d].secure_step(tasks[d], *deltas[d])
        _drive(clients, tasks, deltas, devs, steps=1)
        rm = app.state.aggregator.rounds
        assert rm.secure.session.phase == "masked"
        gone = "dev3"  # drops after sharing its keys, before masking
        survivors = [d for d in devs if d != gone]
        views = _drive(clients, tasks, deltas, survivors, steps=2)
        assert {v["phase"] for v in views.values()} == {"masked"}  # nobody can tell slow from gone yet
        clock.t += 21
        rm.tick()                                                  # the phase deadline: go on without dev3
        views = _drive(clients, tasks, deltas, survivors, steps=2)
        assert {v["phase"] for v in views.values()} == {"done"}
        assert rm.store.one("SELECT COUNT(*) FROM updates")[0] == 0   # nothing individual was ever stored
        r = rm.store.one("SELECT status, accepted, result_version FROM rounds WHERE round_id=1")
    assert r[:2] == ("closed", 5)
    base, new = small_params(), load_params(state / "models" / f"v{r[2]}.npz")
    total = sum(deltas[d][1] for d in survivors)
    for k in base:
        want = base[k] + sum(deltas[d][0][k].astype(np.float64) * deltas[d][1] for d in survivors) / total
        np.testing.assert_allclose(new[k], want, atol=len(survivors) * 2 ** -16 / total + 1e-6)


def test_too_few_survivors_fail_the_round_and_publish_nothing(tmp_path):
    clock, state, keys, app = _fleet(tmp_path)
    deltas = _deltas(keys)
    with TestTransport(app) as t:
        clients = {d: FLClient(t, d, k, tmp_path / "dev" / d, trusted_keys=state / "keys") for d, k in keys.items()}
        tasks = {d: c.checkin(AWAKE)["task"] for d, c in clients.items()}
        devs = sorted(keys)
        _drive(clients, tasks, deltas, devs, steps=2)
        rm = app.state.aggregator.rounds
        assert rm.secure.session.phase == "masked" and rm.secure.session.t == 4
        v0 = rm.reg.current
        _drive(clients, tasks, deltas, devs[:3], steps=2)  # 3 of 6 mask, the threshold is 4
        clock.t += 21
        rm.tick()                                          # the masking phase times out
        views = _drive(clients, tasks, deltas, devs[:3], steps=1)
        assert {v["phase"] for v in views.values()} == {"failed"}
        row = rm.store.one("SELECT status, note FROM rounds WHERE round_id=1")
        assert row[0] == "failed" and "below the threshold 4" in row[1]
        assert rm.reg.current == v0 and rm.round["round_id"] == 2 and rm.secure.failures == 1


def test_secure_aggregation_refuses_robust_strategies():
    with pytest.raises(EdgelearnError, match="trimmed mean and median need individual updates"):
        AggregatorConfig(secure_aggregation=True, strategy="median")
