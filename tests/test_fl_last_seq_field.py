"""A frame refused as not newer (409 ``ReplayError``) carries the aggregator's last accepted seq as the
error body's ``last_seq`` field, and the Linux client continues above it from the field: it no longer
depends on the wording of the problem text, which it still reads from an aggregator without the
field. Against ``aggregator serve`` on loopback; tests/test_qa4_fl_seq_behind.py covers the catch-up
itself."""

from __future__ import annotations

import json

from aggregator_helpers import post, signed_checkin, start
from edge.fl import FLClient, FLError
from edge.fl.transport import HttpTransport
from host.aggregator.config import AggregatorConfig
from host.netutil import free_port
from test_fl_client import OK, fleet, synthetic


class Reworded:
    """Passes requests through; a 409's problem text is reworded (no seq in it), as another
    aggregator version might word it. Keeps every 409 body as the aggregator sent it."""

    def __init__(self, t):
        self.t, self.bodies = t, []

    def request(self, m, p, body=b"", headers=None):
        s, raw = self.t.request(m, p, body, headers)
        if s == 409:
            err = json.loads(raw)
            self.bodies.append(dict(err))
            err["problem"] = "frame refused: its sequence number is behind"
            raw = json.dumps(err).encode()
        return s, raw


def test_the_409_carries_last_seq_and_the_client_catches_up_from_it(tmp_path):
    devs, _ = synthetic(1)
    cfg = AggregatorConfig(clients_per_round=1, overselect=1.0, eval_tolerance=1.0, round_timeout=60)
    state, keys = fleet(tmp_path, cfg, n=1)
    port = free_port()
    proc = start(state, port)
    try:
        http = HttpTransport(f"http://127.0.0.1:{port}")
        old = FLClient(http, "dev0", keys["dev0"], tmp_path / "old-card", trusted_keys=state / "keys", data=devs[0])
        for _ in range(2):
            assert old.run_once(OK)["status"] == "accepted"
        rec = Reworded(http)
        fresh = FLClient(rec, "dev0", keys["dev0"], tmp_path / "new-card", trusted_keys=state / "keys",
                         data=devs[0])
        out = fresh.run_once(OK)
        assert out["status"] == "accepted", out  # from the field: the reworded text names no seq
        assert len(rec.bodies) == 1 and rec.bodies[0]["error"] == "ReplayError", rec.bodies
        assert rec.bodies[0]["last_seq"] == old.seq == 2 and type(rec.bodies[0]["last_seq"]) is int
        assert "not newer than the last accepted seq 2" in rec.bodies[0]["problem"]  # the text stays for people
        assert fresh.seq == old.seq + 1 == out["seq_resumed"]

        # a check-in's replay is about its time, not a seq: no last_seq field
        body, hdrs = signed_checkin("dev0", keys["dev0"], {"time": 5.0})
        s, ans = post(port, "/v1/checkin", body, hdrs)
        assert (s, ans["error"]) == (409, "ReplayError") and "last_seq" not in ans, ans
        http.close()
    finally:
        proc.kill()
        proc.wait()


def test_the_client_prefers_the_field_and_falls_back_to_the_text_of_an_older_aggregator(tmp_path):
    state, keys = fleet(tmp_path, AggregatorConfig(clients_per_round=1, overselect=1.0), n=1)
    c = FLClient(HttpTransport("http://127.0.0.1:9"), "dev0", keys["dev0"], tmp_path / "c0",
                 trusted_keys=state / "keys")  # never sends
    text = "POST /v1/updates -> 409: frame seq 6 from 'dev0' is not newer than the last accepted seq 23"

    def err(fields=None, problem=text, reason="ReplayError"):
        return FLError(problem, status=409, reason=reason, fields=fields)

    assert c._seq_behind(err({"last_seq": 41})) == 41              # the field wins over the text
    assert c._seq_behind(err()) == 23                              # an older aggregator: the text
    assert c._seq_behind(err({"last_seq": 41}, problem="reworded")) == 41
    for bad in ("41", 4.5, True, -1, 2 ** 32, None):               # not a seq: never guessed from the text
        assert c._seq_behind(err({"last_seq": bad})) in ((None,) if bad is not None else (23,))
    assert c._seq_behind(err({"last_seq": 41}, reason="AlreadyContributed")) is None
