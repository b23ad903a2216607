"""The aggregator over HTTP (in-process ASGI): rounds, over-selection, quorum, deadline, FedBuff,
publication; and every kind of bad input gets a precise 4xx and changes no state."""

from __future__ import annotations

import hashlib
import hmac
import json
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge.bundle import load_bundle
from edge.portable.chunks import split_chunks
from edge.portable.wire import DENSE_F32, INT8, Header
from host.aggregator.app import build_app
from host.aggregator.config import AggregatorConfig
from aggregator_helpers import FakeClock, signed_checkin, snapshot
from host.aggregator.inprocess import InProcessTransport, make_state, small_params
from host.wire_numpy import encode_update

HYP = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))



@pytest.fixture
def agg(tmp_path):
    clock = FakeClock()
    state, keys = make_state(tmp_path, AggregatorConfig(clients_per_round=3, overselect=1.3, round_timeout=60,
                                                        max_update_norm=50.0), n_devices=6)
    app = build_app(state, clock=clock, tick_interval=0)
    with InProcessTransport(app) as t:
        t.keys, t.clock, t.state = keys, clock, state
        t.agg = app.state.aggregator
        yield t


def checkin(t, dev, **state):
    body, hdrs = signed_checkin(dev, t.keys[dev], state)
    s, raw = t.request("POST", "/v1/checkin", body, hdrs)
    assert s == 200, raw
    return json.loads(raw)


def frame_for(t, dev, task, seq=1, scale=0.01, codec=INT8, n=10, tensors=None, key=None, device_id=None):
    p = small_params()
    rng = np.random.default_rng(seq + hash(dev) % 1000)
    tensors = tensors or [(k, (rng.standard_normal(v.shape) * scale).astype(np.float32)) for k, v in p.items()]
    hdr = Header(device_id or dev, task["round_id"], task["model_version"], seq, n)
    return encode_update(hdr, tensors, key or t.keys[dev], codec=codec)


def upload(t, dev, frame, claimed=None):
    s, raw = t.request("POST", "/v1/updates", frame, {"X-Edgelearn-Device": claimed or dev})
    return s, json.loads(raw)


def assert_rejected(t, status, error, fn):
    before = snapshot(t.agg.store)
    s, body = fn()
    assert (s, body.get("error")) == (status, error), body
    assert body["problem"] and snapshot(t.agg.store) == before


def test_round_overselects_closes_at_quorum_and_publishes_a_signed_bundle(agg):
    tasks = {d: checkin(agg, d) for d in ("dev0", "dev1", "dev2", "dev3", "dev4")}
    assert [a["action"] for a in tasks.values()] == ["train"] * 4 + ["wait"]  # ceil(3 * 1.3) = 4 selected
    assert "fully selected" in tasks["dev4"]["reason"] and tasks["dev4"]["retry_after"] > 0
    v0 = agg.agg.registry.current
    for d in ("dev0", "dev1", "dev2"):
        s, body = upload(agg, d, frame_for(agg, d, tasks[d]["task"]))
        assert s == 200 and body["status"] == "accepted"
    assert agg.agg.registry.current == v0 + 1  # the quorum closed the round without waiting for dev3
    # the straggler's update is for a closed round: 410 and nothing changes
    assert_rejected(agg, 410, "StaleRound", lambda: upload(agg, "dev3", frame_for(agg, "dev3", tasks["dev3"]["task"])))
    s, raw = agg.request("GET", f"/v1/bundles/{v0 + 1}.zip")
    assert s == 200
    z = agg.state / "dl.zip"
    z.write_bytes(raw)
    b = load_bundle(z, trusted_keys=agg.state / "keys")
    assert b.version == v0 + 1 and b.manifest["trainable"]["file"] == "head.npz"
    assert agg.request("GET", f"/v1/bundles/{v0 + 5}.zip")[0] == 404


def test_deadline_closes_with_the_floor_or_fails_the_round(agg):
    tasks = {d: checkin(agg, d)["task"] for d in ("dev0", "dev1", "dev2")}
    assert upload(agg, "dev0", frame_for(agg, "dev0", tasks["dev0"]))[0] == 200
    agg.clock.t += 61
    agg.agg.rounds.tick()
    rows = agg.agg.store.all("SELECT status FROM rounds ORDER BY round_id")
    assert rows == [("failed",), ("open",)]  # 1 update < floor of 2
    tasks = {d: checkin(agg, d)["task"] for d in ("dev0", "dev1", "dev2")}
    for d in ("dev0", "dev1"):
        assert upload(agg, d, frame_for(agg, d, tasks[d], seq=2))[0] == 200
    agg.clock.t += 61
    agg.agg.rounds.tick()
    assert agg.agg.store.all("SELECT status FROM rounds ORDER BY round_id")[1] == ("closed",)


def test_eligibility_and_fairness_defer_devices(agg):
    a = checkin(agg, "dev0", battery=0.2, charging=False)
    assert a["action"] == "wait" and "battery" in a["reason"]
    a = checkin(agg, "dev0", network="cellular")
    assert a["action"] == "wait" and "metered" in a["reason"]
    a = checkin(agg, "dev0", temperature=70)
    assert a["action"] == "wait" and "temperature" in a["reason"]
    agg.agg.cfg.max_rounds_per_window = 1
    t = checkin(agg, "dev0")["task"]
    assert checkin(agg, "dev0")["task"] == t  # repeated check-in: the same task
    for d in ("dev1", "dev2"):
        upload(agg, d, frame_for(agg, d, checkin(agg, d)["task"]))
    upload(agg, "dev0", frame_for(agg, "dev0", t))  # closes the round
    a = checkin(agg, "dev0")
    assert a["action"] == "wait" and "fairness" in a["reason"]


def test_replays_duplicates_and_claims_of_another_id(agg):
    t = checkin(agg, "dev0")["task"]
    checkin(agg, "dev1")
    f = frame_for(agg, "dev0", t, seq=5)
    assert upload(agg, "dev0", f)[0] == 200
    before = snapshot(agg.agg.store)
    s, body = upload(agg, "dev0", f)  # an identical resend is idempotent
    assert (s, body["status"]) == (200, "duplicate") and snapshot(agg.agg.store) == before
    assert_rejected(agg, 409, "ReplayError", lambda: upload(agg, "dev0", frame_for(agg, "dev0", t, seq=5, scale=0.02)))
    assert_rejected(agg, 409, "AlreadyContributed", lambda: upload(agg, "dev0", frame_for(agg, "dev0", t, seq=6)))
    t1 = checkin(agg, "dev1")["task"]
    # dev0 claims to be dev1: it can sign only with its own key
    assert_rejected(agg, 401, "AuthError",
                    lambda: upload(agg, "dev1", frame_for(agg, "dev1", t1, key=agg.keys["dev0"])))
    # dev0's header, dev1's frame
    assert_rejected(agg, 403, "DeviceMismatch", lambda: upload(agg, "dev1", frame_for(agg, "dev1", t1), claimed="dev0"))
    assert_rejected(agg, 401, "UnknownDevice", lambda: upload(agg, "ghost", frame_for(agg, "ghost", t1, key=b"x" * 32)))
    assert_rejected(agg, 401, "Unauthenticated",
                    lambda: (lambda r: (r[0], json.loads(r[1])))(agg.request("POST", "/v1/updates", f, {})))


def test_stale_unselected_and_bad_content(agg):
    t = checkin(agg, "dev0")["task"]
    assert_rejected(agg, 409, "StaleModel",
                    lambda: upload(agg, "dev0", frame_for(agg, "dev0", {**t, "model_version": t["model_version"] - 1})))
    assert_rejected(agg, 410, "StaleRound", lambda: upload(agg, "dev0", frame_for(agg, "dev0", {**t, "round_id": 9})))
    assert_rejected(agg, 403, "NotSelected", lambda: upload(agg, "dev5", frame_for(agg, "dev5", t)))
    assert_rejected(agg, 422, "UpdateNormTooLarge", lambda: upload(agg, "dev0", frame_for(agg, "dev0", t, scale=100)))
    assert_rejected(agg, 422, "BadUpdate", lambda: upload(agg, "dev0", frame_for(
        agg, "dev0", t, tensors=[("classifier.other", np.zeros(3, np.float32))])))
    assert_rejected(agg, 422, "BadUpdate", lambda: upload(agg, "dev0", frame_for(
        agg, "dev0", t, tensors=[("classifier.b", np.zeros(36, np.float32))])))
    assert_rejected(agg, 422, "BadExampleCount", lambda: upload(agg, "dev0", frame_for(agg, "dev0", t, n=0)))
    # a NaN smuggled into a dense payload under a valid tag is a malformed frame
    f = bytearray(frame_for(agg, "dev0", t, codec=DENSE_F32, tensors=[("classifier.b", np.zeros(37, np.float32))]))
    struct.pack_into("<f", f, len(f) - 32 - 4, float("nan"))
    f[-32:] = hmac.new(agg.keys["dev0"], bytes(f[:-32]), hashlib.sha256).digest()
    assert_rejected(agg, 400, "MalformedFrame", lambda: upload(agg, "dev0", bytes(f)))
    # oversized: refused from Content-Length, before reading
    big = b"\0" * (agg.agg.cfg.max_frame_len + 1)
    assert_rejected(agg, 413, "OversizedFrame", lambda: upload(agg, "dev0", big))
    assert upload(agg, "dev0", frame_for(agg, "dev0", t))[0] == 200  # and the device can still contribute


@HYP
@given(data=st.data())
def test_any_corruption_of_a_valid_frame_is_a_4xx_with_no_state_change(agg, data):
    t = checkin(agg, "dev0")["task"]
    f = bytearray(frame_for(agg, "dev0", t, seq=data.draw(st.integers(1, 1000))))
    kind = data.draw(st.sampled_from(["flip", "truncate", "extend", "random"]))
    if kind == "flip":
        i = data.draw(st.integers(0, len(f) - 1))
        f[i] ^= data.draw(st.integers(1, 255))
    elif kind == "truncate":
        f = f[:data.draw(st.integers(0, len(f) - 1))]
    elif kind == "extend":
        f += data.draw(st.binary(min_size=1, max_size=64))
    else:
        f = bytearray(data.draw(st.binary(max_size=400)))
    before = snapshot(agg.agg.store)
    s, body = upload(agg, "dev0", bytes(f))
    assert 400 <= s < 500 and body["error"] and body["problem"], body
    assert snapshot(agg.agg.store) == before


@HYP
@given(body=st.binary(max_size=600), mac=st.sampled_from(["good", "bad", "none"]))
def test_checkin_bad_bodies_and_macs(agg, body, mac):
    key = agg.keys["dev1"]
    hdrs = {"X-Edgelearn-Device": "dev1"}
    if mac == "good":
        hdrs["X-Edgelearn-Mac"] = hmac.new(key, body, hashlib.sha256).hexdigest()
    elif mac == "bad":
        hdrs["X-Edgelearn-Mac"] = "00" * 32
    before = snapshot(agg.agg.store)
    s, raw = agg.request("POST", "/v1/checkin", body, hdrs)
    if mac != "good":
        assert s == 401 and snapshot(agg.agg.store) == before
    else:
        try:
            ok = isinstance(json.loads(body), dict)
        except ValueError:
            ok = False
        if not ok:
            assert (s, json.loads(raw)["error"]) == (400, "BadRequest") and snapshot(agg.agg.store) == before


def test_checkin_claiming_another_device(agg):
    body, hdrs = signed_checkin("dev1", agg.keys["dev1"], {"device_id": "dev2"})
    assert_rejected(agg, 403, "DeviceMismatch", lambda: (lambda r: (r[0], json.loads(r[1])))(
        agg.request("POST", "/v1/checkin", body, hdrs)))


def test_chunks_resume_are_idempotent_and_a_round_closed_mid_upload_is_410(agg):
    tasks = {d: checkin(agg, d)["task"] for d in ("dev0", "dev1", "dev2", "dev3")}
    f = frame_for(agg, "dev0", tasks["dev0"], codec=DENSE_F32)
    chunks = split_chunks(f, 1000)
    hd = {"X-Edgelearn-Device": "dev0"}
    s, raw = agg.request("POST", "/v1/chunks", chunks[1], hd)
    assert s == 202 and 0 in json.loads(raw)["missing"]
    assert agg.request("POST", "/v1/chunks", chunks[1], hd)[0] == 202      # resend: ignored
    bad = bytearray(chunks[1])
    bad[30] ^= 1
    assert agg.request("POST", "/v1/chunks", bytes(bad), hd)[0] == 400      # CRC
    for c in chunks[2:]:
        agg.request("POST", "/v1/chunks", c, hd)
    s, raw = agg.request("POST", "/v1/chunks", chunks[0], hd)
    assert s == 200 and json.loads(raw)["status"] == "accepted"
    # dev3 starts a chunked upload; the round reaches its quorum before dev3 finishes
    f3 = frame_for(agg, "dev3", tasks["dev3"], codec=DENSE_F32)
    c3 = split_chunks(f3, 1000)
    for c in c3[:-1]:
        agg.request("POST", "/v1/chunks", c, {"X-Edgelearn-Device": "dev3"})
    for d in ("dev1", "dev2"):
        assert upload(agg, d, frame_for(agg, d, tasks[d]))[0] == 200
    s, raw = agg.request("POST", "/v1/chunks", c3[-1], {"X-Edgelearn-Device": "dev3"})
    assert (s, json.loads(raw)["error"]) == (410, "StaleRound")
    assert agg.agg.store.one("SELECT COUNT(*) FROM updates WHERE device_id='dev3'")[0] == 0


def test_fedbuff_weights_by_staleness_and_rejects_too_stale(tmp_path):
    state, keys = make_state(tmp_path, AggregatorConfig(mode="async", buffer_size=2, max_staleness=1), n_devices=4)
    app = build_app(state, tick_interval=0)
    with InProcessTransport(app) as t:
        t.keys, t.agg = keys, app.state.aggregator
        old = {d: checkin(t, d)["task"] for d in ("dev0", "dev1", "dev2", "dev3")}
        v0 = t.agg.registry.current
        for d in ("dev0", "dev1"):
            assert upload(t, d, frame_for(t, d, old[d]))[0] == 200
        assert t.agg.registry.current == v0 + 1
        p1 = t.agg.registry.params()
        # dev2 trained from v0 (staleness 1): accepted with weight n / sqrt(2)
        f2 = frame_for(t, "dev2", old["dev2"], n=10)
        assert upload(t, "dev2", f2)[0] == 200
        assert t.agg.rounds.acc.weights["classifier.b"] == pytest.approx(10 / np.sqrt(2))
        f3 = frame_for(t, "dev3", old["dev3"], n=10)
        assert upload(t, "dev3", f3)[0] == 200
        assert t.agg.registry.current == v0 + 2
        from host.wire_numpy import decode_update
        d2, d3 = (decode_update(f, keys[d]) for f, d in ((f2, "dev2"), (f3, "dev3")))
        want = p1["classifier.b"] + (d2.tensor("classifier.b").values + d3.tensor("classifier.b").values) / 2
        np.testing.assert_allclose(t.agg.registry.params()["classifier.b"], want, rtol=1e-5, atol=1e-7)
        # now v0 is two versions behind: too stale
        t4 = checkin(t, "dev0")["task"]
        assert_rejected(t, 409, "StaleModel", lambda: upload(t, "dev0", frame_for(t, "dev0", {**t4, "model_version": v0}, seq=9)))


def test_a_regressing_aggregate_is_rejected_and_the_version_stays(tmp_path):
    rng = np.random.default_rng(0)
    p = small_params()
    X = rng.standard_normal((200, 64)).astype(np.float32)
    y = np.argmax(X @ p["classifier.w"] + p["classifier.b"], axis=1)  # the current head is perfect here
    state, keys = make_state(tmp_path, AggregatorConfig(clients_per_round=1), n_devices=1, params=p, heldout=(X, y))
    app = build_app(state, tick_interval=0)
    with InProcessTransport(app) as t:
        t.keys, t.agg = keys, app.state.aggregator
        v = t.agg.registry.current
        task = checkin(t, "dev0")["task"]
        bad = [("classifier.w", (-2 * p["classifier.w"]).astype(np.float32))]  # flips every decision
        assert upload(t, "dev0", frame_for(t, "dev0", task, tensors=bad))[0] == 200
        assert t.agg.registry.current == v
        st_ = t.agg.store.one("SELECT status, note FROM rounds WHERE round_id=?", (task["round_id"],))
        assert st_[0] == "rejected" and "rolled back" in st_[1]
        np.testing.assert_array_equal(t.agg.registry.params()["classifier.w"], p["classifier.w"])


def _one_bias_step(tmp_path, shrink, fractions=(0.5, 0.25)):
    """One round whose only update raises one class's bias, on a held-out set the current head names
    perfectly: the more of the step is taken, the more rows that class takes over. The tolerance sits
    between what the two ``fractions`` of the step lose, so the first fails the gate and the second
    passes. Returns (the start params, the delta, lost(fraction), the round's row, versions before and
    after, the params after)."""
    from edge.fl.model import head_logits

    rng = np.random.default_rng(0)
    p = small_params()
    X = rng.standard_normal((400, 64)).astype(np.float32)
    y = np.argmax(head_logits(p, X), axis=1)
    delta = np.zeros_like(p["classifier.b"])
    delta[int(np.bincount(y, minlength=len(delta)).argmin())] = 2.0  # a rare class, pushed up everywhere

    def lost(a):
        return 1.0 - float(np.mean(np.argmax(head_logits({**p, "classifier.b": p["classifier.b"] + a * delta}, X), 1) == y))

    assert lost(1.0) > lost(fractions[0]) > lost(fractions[1])
    tol = (lost(fractions[0]) + lost(fractions[1])) / 2
    state, keys = make_state(tmp_path, AggregatorConfig(clients_per_round=1, eval_tolerance=tol, eval_shrink=shrink),
                             n_devices=1, params=p, heldout=(X, y))
    app = build_app(state, tick_interval=0)
    with InProcessTransport(app) as t:
        t.keys, t.agg = keys, app.state.aggregator
        v = t.agg.registry.current
        task = checkin(t, "dev0")["task"]
        frame = frame_for(t, "dev0", task, codec=DENSE_F32, tensors=[("classifier.b", delta)])
        assert upload(t, "dev0", frame)[0] == 200
        row = t.agg.store.one("SELECT status, note, accuracy FROM rounds WHERE round_id=?", (task["round_id"],))
        return p, delta, lost, row, (v, t.agg.registry.current), t.agg.registry.params()


def test_a_gated_aggregate_is_published_in_part_when_a_smaller_step_passes(tmp_path):
    p, delta, lost, (status, note, acc), (v, now), new = _one_bias_step(tmp_path, [0.5, 0.25, 0.1])
    assert now == v + 1  # published: a quarter of the step (a half fails the gate)
    assert status == "closed" and "published 0.25 of the aggregate" in note
    assert acc == pytest.approx(1.0 - lost(0.25))
    np.testing.assert_allclose(new["classifier.b"], p["classifier.b"] + 0.25 * delta, atol=1e-6)
    np.testing.assert_array_equal(new["classifier.w"], p["classifier.w"])


def test_a_gated_aggregate_no_fraction_saves_is_rejected_whole(tmp_path):
    p, _, _, (status, note, _), (v, now), new = _one_bias_step(tmp_path, [0.5])
    assert now == v and status == "rejected" and "rolled back" in note
    np.testing.assert_array_equal(new["classifier.b"], p["classifier.b"])


@pytest.mark.parametrize("bad", [[1.0], [0.5, 0], ["half"], [True], 0.5])
def test_bad_shrink_settings_are_one_sentence(bad):
    from edge.errors import EdgelearnError

    with pytest.raises(EdgelearnError, match="eval_shrink=.*fractions between 0 and 1"):
        AggregatorConfig(eval_shrink=bad)
