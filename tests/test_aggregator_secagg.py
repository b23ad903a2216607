"""Secure aggregation through the aggregator's HTTP interface with the real device client: a round
with a drop-out after key sharing publishes exactly FedAvg of the survivors (fixed-point precision),
no individual update is ever stored, and too few survivors fail the round without a new version."""

from __future__ import annotations

import hashlib
import hmac
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge.errors import EdgelearnError
from edge.fl import FLClient
from edge.portable.wire import INT8, Header
from host.aggregator.app import build_app
from host.aggregator.config import AggregatorConfig
from host.aggregator.models import load_params
from aggregator_helpers import FakeClock, snapshot
from host.aggregator.inprocess import InProcessTransport, make_state, small_params
from host.wire_numpy import encode_update

AWAKE = {"battery": 1.0, "charging": True, "network": "wifi"}



def _fleet(tmp_path, **cfg):
    clock = FakeClock()
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


def _selected(t, tmp_path, state, keys):
    """Real device clients over the in-process transport, each checked in and holding its task."""
    clients = {d: FLClient(t, d, k, tmp_path / "dev" / d, trusted_keys=state / "keys") for d, k in keys.items()}
    return clients, {d: c.checkin(AWAKE)["task"] for d, c in clients.items()}


def test_secure_round_publishes_fedavg_of_the_survivors(tmp_path):
    clock, state, keys, app = _fleet(tmp_path)
    deltas = _deltas(keys)
    with InProcessTransport(app) as t:
        clients, tasks = _selected(t, tmp_path, state, keys)
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
    with InProcessTransport(app) as t:
        clients, tasks = _selected(t, tmp_path, state, keys)
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


@given(msg=st.dictionaries(st.sampled_from(["round_id", "step", "keys", "shares", "y"]),
                           st.one_of(st.integers(-3, 3), st.text(max_size=8), st.sampled_from(
                               ["advertise", "share", "masked", "unmask", "state", "AAAA", "00" * 32]),
                               st.dictionaries(st.text(max_size=6), st.text(max_size=70), max_size=3)),
                           max_size=5))
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_malformed_secagg_messages_get_a_4xx_and_change_nothing(tmp_path_factory, msg):
    tmp = tmp_path_factory.mktemp("h")
    clock, state, keys, app = _fleet(tmp)
    with InProcessTransport(app) as t:
        rm = app.state.aggregator.rounds
        rm.checkin("dev0", AWAKE)
        before = snapshot(rm.store)
        body = json.dumps(msg).encode()
        s, raw = t.request("POST", "/v1/secagg", body, {
            "X-Edgelearn-Device": "dev0", "X-Edgelearn-Mac": hmac.new(keys["dev0"], body, hashlib.sha256).hexdigest()})
        ans = json.loads(raw)
        if s == 200:  # only a well-formed advertise or a poll of the open round may pass
            assert msg.get("step") in ("advertise", "state") and msg.get("round_id") == 1
        else:
            assert 400 <= s < 500 and ans["problem"], ans
        assert snapshot(rm.store) == before  # the session is in memory; the database never changes


def test_secure_aggregation_with_user_level_dp_publishes_with_epsilon(tmp_path):
    clock, state, keys, app = _fleet(tmp_path, dp_clip=0.5, dp_noise=0.8)
    deltas = _deltas(keys)
    with InProcessTransport(app) as t:
        clients, tasks = _selected(t, tmp_path, state, keys)
        assert all(tk["clip_norm"] == 0.5 for tk in tasks.values())
        # the device clips (user level) before masking: the server never sees a delta to clip
        clipped = {}
        for d, (delta, n) in deltas.items():
            norm = float(np.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in delta.values())))
            clipped[d] = ({k: v * np.float32(min(1.0, 0.5 / norm)) for k, v in delta.items()}, n)
        views = _drive(clients, tasks, clipped, sorted(keys), steps=5)
        assert {v["phase"] for v in views.values()} == {"done"}
        rm = app.state.aggregator.rounds
        eps = rm.store.one("SELECT epsilon FROM models WHERE round_id=1")[0]
    assert eps is not None and eps > 0
