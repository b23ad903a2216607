"""SIGKILL the aggregator process while updates stream in: after restart no accepted update is lost
or counted twice, and the round's aggregate equals FedAvg over exactly one update per device."""

from __future__ import annotations

import http.client
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from aggregator_helpers import post, signed_checkin, start
from edge.portable.wire import INT8, Header
from host.aggregator.config import AggregatorConfig
from host.aggregator.models import load_params
from host.aggregator.store import Store
from host.aggregator.inprocess import make_state, small_params
from host.wire_numpy import decode_update, encode_update
from host.netutil import free_port

ROOT = Path(__file__).resolve().parents[1]
N = 40


@pytest.mark.slow
def test_sigkill_mid_round_loses_and_duplicates_nothing(tmp_path):
    state, keys = make_state(tmp_path, AggregatorConfig(clients_per_round=N, overselect=1.0, round_timeout=3600),
                             n_devices=N)
    port = free_port()
    proc = start(state, port)
    frames = {}
    try:
        for d, k in keys.items():
            body, hdrs = signed_checkin(d, k)
            s, ans = post(port, "/v1/checkin", body, hdrs)
            assert s == 200 and ans["action"] == "train", ans
            t = ans["task"]
            rng = np.random.default_rng(int(d[3:]))
            tensors = [(n, (rng.standard_normal(v.shape) * 0.05).astype(np.float32)) for n, v in small_params().items()]
            frames[d] = encode_update(Header(d, t["round_id"], t["model_version"], 1, int(rng.integers(1, 50))),
                                      tensors, k, codec=INT8)
        acked, lock = set(), threading.Lock()
        order = list(frames)

        def sender(part):
            for d in part:
                try:
                    s, ans = post(port, "/v1/updates", frames[d], {"X-Edgelearn-Device": d})
                except (OSError, http.client.HTTPException):
                    return  # the server died under us (refused, reset, or cut mid-answer)
                if s == 200:
                    with lock:
                        acked.add(d)
                time.sleep(0.01)

        threads = [threading.Thread(target=sender, args=(order[i::4],)) for i in range(4)]
        for th in threads:
            th.start()
        while len(acked) < N // 3:
            time.sleep(0.002)
        os.kill(proc.pid, signal.SIGKILL)  # mid-stream: requests are in flight, some mid-commit
        proc.wait()
        for th in threads:
            th.join()
        assert 0 < len(acked) < N

        db = Store(state / "state.sqlite")
        rows = db.all("SELECT device_id, digest FROM updates")
        stored = {d for d, _ in rows}
        assert len(rows) == len(stored)                  # nobody twice
        assert acked <= stored                            # nothing acknowledged was lost
        assert db.one("SELECT accepted FROM rounds WHERE status='open'")[0] == len(rows)
        db.close()

        proc = start(state, port)
        results = {d: post(port, "/v1/updates", frames[d], {"X-Edgelearn-Device": d}) for d in order}
        for d, (s, ans) in results.items():
            assert s == 200, (d, ans)
            assert ans["status"] == ("duplicate" if d in stored else "accepted"), (d, ans)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)

    # the N-th distinct update closed the round: the published model is FedAvg over exactly N updates
    db = Store(state / "state.sqlite")
    r = db.one("SELECT status, accepted, result_version FROM rounds WHERE round_id=1")
    db.close()
    assert r[0] == "closed" and r[1] == N
    base = small_params()
    ups = [decode_update(f, keys[d]) for d, f in frames.items()]
    total = sum(u.header.num_examples for u in ups)
    new = load_params(state / "models" / f"v{r[2]}.npz")
    for name in base:
        want = base[name] + sum(u.tensor(name).values.astype(np.float64) * u.header.num_examples for u in ups) / total
        np.testing.assert_allclose(new[name], want, rtol=1e-5, atol=1e-6)
