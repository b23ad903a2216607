"""Aggregator replicas on PostgreSQL at the store's edges: the database going away mid-round is a 503
and the replica carries on when it is back; a bad or unreachable --db, an empty database or a
replica without the signing key is one sentence (never the password); a batch of uploads costs the
same statements whatever its size and answers as one by one would. The replicas' round semantics
are tests/test_aggregator_pg.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from aggregator_helpers import FakeClock, signed_checkin
from edge.errors import EdgelearnError
from host.aggregator.app import Aggregator, build_app
from host.aggregator.config import AggregatorConfig
from host.aggregator.inprocess import InProcessTransport, make_state, small_params
from host.aggregator.store import open_store
from host.netutil import free_port
from pg_helpers import AWAKE, db_url as _db, fedavg as _fedavg, frame as _frame, pg  # noqa: F401 (the fixture)

ROOT = Path(__file__).resolve().parents[1]


def test_the_database_going_away_is_a_503_and_the_replica_carries_on_when_it_is_back(pg, request, tmp_path):
    url = _db(pg, request)
    cfg = AggregatorConfig(clients_per_round=2, overselect=1.0, max_overselect=1.0, round_timeout=3600)
    state, keys = make_state(tmp_path, cfg, n_devices=2, db=url)
    app = build_app(state, tick_interval=0, db=url)
    (d0, k0), (d1, k1) = sorted(keys.items())
    with InProcessTransport(app) as t:
        s, raw = t.request("POST", "/v1/checkin", *signed_checkin(d0, k0))
        assert s == 200 and json.loads(raw)["action"] == "train"
        pg.halt()
        try:
            s, raw = t.request("POST", "/v1/checkin", *signed_checkin(d1, k1))
            assert s == 503 and json.loads(raw)["error"] == "StorageError", raw
        finally:
            pg.start()
        body, hdrs = signed_checkin(d1, k1, {"time": 5.0})  # a new check-in (the refused one changed nothing)
        s, raw = t.request("POST", "/v1/checkin", body, hdrs)
        assert s == 200 and json.loads(raw)["action"] == "train", raw
        status = json.loads(t.request("GET", "/v1/status")[1])
        assert status["round"]["selected"] == 2


def test_a_bad_or_unreachable_db_is_one_sentence_without_the_password(tmp_path):
    with pytest.raises(EdgelearnError, match="neither a sqlite:///PATH nor a postgresql:// URL") as e:
        open_store("mysql://root:hunter2@db/agg", tmp_path)
    assert "hunter2" not in str(e.value)
    with pytest.raises(EdgelearnError, match="cannot connect to PostgreSQL at postgresql://u:\\*\\*\\*@127.0.0.1") as e:
        open_store(f"postgresql://u:hunter2@127.0.0.1:{free_port()}/agg", tmp_path)
    assert "hunter2" not in str(e.value)
    r = subprocess.run([sys.executable, "-m", "edge.cli", "aggregator", "serve", "--state", str(tmp_path / "s"),
                        "--db", f"postgresql://u:hunter2@127.0.0.1:{free_port()}/agg"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "cannot connect to PostgreSQL" in r.stderr and "Traceback" not in r.stderr
    assert "hunter2" not in r.stderr + r.stdout


def test_an_empty_database_or_a_replica_without_the_signing_key_is_one_sentence(pg, request, tmp_path):
    url = _db(pg, request)
    with pytest.raises(EdgelearnError, match="holds no aggregator"):
        Aggregator(tmp_path / "s", db=url)
    state, _ = make_state(tmp_path, AggregatorConfig(clients_per_round=2), n_devices=1, db=url)
    with pytest.raises(EdgelearnError, match="already holds an aggregator"):
        make_state(tmp_path / "again", AggregatorConfig(clients_per_round=2), n_devices=1, db=url)
    with pytest.raises(EdgelearnError, match="this replica has no signing key"):
        Aggregator(tmp_path / "other-machine", db=url, signing_key=str(tmp_path / "missing.key"))


def test_a_batch_costs_the_same_statements_whatever_its_size_and_answers_as_one_by_one(pg, request, tmp_path):
    """Group commit on PostgreSQL: the checks of a batch are one query and its writes one statement per
    table (pipelined), so the statements per transaction do not grow with the batch; a resend, a
    device's second frame, an unselected device and the quorum inside one batch are answered as if
    the frames had come one by one."""
    from host.aggregator.pgstore import _Db
    from host.aggregator.rounds import Reject

    url = _db(pg, request)
    cfg = AggregatorConfig(clients_per_round=40, overselect=1.2, max_overselect=1.2, round_timeout=600)
    state, keys = make_state(tmp_path, cfg, n_devices=50, db=url)
    agg = Aggregator(state, FakeClock(), db=url)
    calls = []
    real_execute, real_many = _Db.execute, _Db.executemany
    try:
        rm = agg.rounds
        frames = {}
        for i, d in enumerate(sorted(keys)[:45]):
            frames[d] = _frame(d, keys[d], rm.checkin(d, AWAKE)["task"], seed=i)
        devs = sorted(frames)

        def counted(batch):  # the statements of commit() (prepare's key look-ups run outside the lock)
            prepared = [rm.prepare(frames[d], d) if isinstance(d, str) else rm.prepare(d[1], d[0]) for d in batch]
            calls.clear()
            _Db.execute = lambda self, *a: calls.append(a[0]) or real_execute(self, *a)
            _Db.executemany = lambda self, *a: calls.append(a[0]) or real_many(self, *a)
            try:
                return rm.commit(prepared)
            finally:
                _Db.execute, _Db.executemany = real_execute, real_many

        small = counted(devs[:3])
        n_small = len(calls)
        t = rm.round
        second = _frame(devs[4], keys[devs[4]], {"round_id": t["round_id"], "model_version": t["model_version"]},
                        seed=99, seq=2)
        unselected = sorted(keys)[49]
        stranger = _frame(unselected, keys[unselected], {"round_id": t["round_id"],
                                                          "model_version": t["model_version"]}, seed=98)
        big = counted([*devs[3:20], devs[3], (devs[4], second), (unselected, stranger), *devs[20:30]])
        assert len(calls) == n_small, calls          # 27 frames cost what 3 did
        assert [a["status"] for a in small] == ["accepted"] * 3
        assert big[17]["status"] == "duplicate" and big[17]["round_id"] == 1
        assert isinstance(big[18], Reject) and big[18].error == "AlreadyContributed"
        assert isinstance(big[19], Reject) and big[19].error == "NotSelected"
        assert [a["status"] for a in big[:17] + big[20:]] == ["accepted"] * 27
        # the quorum (40) inside the next batch: 10 close round 1, the other 5 are for a closed round
        last = rm.commit([rm.prepare(frames[d], d) for d in devs[30:45]])
        assert [a["status"] for a in last[:10]] == ["accepted"] * 10
        assert all(isinstance(a, Reject) and a.error == "StaleRound" for a in last[10:])
        assert agg.store.one("SELECT status, accepted FROM rounds WHERE round_id=1") == ("closed", 40)
        assert agg.store.one("SELECT COUNT(*) FROM devices WHERE rounds_joined=1 AND last_round=1")[0] == 40
        want = _fedavg(small_params(), {d: frames[d] for d in devs[:40]}, keys)
        got = agg.registry.params()
        for k in want:
            np.testing.assert_allclose(got[k], want[k], atol=1e-5)
    finally:
        _Db.execute, _Db.executemany = real_execute, real_many
        agg.close()
