"""Group commit: concurrent uploads share one transaction, nothing is acknowledged or summed before
its commit, a failed commit answers 503 to every waiting upload and leaves no trace, and resends or
second frames inside one batch are answered as if they had come one by one."""

from __future__ import annotations

import asyncio
import sqlite3

import httpx
import numpy as np

from edge.portable.wire import INT8, Header
from host.aggregator.app import build_app
from host.aggregator.config import AggregatorConfig
from aggregator_helpers import snapshot
from host.aggregator.inprocess import make_state, small_params
from host.wire_numpy import decode_update, encode_update

N = 12


def _setup(tmp_path, clients=N + 1):
    over = max(1.0, N / clients)  # every device is selected
    state, keys = make_state(tmp_path, AggregatorConfig(clients_per_round=clients, overselect=over, max_overselect=over,
                                                        round_timeout=3600), n_devices=N)
    app = build_app(state, tick_interval=0)
    rm = app.state.aggregator.rounds
    frames = {}
    for i, (d, k) in enumerate(keys.items()):
        t = rm.checkin(d, {"battery": 1.0, "charging": True})["task"]
        rng = np.random.default_rng(i)
        tensors = [(n, (rng.standard_normal(v.shape) * 0.02).astype(np.float32)) for n, v in small_params().items()]
        frames[d] = encode_update(Header(d, t["round_id"], t["model_version"], 1, 3 + i), tensors, k, codec=INT8)
    return app, keys, frames


async def _post_all(app, posts):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agg") as c:
        rs = await asyncio.gather(*(c.post("/v1/updates", content=f, headers={"X-Edgelearn-Device": d})
                                    for d, f in posts))
    return [(r.status_code, r.json()) for r in rs]


def test_concurrent_uploads_commit_in_batches_and_sum_exactly(tmp_path):
    app, keys, frames = _setup(tmp_path)
    res = asyncio.run(_post_all(app, list(frames.items())))
    assert all(s == 200 and b["status"] == "accepted" for s, b in res), res
    g, rm = app.state.group_commit, app.state.aggregator.rounds
    assert g.committed == N and g.batches < N          # several updates per transaction
    assert rm.store.one("SELECT COUNT(*) FROM updates")[0] == N == rm.acc.count
    ups = [decode_update(f, keys[d]) for d, f in frames.items()]
    for name in small_params():
        want = sum(u.tensor(name).values.astype(np.float64) * u.header.num_examples for u in ups)
        np.testing.assert_allclose(rm.acc.sums[name], want, rtol=1e-12)


def test_failed_commit_answers_503_and_changes_nothing(tmp_path, monkeypatch):
    app, keys, frames = _setup(tmp_path)
    rm = app.state.aggregator.rounds
    before = snapshot(rm.store)
    real_tx = rm.store.tx

    def broken_tx():
        raise sqlite3.OperationalError("disk I/O error")
    monkeypatch.setattr(rm.store, "tx", broken_tx)
    res = asyncio.run(_post_all(app, list(frames.items())[:5]))
    assert [(s, b["error"]) for s, b in res] == [(503, "StorageError")] * 5
    assert rm.acc.count == 0
    monkeypatch.setattr(rm.store, "tx", real_tx)
    assert snapshot(rm.store) == before
    # the same frames go through once the disk is back
    res = asyncio.run(_post_all(app, list(frames.items())[:5]))
    assert [b["status"] for _, b in res] == ["accepted"] * 5


def test_resend_and_second_frame_in_one_batch(tmp_path):
    app, keys, frames = _setup(tmp_path)
    d0, d1 = list(frames)[:2]
    rm = app.state.aggregator.rounds
    t = rm.round
    rng = np.random.default_rng(99)
    other = encode_update(Header(d1, t["round_id"], t["model_version"], 2, 5),
                          [(n, (rng.standard_normal(v.shape) * 0.02).astype(np.float32))
                           for n, v in small_params().items()], keys[d1], codec=INT8)
    res = asyncio.run(_post_all(app, [(d0, frames[d0]), (d0, frames[d0]), (d1, frames[d1]), (d1, other)]))
    assert [b.get("status") for _, b in res[:2]] == ["accepted", "duplicate"]
    assert res[2][1]["status"] == "accepted"
    assert (res[3][0], res[3][1]["error"]) == (409, "AlreadyContributed")
    assert rm.acc.count == 2


def test_quorum_inside_a_batch_closes_the_round_and_refuses_the_rest(tmp_path):
    app, keys, frames = _setup(tmp_path, clients=5)
    res = asyncio.run(_post_all(app, list(frames.items())[:8]))
    ok = [b for s, b in res if s == 200]
    late = [b["error"] for s, b in res if s != 200]
    assert len(ok) == 5 and late == ["StaleRound"] * 3
    rm = app.state.aggregator.rounds
    assert rm.store.one("SELECT status, accepted FROM rounds WHERE round_id=1") == ("closed", 5)
