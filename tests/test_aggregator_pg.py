"""Aggregator replicas on one PostgreSQL database (a real server from Debian's postgresql package,
started in a temporary directory): two ``aggregator serve`` processes over HTTP take uploads and
resends for one round, it closes once and one version is published from exactly the accepted
updates, servable by both; a kill -9 of one replica mid-ingestion loses no acknowledged update;
a deadline both replicas see closes the round once; DP accounting and a secure-aggregation round
run across replicas. The store's edges (an outage, bad URLs, group-commit cost) are
tests/test_aggregator_pg_faults.py; the server and frames, tests/pg_helpers.py."""

from __future__ import annotations

import http.client
import io
import json
import signal
import subprocess
import threading
import time
import zipfile

import numpy as np

from aggregator_helpers import FIRST, FakeClock, signed_checkin, start
from aggregator_helpers import post as _post
from host.aggregator.app import Aggregator, build_app
from host.aggregator.config import AggregatorConfig
from host.aggregator.inprocess import InProcessTransport, make_state, small_params
from host.aggregator.models import load_params
from host.aggregator.store import open_store
from host.wire_numpy import decode_update
from host.netutil import free_port
from pg_helpers import AWAKE, db_url as _db, fedavg as _fedavg, frame as _frame, pg  # noqa: F401 (the fixture)



def _get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def _serve(state, port, url, key) -> subprocess.Popen:
    return start(state, port, "--db", url, "--signing-key", key)


def _key_path(state):
    return next((state / "keys").glob("*.key"))


def test_two_serve_replicas_close_one_round_from_exactly_the_accepted_updates(pg, request, tmp_path):
    url = _db(pg, request)
    n = 6
    cfg = AggregatorConfig(clients_per_round=n, overselect=1.0, max_overselect=1.0, round_timeout=3600)
    rehearsal = (np.random.default_rng(1).standard_normal((12, 64)).astype(np.float32), np.arange(12) % 10)
    state, keys = make_state(tmp_path, cfg, n_devices=n + 2, db=url, rehearsal=rehearsal)
    ports = [free_port(), free_port()]
    procs = [_serve(state, ports[0], url, _key_path(state)),
             _serve(tmp_path / "replica-b", ports[1], url, _key_path(state))]
    try:
        frames, answers = {}, []
        for i, (d, k) in enumerate(sorted(keys.items())):
            s, ans = _post(ports[i % 2], "/v1/checkin", *signed_checkin(d, k))
            assert s == 200, ans
            if ans["action"] == "train":
                frames[d] = _frame(d, k, ans["task"], seed=i)
        assert len(frames) == n  # the selection is shared: the last two were told the round is full
        for i, (d, f) in enumerate(sorted(frames.items())):
            hdrs = {"X-Edgelearn-Device": d, "Content-Type": "application/octet-stream"}
            s, ans = _post(ports[i % 2], "/v1/updates", f, hdrs)
            answers.append(ans["status"])
            if i < n - 1:  # the resend of an accepted update to the other replica is recognised
                s2, dup = _post(ports[(i + 1) % 2], "/v1/updates", f, hdrs)
                assert (s2, dup["status"], dup["round_id"]) == (200, "duplicate", 1), dup
        assert answers == ["accepted"] * n
        st = [json.loads(_get(p, "/v1/status")[1]) for p in ports]
        assert st[0]["current_version"] == st[1]["current_version"] == FIRST + 1
        assert st[0]["store"] == "postgresql"
        rounds = {r["round_id"]: r for r in st[1]["rounds"]}
        assert rounds[1]["status"] == "closed" and rounds[1]["accepted"] == n and rounds[1]["result_version"] == FIRST + 1
        assert [m["round_id"] for m in st[0]["models"]] == [None, 1]   # exactly one version from round 1
        # both replicas serve the new version (published by one of them), byte for byte
        a, b = _get(ports[0], f"/v1/bundles/{FIRST + 1}.zip"), _get(ports[1], f"/v1/bundles/{FIRST + 1}.zip")
        assert a[0] == b[0] == 200 and a[1] == b[1]
        # the rehearsal set init put into the database rides in the version, whichever replica built it
        with zipfile.ZipFile(io.BytesIO(a[1])) as z:
            name = next(n for n in z.namelist() if n.endswith("rehearsal.npz"))
            with np.load(io.BytesIO(z.read(name))) as r:
                assert np.array_equal(r["X"], rehearsal[0]) and np.array_equal(r["y"], rehearsal[1])
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=30)
    store = open_store(url, tmp_path)
    try:
        head = load_params(io.BytesIO(store.get_file(f"models/v{FIRST + 1}.npz")))
        assert store.one("SELECT COUNT(*) FROM updates")[0] == 0
    finally:
        store.close()
    want = _fedavg(small_params(), frames, keys)
    for k in want:
        np.testing.assert_allclose(head[k], want[k], atol=1e-5)


def test_kill9_of_one_replica_during_ingestion_loses_no_acknowledged_update(pg, request, tmp_path):
    url = _db(pg, request)
    n = 40
    cfg = AggregatorConfig(clients_per_round=n, overselect=1.0, max_overselect=1.0, round_timeout=3600)
    state, keys = make_state(tmp_path, cfg, n_devices=n, db=url)
    key = _key_path(state)
    ports = [free_port(), free_port()]
    dirs = [state, tmp_path / "replica-b"]
    procs = [_serve(dirs[0], ports[0], url, key), _serve(dirs[1], ports[1], url, key)]
    frames = {}
    for i, (d, k) in enumerate(sorted(keys.items())):
        s, ans = _post(ports[i % 2], "/v1/checkin", *signed_checkin(d, k))
        assert s == 200 and ans["action"] == "train", ans
        frames[d] = _frame(d, k, ans["task"], seed=100 + i)
    acked, lock = {}, threading.Lock()

    def upload(devs, first):
        for j, d in enumerate(devs):
            hdrs = {"X-Edgelearn-Device": d, "Content-Type": "application/octet-stream"}
            for attempt in range(200):  # a dead replica: try the other one, as a load balancer would
                try:
                    s, ans = _post(ports[(first + j + attempt) % 2], "/v1/updates", frames[d], hdrs)
                except (OSError, http.client.HTTPException):  # refused, reset, or cut mid-answer by the kill
                    time.sleep(0.02)
                    continue
                if s == 200:
                    with lock:
                        acked[d] = ans["status"]
                    break
                time.sleep(0.02)

    devs = sorted(frames)
    threads = [threading.Thread(target=upload, args=(devs[i::4], i)) for i in range(4)]
    try:
        for t in threads:
            t.start()
        while len(acked) < n // 3:
            time.sleep(0.005)
        procs[0].send_signal(signal.SIGKILL)        # mid-ingestion, no warning
        procs[0].wait()
        procs[0] = _serve(dirs[0], ports[0], url, key)  # restarted on its own state directory
        for t in threads:
            t.join(timeout=120)
        assert len(acked) == n
        st = json.loads(_get(ports[1], "/v1/status")[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=30)
    r1 = {r["round_id"]: r for r in st["rounds"]}[1]
    assert (r1["status"], r1["accepted"], r1["result_version"]) == ("closed", n, FIRST + 1)
    assert [m["round_id"] for m in st["models"]] == [None, 1]
    store = open_store(url, tmp_path)
    try:
        head = load_params(io.BytesIO(store.get_file(f"models/v{FIRST + 1}.npz")))
        assert store.one("SELECT COUNT(*) FROM devices WHERE rounds_joined = 1")[0] == n
    finally:
        store.close()
    want = _fedavg(small_params(), frames, keys)  # every update exactly once: none lost, none twice
    for k in want:
        np.testing.assert_allclose(head[k], want[k], atol=1e-5)


def _replicas(tmp_path, url, cfg, n_devices, clock):
    state, keys = make_state(tmp_path, cfg, n_devices=n_devices, db=url)
    key = str(_key_path(state))
    return state, keys, [Aggregator(state, clock, db=url), Aggregator(tmp_path / "b", clock, key, db=url)]


def test_a_deadline_both_replicas_see_closes_the_round_once(pg, request, tmp_path):
    url = _db(pg, request)
    clock = FakeClock()
    cfg = AggregatorConfig(clients_per_round=4, overselect=1.0, max_overselect=1.0, round_timeout=60)
    state, keys, (a, b) = _replicas(tmp_path, url, cfg, 4, clock)
    try:
        sent = {}
        for i, d in enumerate(sorted(keys)[:3]):
            t = (a, b)[i % 2].rounds.checkin(d, AWAKE)["task"]
            sent[d] = _frame(d, keys[d], t, seed=i)
            assert (b, a)[i % 2].rounds.submit(sent[d], d)["status"] == "accepted"
        clock.t += 61
        b.rounds.tick()
        a.rounds._close("deadline")  # a's ticker read the deadline before b's close committed: a no-op
        a.rounds.tick()
        rows = a.store.all("SELECT round_id, status, accepted, result_version FROM rounds ORDER BY round_id")
        assert rows == [(1, "closed", 3, FIRST + 1), (2, "open", 0, None)]
        assert a.store.all("SELECT version, round_id FROM models ORDER BY version") == [(FIRST, None), (FIRST + 1, 1)]
        assert a.rounds.round["round_id"] == b.rounds.round["round_id"] == 2
        want = _fedavg(small_params(), sent, keys)
        for reg in (a.registry, b.registry):   # both hold the same version (b fetched it from the database)
            got = reg.params(FIRST + 1)
            for k in want:
                np.testing.assert_allclose(got[k], want[k], atol=1e-5)
    finally:
        a.close()
        b.close()


def test_files_of_a_publication_that_never_committed_do_not_shadow_the_published_version(pg, request, tmp_path):
    from host.aggregator.models import params_bytes

    url = _db(pg, request)
    clock = FakeClock()
    cfg = AggregatorConfig(clients_per_round=2, overselect=1.0, max_overselect=1.0, round_timeout=600)
    state, keys = make_state(tmp_path, cfg, n_devices=2, db=url)
    # what a replica killed inside its close leaves: FIRST + 1's head written, the transaction never committed
    bogus = {k: np.full_like(v, 7.0) for k, v in small_params().items()}
    (state / "models" / f"v{FIRST + 1}.npz").write_bytes(params_bytes(bogus))
    a = Aggregator(state, clock, db=url)   # restarted on that state directory
    b = Aggregator(tmp_path / "b", clock, str(_key_path(state)), db=url)
    try:
        sent = {}
        for d in sorted(keys):
            sent[d] = _frame(d, keys[d], b.rounds.checkin(d, AWAKE)["task"], seed=len(sent))
            b.rounds.submit(sent[d], d)
        assert b.registry.current == FIRST + 1
        want, got = _fedavg(small_params(), sent, keys), a.registry.params(FIRST + 1)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], atol=1e-5)
    finally:
        a.close()
        b.close()


def test_fedbuff_buffers_fill_across_replicas_and_each_makes_one_version(pg, request, tmp_path):
    url = _db(pg, request)
    clock = FakeClock()
    cfg = AggregatorConfig(mode="async", buffer_size=3, max_concurrency=10, round_timeout=600)
    state, keys, reps = _replicas(tmp_path, url, cfg, 6, clock)
    try:
        sent = {}
        for i, d in enumerate(sorted(keys)):
            t = reps[i % 2].rounds.checkin(d, AWAKE)["task"]
            sent[d] = _frame(d, keys[d], t, seed=20 + i)
        for i, (d, f) in enumerate(sorted(sent.items())):
            assert reps[(i + 1) % 2].rounds.submit(f, d)["status"] == "accepted"
        rows = reps[0].store.all("SELECT round_id, status, accepted, result_version FROM rounds ORDER BY round_id")
        assert rows == [(1, "closed", 3, FIRST + 1), (2, "closed", 3, FIRST + 2), (3, "open", 0, None)]
        # the second buffer: trained from FIRST, one version behind FIRST + 1 (weight n / sqrt(2), onto it)
        first = dict(sorted(sent.items())[:3])
        v3 = _fedavg(small_params(), first, keys)
        ups = [decode_update(f, keys[d]) for d, f in sorted(sent.items())[3:]]
        w = [u.header.num_examples / np.sqrt(2) for u in ups]
        got = reps[1].registry.params(FIRST + 2)
        for k in v3:
            want = v3[k] + sum(wi * np.asarray(t.values, np.float64).reshape(v3[k].shape)
                               for wi, u in zip(w, ups) for t in u.tensors if t.name == k) / sum(w)
            np.testing.assert_allclose(got[k], want, atol=1e-5)
    finally:
        for r in reps:
            r.close()


def test_dp_accounting_is_the_single_replica_one_whichever_replica_closes(pg, request, tmp_path):
    from host.privacy.accountant import RdpAccountant

    url = _db(pg, request)
    clock = FakeClock()
    cfg = AggregatorConfig(clients_per_round=2, overselect=1.0, max_overselect=1.0, round_timeout=600,
                           dp_clip=1.0, dp_noise=1.1)
    state, keys, reps = _replicas(tmp_path, url, cfg, 6, clock)
    try:
        for rnd in range(3):   # round k is closed by replica k % 2
            devs = sorted(keys)[2 * rnd:2 * rnd + 2]
            for j, d in enumerate(devs):
                t = reps[j].rounds.checkin(d, AWAKE)["task"]
                reps[rnd % 2].rounds.submit(_frame(d, keys[d], t, seed=10 * rnd + j, seq=rnd + 1), d)
        eps = [e for (e,) in reps[0].store.all("SELECT epsilon FROM models WHERE round_id IS NOT NULL "
                                               "ORDER BY version")]
        ref = RdpAccountant()
        want = []
        for _ in range(3):
            ref.step(2 / 6, 1.1)     # q = clients_per_round / population, as one replica accounts it
            want.append(ref.epsilon(cfg.dp_delta))
        np.testing.assert_allclose(eps, want, rtol=1e-9)
        for r in reps:
            r.rounds.sync()
            assert r.rounds.round["round_id"] == 4
            np.testing.assert_allclose(r.rounds.strategy.accountant.epsilon(cfg.dp_delta), want[-1], rtol=1e-9)
    finally:
        for r in reps:
            r.close()


class _Alternating:
    """A device's transport that sends each request to the next replica (a round-robin balancer)."""

    def __init__(self, transports):
        self.ts, self.i = transports, 0

    def request(self, method, path, body=b"", headers=None):
        self.i += 1
        return self.ts[self.i % len(self.ts)].request(method, path, body, headers)


def test_a_secure_aggregation_round_across_replicas_publishes_fedavg(pg, request, tmp_path):
    from edge.fl import FLClient

    url = _db(pg, request)
    clock = FakeClock()
    cfg = AggregatorConfig(clients_per_round=4, overselect=1.0, max_overselect=1.0, round_timeout=600,
                           secure_aggregation=True, secagg_phase_timeout=20)
    state, keys = make_state(tmp_path, cfg, n_devices=4, db=url)
    apps = [build_app(state, clock=clock, tick_interval=0, db=url),
            build_app(tmp_path / "b", clock=clock, tick_interval=0, signing_key=str(_key_path(state)), db=url)]
    rng = np.random.default_rng(3)
    deltas = {d: ({k: (rng.standard_normal(v.shape) * 0.05).astype(np.float32) for k, v in small_params().items()},
                  int(rng.integers(1, 40))) for d in keys}
    with InProcessTransport(apps[0]) as t0, InProcessTransport(apps[1]) as t1:
        clients = {d: FLClient(_Alternating([t0, t1]), d, k, tmp_path / "dev" / d, trusted_keys=state / "keys")
                   for d, k in keys.items()}
        tasks = {d: c.checkin(AWAKE)["task"] for d, c in clients.items()}
        views = {}
        for _ in range(8):
            for d in sorted(keys):
                views[d] = clients[d].secure_step(tasks[d], *deltas[d])
        assert {v["phase"] for v in views.values()} == {"done"}, views
        store = apps[1].state.aggregator.store
        assert store.one("SELECT status, accepted, result_version FROM rounds WHERE round_id=1") == ("closed", 4, FIRST + 1)
        assert store.one("SELECT COUNT(*) FROM updates")[0] == 0   # nothing individual was stored
        head = apps[0].state.aggregator.registry.params(FIRST + 1)
    base, total = small_params(), sum(n for _, n in deltas.values())
    for k in base:
        want = base[k] + sum(dl[k].astype(np.float64) * n for dl, n in deltas.values()) / total
        np.testing.assert_allclose(head[k], want, atol=4 * 2 ** -16 / total + 1e-6)
