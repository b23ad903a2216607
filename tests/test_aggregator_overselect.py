"""Adaptive over-selection: rounds learn from who arrived (late uploads included) how many to select,
so a fleet with many drop-outs reaches its quorum with fast devices instead of waiting for the deadline."""

from __future__ import annotations

import json
import math

import numpy as np

from edge.portable.wire import INT8, Header
from host.aggregator.app import build_app
from host.aggregator.config import AggregatorConfig
from host.aggregator.policy import plan_selection
from aggregator_helpers import FakeClock, signed_checkin
from host.aggregator.inprocess import InProcessTransport, make_state, small_params
from host.wire_numpy import encode_update

CFG = AggregatorConfig(clients_per_round=10, overselect=1.3, max_overselect=3.0)


def hist(rounds):
    """rounds: list of (selected, [latencies]) -> the history layout RoundManager keeps."""
    return {str(i): {"selected": n, "lat": {f"d{j}": x for j, x in enumerate(lat)}} for i, (n, lat) in enumerate(rounds)}


def test_without_evidence_the_configured_overselection_is_used():
    assert plan_selection(10, {}, CFG) == 13
    assert plan_selection(10, hist([(13, [5.0] * 13)]), CFG) == 13  # one round is too little evidence


def test_selection_grows_with_dropouts_and_is_capped():
    everyone_fast = hist([(13, [10.0] * 13)] * 3)
    assert plan_selection(10, everyone_fast, CFG) == 13
    # half the selected devices never upload: p = 0.5 -> 10 * 1.25 / 0.5 = 25
    half_drop = hist([(20, [10.0] * 10)] * 3)
    assert plan_selection(10, half_drop, CFG) == 25
    nobody = hist([(20, [10.0])] * 3)
    assert plan_selection(10, nobody, CFG) == 30  # max_overselect caps it


def test_estimate_does_not_run_away_when_more_are_selected():
    # the same latency distribution observed with 20 or with 30 selected gives the same p
    lat = list(np.random.default_rng(0).lognormal(np.log(10), 0.6, 14))
    a = plan_selection(10, hist([(20, lat)] * 4), CFG)
    b = plan_selection(10, hist([(30, lat + lat[:7])] * 4), CFG)
    assert abs(a - b) <= 3 and 13 <= a <= 30



def _frame(dev, key, task, seq):
    rng = np.random.default_rng(seq)
    tensors = [(k, (rng.standard_normal(v.shape) * 0.01).astype(np.float32)) for k, v in small_params().items()]
    return encode_update(Header(dev, task["round_id"], task["model_version"], seq, 5), tensors, key, codec=INT8)


def test_rounds_learn_from_dropouts_and_late_arrivals(tmp_path):
    clock = FakeClock()
    cfg = AggregatorConfig(clients_per_round=4, overselect=1.25, max_overselect=3.0, round_timeout=60,
                           min_updates=2, fairness_window=1, max_rounds_per_window=1 << 20)
    state, keys = make_state(tmp_path, cfg, n_devices=16)
    app = build_app(state, clock=clock, tick_interval=0)
    seq = {d: 0 for d in keys}

    def checkin(t, d):
        body, h = signed_checkin(d, keys[d])
        return json.loads(t.request("POST", "/v1/checkin", body, h)[1])

    def upload(t, d, task):
        seq[d] += 1
        return t.request("POST", "/v1/updates", _frame(d, keys[d], task, seq[d]), {"X-Edgelearn-Device": d})

    with InProcessTransport(app) as t:
        rm = app.state.aggregator.rounds
        selected_per_round = []
        for rnd in range(3):
            tasks = {}
            for d in keys:
                a = checkin(t, d)
                if a["action"] == "train":
                    tasks[d] = a["task"]
            selected_per_round.append(len(tasks))
            # half of the selected drop; of the rest, two arrive at 10 s and the others after the deadline
            order = sorted(tasks)
            arrive, late = order[:2], order[2:len(order) - len(order) // 2]
            clock.t += 10
            for d in arrive:
                assert upload(t, d, tasks[d])[0] == 200
            clock.t += 55
            rm.tick()  # deadline: closes with the floor of 2
            want = rm.selection_target()  # late uploads after this are kept in memory until the next close
            for d in late:
                s, raw = upload(t, d, tasks[d])
                assert s == 410 and json.loads(raw)["error"] == "StaleRound"
        assert selected_per_round[0] == math.ceil(4 * 1.25)
        assert selected_per_round[-1] > selected_per_round[0]
        # late uploads were counted as arrivals (with their latency), drop-outs were not
        h = rm.arrivals[str(1)]
        assert h["selected"] == selected_per_round[0] and len(h["lat"]) == 3  # 2 in time + 1 late of 5
        assert sorted(h["lat"].values())[-1] >= 65
    # the evidence survives a restart (stored with each round's close)
    app2 = build_app(state, clock=clock, tick_interval=0)
    with InProcessTransport(app2):
        assert app2.state.aggregator.rounds.selection_target() == want


def test_config_rejects_max_below_min_overselect():
    import pytest

    from edge.errors import EdgelearnError
    with pytest.raises(EdgelearnError, match="max_overselect"):
        AggregatorConfig(overselect=1.5, max_overselect=1.2)
