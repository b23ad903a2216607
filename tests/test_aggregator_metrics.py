"""GET /metrics speaks Prometheus text with the aggregator's real numbers, and a replayed or
back-dated signed check-in is refused without changing any state."""

from __future__ import annotations

import hashlib
import hmac
import json

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from edge.portable.wire import INT8, Header
from host.aggregator.app import build_app
from host.aggregator.config import AggregatorConfig
from aggregator_helpers import FakeClock, snapshot
from host.aggregator.inprocess import InProcessTransport, make_state, small_params
from host.wire_numpy import encode_update



@pytest.fixture
def agg(tmp_path):
    clock = FakeClock(5000.0)
    state, keys = make_state(tmp_path, AggregatorConfig(clients_per_round=2, overselect=1.0, max_overselect=1.0,
                                                        checkin_max_skew=300), n_devices=3)
    app = build_app(state, clock=clock, tick_interval=0)
    with InProcessTransport(app) as t:
        t.keys, t.clock, t.agg = keys, clock, app.state.aggregator
        yield t


def checkin(t, dev, when, **extra):
    body = json.dumps({"device_id": dev, "battery": 1.0, "charging": True, "time": when, **extra}).encode()
    hdrs = {"X-Edgelearn-Device": dev, "X-Edgelearn-Mac": hmac.new(t.keys[dev], body, hashlib.sha256).hexdigest()}
    return body, hdrs


def post(t, path, body, hdrs):
    s, raw = t.request("POST", path, body, hdrs)
    return s, json.loads(raw)


def scrape(t) -> dict:
    s, raw = t.request("GET", "/metrics")
    assert s == 200
    out = {}
    for fam in text_string_to_metric_families(raw.decode()):
        for smp in fam.samples:
            out[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    return out


def test_metrics_report_rounds_versions_and_refusals(agg):
    m0 = scrape(agg)
    v0 = m0[("edgelearn_model_version", ())]
    for i, d in enumerate(("dev0", "dev1")):
        s, ans = post(agg, "/v1/checkin", *checkin(agg, d, agg.clock.t + i))
        task = ans["task"]
        rng = np.random.default_rng(i)
        frame = encode_update(Header(d, task["round_id"], task["model_version"], 1, 4),
                              [(k, (rng.standard_normal(v.shape) * 0.01).astype(np.float32))
                               for k, v in small_params().items()], agg.keys[d], codec=INT8)
        assert post(agg, "/v1/updates", frame, {"X-Edgelearn-Device": d})[0] == 200
    s, bad = post(agg, "/v1/updates", b"garbage", {"X-Edgelearn-Device": "dev0"})
    assert s == 400, bad
    m = scrape(agg)
    assert m[("edgelearn_model_version", ())] == v0 + 1
    assert m[("edgelearn_rounds_total", (("status", "closed"),))] == 1
    assert m[("edgelearn_devices", ())] == 3
    assert m[("edgelearn_committed_updates_total", ())] == 2
    assert m[("edgelearn_refusals_total", (("error", "TruncatedFrame"), ("status", "400")))] == 1
    assert m[("edgelearn_upload_bytes_total", ())] > 0
    assert m[("edgelearn_open_round", (("field", "round_id"),))] == 2


def test_replayed_or_backdated_checkins_are_refused_without_state_change(agg):
    first = checkin(agg, "dev0", agg.clock.t)
    assert post(agg, "/v1/checkin", *first)[0] == 200
    before = snapshot(agg.agg.store)
    for body, hdrs, want in [(*first, (409, "ReplayError")),                                # the same bytes again
                             (*checkin(agg, "dev0", agg.clock.t - 1), (409, "ReplayError")),  # older
                             (*checkin(agg, "dev0", agg.clock.t + 301), (409, "StaleCheckin")),
                             (*checkin(agg, "dev0", "yesterday"), (400, "BadRequest"))]:
        s, ans = post(agg, "/v1/checkin", body, hdrs)
        assert (s, ans["error"]) == want, ans
        assert snapshot(agg.agg.store) == before
    assert post(agg, "/v1/checkin", *checkin(agg, "dev0", agg.clock.t + 0.5))[0] == 200
    # devices without a clock (MCUs) still check in; their replays are the gateway's to stop
    assert post(agg, "/v1/checkin", *checkin(agg, "dev2", None))[0] == 200
