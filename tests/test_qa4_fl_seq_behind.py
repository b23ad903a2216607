"""QA4: a device whose federated state went back (a restored backup of its state directory, a re-imaged
card with the same id and key) is refused with 409 ReplayError naming the aggregator's last accepted
seq. The client continues above that seq and re-sends the same round's update once, so no round is
lost and the update counts once. Against the real aggregator app: in-process and on loopback."""

from __future__ import annotations

import json
import shutil
import socket

import pytest

from aggregator_helpers import start
from edge.fl import FLClient, FLError
from edge.fl.transport import HttpTransport
from host.aggregator.app import build_app
from host.aggregator.config import AggregatorConfig
from host.aggregator.inprocess import InProcessTransport
from test_fl_client import OK, fleet, synthetic


class Recorder:
    """Passes requests through and keeps (path, status) of every upload, to see the refusals."""

    def __init__(self, t):
        self.t, self.seen = t, []

    def request(self, m, p, body=b"", headers=None):
        s, raw = self.t.request(m, p, body, headers)
        if p in ("/v1/updates", "/v1/chunks"):
            self.seen.append((p, s))
        return s, raw


def _db(app, sql, args=()):
    return app.state.aggregator.store.all(sql, args)


def _state_seq(d):
    return json.loads((d / "fl_state.json").read_text())["seq"]


@pytest.mark.parametrize("codec", ["int8", "topk_int8"])
def test_a_restored_older_state_gets_its_next_update_accepted_in_the_same_round(tmp_path, codec):
    devs, _ = synthetic(1)
    cfg = AggregatorConfig(clients_per_round=1, overselect=1.0, codec=codec, chunk_size=2000,
                           topk_fraction=0.1)  # chunked: the re-send is a new frame with its own frame id
    state, keys = fleet(tmp_path, cfg, n=1)
    app = build_app(state, tick_interval=0)
    d, backup = tmp_path / "c0", tmp_path / "backup"
    with InProcessTransport(app) as t:
        c = FLClient(t, "dev0", keys["dev0"], d, trusted_keys=state / "keys", data=devs[0], seed=0)
        assert c.run_once(OK)["status"] == "accepted"
        shutil.copytree(d, backup)  # the backup: seq 1
        for _ in range(2):  # (the fairness budget lets one device join 5 rounds of 10)
            assert c.run_once(OK)["status"] == "accepted"
        last = c.seq  # 3, the aggregator's last accepted seq
        assert _db(app, "SELECT last_seq FROM devices WHERE device_id='dev0'") == [(last,)]

        shutil.rmtree(d)
        shutil.copytree(backup, d)  # the restore
        rec = Recorder(t)
        c2 = FLClient(rec, "dev0", keys["dev0"], d, trusted_keys=state / "keys", data=devs[0], seed=0)
        assert c2.seq == 1
        joined = _db(app, "SELECT COUNT(*) FROM contributions WHERE device_id='dev0'")[0][0]
        out = c2.run_once(OK)
        assert out["status"] == "accepted", out  # old code: FLError 409 "not newer than ... seq 3"
        assert c2.seq == last + 1 == _state_seq(d)  # above the named seq, on disk; nothing reused
        assert rec.seen[-1][1] == 200 and sum(s == 409 for _, s in rec.seen) == 1, rec.seen
        # counted once: one more contribution (the round's closed, its frames pruned), under the new seq
        assert _db(app, "SELECT COUNT(*) FROM contributions WHERE device_id='dev0'")[0][0] == joined + 1
        assert _db(app, "SELECT COUNT(*) FROM contributions WHERE round_id=?", (out["round_id"],)) == [(1,)]
        assert _db(app, "SELECT last_seq, rounds_joined FROM devices WHERE device_id='dev0'") == [(last + 1, joined + 1)]
        # and the next round goes as usual, no refusal
        n409 = sum(s == 409 for _, s in rec.seen)
        nxt = c2.run_once(OK)
        assert nxt.get("status") == "accepted", nxt
        assert sum(s == 409 for _, s in rec.seen) == n409 and c2.seq == last + 2


def test_a_reimaged_device_with_no_state_is_not_behind_its_id_history(tmp_path):
    devs, _ = synthetic(1)
    state, keys = fleet(tmp_path, AggregatorConfig(clients_per_round=1, overselect=1.0), n=1)
    app = build_app(state, tick_interval=0)
    with InProcessTransport(app) as t:
        c = FLClient(t, "dev0", keys["dev0"], tmp_path / "old-card", trusted_keys=state / "keys", data=devs[0])
        for _ in range(3):
            assert c.run_once(OK)["status"] == "accepted"
        fresh = FLClient(t, "dev0", keys["dev0"], tmp_path / "new-card", trusted_keys=state / "keys",
                         data=devs[0])
        out = fresh.run_once(OK)
        assert out["status"] == "accepted", out  # old code: refused for 3 rounds (seq 1, 2, 3)
        assert fresh.seq > c.seq and _state_seq(tmp_path / "new-card") == fresh.seq


def test_a_checkin_replay_and_other_409s_are_not_taken_for_a_seq_that_went_back(tmp_path):
    """Only a frame's "not newer than the last accepted seq N" moves the seq: nothing else is re-sent."""
    devs, _ = synthetic(1)
    state, keys = fleet(tmp_path, AggregatorConfig(clients_per_round=1, overselect=1.0), n=1)
    app = build_app(state, tick_interval=0)
    with InProcessTransport(app) as t:
        c = FLClient(t, "dev0", keys["dev0"], tmp_path / "c0", trusted_keys=state / "keys", data=devs[0])
        for problem, reason in [("check-in from 'dev0' is dated 5, not after its last one (9)", "ReplayError"),
                                ("frame seq 6 from 'dev0' is not newer than the last accepted seq 23", "StaleModel"),
                                ("device 'dev0' already contributed to round 4", "AlreadyContributed")]:
            assert c._seq_behind(FLError(f"POST /v1/updates -> 409: {problem}", status=409, reason=reason)) is None
        e = FLError("POST /v1/updates -> 409: frame seq 6 from 'pi-b' is not newer than the last accepted seq 23",
                    status=409, reason="ReplayError")
        assert c._seq_behind(e) == 23
        c._jump_seq(23)
        assert c.seq == 23 == _state_seq(tmp_path / "c0")
        c._jump_seq(5)  # never back
        assert c.seq == 23


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_restored_state_catches_up_against_an_aggregator_on_loopback(tmp_path):
    devs, _ = synthetic(1)
    cfg = AggregatorConfig(clients_per_round=1, overselect=1.0, eval_tolerance=1.0, round_timeout=60)
    state, keys = fleet(tmp_path, cfg, n=1)
    port = _free_port()
    proc = start(state, port)
    try:
        http = HttpTransport(f"http://127.0.0.1:{port}")
        d = tmp_path / "c0"
        c = FLClient(http, "dev0", keys["dev0"], d, trusted_keys=state / "keys", data=devs[0])
        assert c.run_once(OK)["status"] == "accepted"
        shutil.copytree(d, tmp_path / "backup")
        assert c.run_once(OK)["status"] == "accepted"
        assert c.run_once(OK)["status"] == "accepted"
        shutil.rmtree(d)
        shutil.copytree(tmp_path / "backup", d)
        c2 = FLClient(http, "dev0", keys["dev0"], d, trusted_keys=state / "keys", data=devs[0])
        assert c2.run_once(OK)["status"] == "accepted"  # old code: 409 ReplayError
        assert c2.seq == c.seq + 1 == _state_seq(d)
        http.close()
    finally:
        proc.kill()
        proc.wait()
