"""Aggregator replicas on PostgreSQL beside one aggregator on SQLite, and the kill -9 test.

Ingest: HTTP uploads of 10k-parameter int8 updates (bench/aggregator_ingest.py's load generator
and frames, 64 keep-alive connections) into one ``aggregator serve`` on SQLite (the reference,
synchronous=full) and into 1 and 2 ``aggregator serve --db postgresql://`` replicas of one database
(the load split evenly over both), every run in this process on a fresh database of one throwaway
PostgreSQL server (fsync on; bench/_pgserver.py). Every configuration acknowledges an update only
after its commit. The three configurations run interleaved ``REPEATS`` times (the cores are shared
with whatever else runs) and the median run is the value; CPU of the replicas, of the PostgreSQL
server and of the load generator is reported per run.

Kill test: rounds of ``K`` fresh devices uploading to two replicas while one of them (alternately)
is killed with SIGKILL at a random point of the round and restarted on its state directory; the
load generator resends what got no answer to the other replica (a load balancer's retry). Then,
from the database: acknowledged updates that are not counted (lost), updates counted more than
once (rows vs distinct devices, ``rounds_joined``), published versions per round, and the
published model against FedAvg of the round's frames computed here.

    $ edgelearn bench aggregator_replicas
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.aggregator_ingest import _cpu, _load, _run, _stack, _status  # noqa: E402
from bench.aggregator_ingest import _serve as _serve_one  # noqa: E402
from bench.common import row, write_results  # noqa: E402
from edge.portable.wire import INT8, Header  # noqa: E402
from host.wire_numpy import encode_update  # noqa: E402

N_WARM, N_MEASURE = 400, 1600
REPEATS = 3  # configurations interleaved, the median reported: the machine's cores are shared
KILL_ROUNDS, KILL_K = 6, 150
PACE = 0.8  # mean s between a kill-test worker's uploads: a round's ingestion spans a few seconds
BIG = dict(clients_per_round=10**6, overselect=1.0, round_timeout=10**6, max_concurrency=10**6,
           max_rounds_per_window=10**6)


def _prepare(d: Path, n: int, db, cfg_kw, prefix="dev", seed=0):
    """A state (and database) with ``n`` devices checked in; (state dir, key file, [(device, frame)], keys)."""
    from host.aggregator.app import Aggregator
    from host.aggregator.config import AggregatorConfig
    from host.aggregator.setup import init_state

    state = d / "agg"
    init_state(state, AggregatorConfig(**cfg_kw), params={"w": np.zeros((100, 100), np.float32)}, db=db)
    agg = Aggregator(state, db=db)
    if db:  # setup only: this session need not wait for each commit's flush
        agg.store.db.execute("SET synchronous_commit = off")
    keys = {f"{prefix}{i}": bytes(np.random.default_rng([seed, i]).bytes(32)) for i in range(n)}
    with agg.store.tx() as c:
        for dev, key in keys.items():
            c.execute("INSERT INTO devices(device_id, key, tier) VALUES(?,?,?)", (dev, key, "linux"))
    rng = np.random.default_rng(seed)
    frames = []
    for dev, key in keys.items():
        t = agg.rounds.checkin(dev, {"battery": 1.0, "charging": True})["task"]
        frames.append((dev, encode_update(Header(dev, t["round_id"], t["model_version"], 1, int(rng.integers(1, 20))),
                                          [("w", (rng.standard_normal((100, 100)) * 0.01).astype(np.float32))],
                                          key, codec=INT8)))
    agg.close()
    return state, next((state / "keys").glob("*.key")), frames, keys


def _serve(state, port, db=None, key=None):
    return _serve_one(state, port, *(("--db", db, "--signing-key", key) if db else ()))


def _stop(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(timeout=60)


async def _spread(ports, frames, conns=64):
    """bench.aggregator_ingest's load generator, its connections split over the replicas."""
    k = len(ports)
    parts = await asyncio.gather(*(_load(p, frames[i::k], conns // k) for i, p in enumerate(ports)))
    return [s for part in parts for s in part]


def ingest(pg, td: Path, name: str, replicas: int):
    from host.netutil import free_port

    db = pg.database(name) if replicas else None
    state, key, frames, _ = _prepare(td / name, N_WARM + N_MEASURE, db, {**BIG, "synchronous": "full"})
    ports = [free_port() for _ in range(max(1, replicas))]
    dirs = [state] + [td / name / f"replica{i}" for i in range(1, len(ports))]
    procs = [_serve(s, p, db, key) for s, p in zip(dirs, ports)]
    try:
        st = _run(_spread(ports, frames[:N_WARM]))
        assert all(x == 200 for x in st), set(st)
        load = os.getloadavg()[0]
        t, cpu0, cli0, pg0 = time.perf_counter(), sum(_cpu(p.pid) for p in procs), time.process_time(), _pg_cpu(pg)
        st = _run(_spread(ports, frames[N_WARM:]))
        dt = time.perf_counter() - t
        cpu = sum(_cpu(p.pid) for p in procs) - cpu0
        cli = time.process_time() - cli0
        pgc = _pg_cpu(pg) - pg0
        assert all(x == 200 for x in st), set(st)
        gcs = [_status(p)["group_commit"] for p in ports]
    finally:
        _stop(procs)
    from host.aggregator.store import open_store
    store = open_store(db, state)
    accepted = store.one("SELECT accepted FROM rounds WHERE round_id=1")[0]
    rows = store.one("SELECT COUNT(*), COUNT(DISTINCT device_id) FROM updates")
    store.close()
    assert accepted == rows[0] == rows[1] == N_WARM + N_MEASURE, (accepted, rows)
    return {"rate": N_MEASURE / dt, "frame_bytes": len(frames[0][1]),
            "mean_batch": round(sum(g["updates"] for g in gcs) / max(1, sum(g["batches"] for g in gcs)), 1),
            "replica_cpu_us_per_update": round(1e6 * cpu / N_MEASURE, 1),
            "replicas_core_busy": round(cpu / dt, 3), "loadgen_core_busy": round(cli / dt, 3),
            "postgres_core_busy": round(pgc / dt, 3) if replicas else None, "loadavg_1min_before": round(load, 2)}


def _pg_cpu(pg) -> float:
    """CPU seconds of the PostgreSQL server: the postmaster and every process it forked."""
    try:
        root = int((pg.data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    total = 0.0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
            if int(d.name) == root or int(f[1]) == root:
                total += _cpu(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    return total


async def _retrying(ports, items, conns, acked, answers, pace: float = 0.0):
    """Upload each (device, frame) until some replica answers 200; a dropped connection (a killed
    replica) or a 5xx moves the worker to the next replica and resends the same frame. ``pace``:
    mean seconds between one worker's uploads (devices finish training at different times)."""
    async def worker(part, first):
        i, r, w = first, None, None
        gaps = random.Random(first)
        for dev, f in part:
            if pace:
                await asyncio.sleep(gaps.expovariate(1 / pace))
            for _ in range(500):
                try:
                    if w is None:
                        r, w = await asyncio.open_connection("127.0.0.1", ports[i % len(ports)])
                    w.write(b"POST /v1/updates HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
                            b"X-Edgelearn-Device: " + dev.encode() + b"\r\nContent-Length: " +
                            str(len(f)).encode() + b"\r\n\r\n" + f)
                    await w.drain()
                    line = await r.readline()
                    if not line:
                        raise ConnectionResetError
                    status = int(line.split()[1])
                    length = 0
                    while (h := await r.readline()) not in (b"\r\n", b""):
                        if h.lower().startswith(b"content-length:"):
                            length = int(h.split(b":")[1])
                    body = json.loads(await r.readexactly(length))
                except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                    if w is not None:
                        w.close()
                    r = w = None
                    i += 1
                    answers["resent"] += 1
                    await asyncio.sleep(0.01)
                    continue
                if status == 200:
                    acked[dev] = body["status"]
                    answers[body["status"]] = answers.get(body["status"], 0) + 1
                    break
                if status == 409 and body.get("error") == "ReplayError":
                    answers["replay_after_close"] += 1  # accepted before, its answer lost, round closed since
                    break
                answers[f"http_{status}"] = answers.get(f"http_{status}", 0) + 1
                await asyncio.sleep(0.01)
            else:
                answers["gave_up"] = answers.get("gave_up", 0) + 1
        if w is not None:
            w.close()
    await asyncio.gather(*(worker(items[j::conns], j) for j in range(conns)))


def kill_test(pg, td: Path):
    from host.aggregator.app import Aggregator
    from host.aggregator.models import load_params
    from host.aggregator.store import open_store
    from host.wire_numpy import decode_update
    from host.netutil import free_port

    db = pg.database("kill")
    cfg = dict(clients_per_round=KILL_K, overselect=1.0, max_overselect=1.0, round_timeout=10**6,
               max_concurrency=10**6, synchronous="full")
    state, key, _, _ = _prepare(td / "kill", 0, db, cfg)
    ports = [free_port(), free_port()]
    dirs = [state, td / "kill" / "replica1"]
    procs = [_serve(dirs[0], ports[0], db, key), _serve(dirs[1], ports[1], db, key)]
    rnd = random.Random(0)
    per_round, kills, answers = [], 0, {"resent": 0, "replay_after_close": 0}
    try:
        for k in range(KILL_ROUNDS):
            # this round's devices: fresh ones, registered and checked in through a third, short-lived replica
            agg = Aggregator(td / "kill" / "setup", db=db, signing_key=str(key))
            rng = np.random.default_rng(k)
            keys = {f"r{k}d{i}": rng.bytes(32) for i in range(KILL_K)}
            with agg.store.tx() as c:
                for dev, kk in keys.items():
                    c.execute("INSERT INTO devices(device_id, key, tier) VALUES(?,?,?)", (dev, kk, "linux"))
            frames = []
            for dev, kk in keys.items():
                t = agg.rounds.checkin(dev, {"battery": 1.0, "charging": True})["task"]
                rid = t["round_id"]
                frames.append((dev, encode_update(Header(dev, t["round_id"], t["model_version"], 1,
                                                         int(rng.integers(1, 20))),
                                                  [("w", (rng.standard_normal((100, 100)) * 0.01).astype(np.float32))],
                                                  kk, codec=INT8)))
            base_version = agg.registry.current
            agg.close()
            acked = {}
            victim = k % 2
            at = rnd.uniform(0.15, 0.7)

            async def round_with_kill():
                load = asyncio.ensure_future(_retrying(ports, frames, 32, acked, answers, pace=PACE))
                while len(acked) < at * KILL_K and not load.done():
                    await asyncio.sleep(0.002)
                procs[victim].send_signal(signal.SIGKILL)
                await asyncio.get_running_loop().run_in_executor(None, procs[victim].wait)
                procs[victim] = await asyncio.get_running_loop().run_in_executor(
                    None, _serve, dirs[victim], ports[victim], db, key)
                await load
            t0 = time.perf_counter()
            _run(round_with_kill())
            kills += 1
            per_round.append({"round_id": rid, "base_version": base_version, "frames": dict(frames), "keys": keys,
                              "acked": dict(acked), "killed_at": round(at, 3), "seconds": time.perf_counter() - t0})
        store = open_store(db, td / "kill")
        for _ in range(200):  # a replica killed between the quorum's commit and the close: a ticker closes it
            if store.one("SELECT status FROM rounds WHERE round_id=?", (rid,))[0] != "open":
                break
            time.sleep(0.05)
        store.close()
    finally:
        _stop(procs)
    store = open_store(db, td / "kill")
    try:
        out = []
        for pr in per_round:
            rid = pr["round_id"]
            status, accepted, version = store.one("SELECT status, accepted, result_version FROM rounds "
                                                  "WHERE round_id=?", (rid,))
            versions = store.one("SELECT COUNT(*) FROM models WHERE round_id=?", (rid,))[0]
            devs = list(pr["keys"])
            joined = dict(store.all("SELECT device_id, rounds_joined FROM devices WHERE device_id LIKE ?",
                                    (f"r{per_round.index(pr)}d%",)))
            counted = {d for d in devs if joined.get(d, 0) >= 1}
            lost = sum(1 for d in pr["acked"] if d not in counted)
            double = sum(max(0, joined.get(d, 0) - 1) for d in devs)
            head = load_params(io.BytesIO(store.get_file(f"models/v{version}.npz")))["w"] if version else None
            ups = [decode_update(f, pr["keys"][d]) for d, f in pr["frames"].items() if d in counted]
            n = sum(u.header.num_examples for u in ups)
            base = load_params(io.BytesIO(store.get_file(f"models/v{pr['base_version']}.npz")))["w"]
            want = base + sum(np.asarray(u.tensors[0].values, np.float64).reshape(100, 100) * u.header.num_examples
                              for u in ups) / n
            out.append({"round_id": rid, "status": status, "accepted": accepted, "acknowledged": len(pr["acked"]),
                        "lost": lost, "double_counted": double, "versions_published": versions,
                        "max_abs_diff_vs_fedavg": None if head is None else float(np.max(np.abs(head - want))),
                        "killed_at_fraction": pr["killed_at"], "seconds": round(pr["seconds"], 2)})
    finally:
        store.close()
    return out, kills, answers


def _median(results: list) -> dict:
    """The run with the median rate, with every run's rate beside it."""
    best = sorted(results, key=lambda r: r["rate"])[len(results) // 2]
    return {**best, "rate_per_run": [round(r["rate"], 1) for r in results]}


def main():
    from bench._pgserver import PgServer

    rows = []
    with PgServer() as pg, tempfile.TemporaryDirectory() as td:
        td = Path(td)
        runs = {0: [], 1: [], 2: []}
        for k in range(REPEATS):
            for n in runs:
                runs[n].append(ingest(pg, td, f"{('sqlite', 'pg1', 'pg2')[n]}_{k}", n))
        sq, p1, p2 = (_median(runs[n]) for n in (0, 1, 2))
        ref = "one aggregator on SQLite (synchronous=full), same frames and load"
        rows.append(row("aggregator_replicas", "HTTP ingest of 10k-param INT8 updates, one aggregator on SQLite",
                        round(sq["rate"], 1), "updates/s", "1 replica on PostgreSQL", round(p1["rate"], 1),
                        ratio=sq["rate"] / p1["rate"], server=_stack(), repeats=REPEATS,
                        note="value: the median of the interleaved runs",
                        **{k: v for k, v in sq.items() if k not in ("rate", "postgres_core_busy")}))
        for n, res in ((1, p1), (2, p2)):
            rows.append(row("aggregator_replicas", f"HTTP ingest of 10k-param INT8 updates, {n} replica(s) on "
                            "PostgreSQL", round(res["rate"], 1), "updates/s", ref, round(sq["rate"], 1),
                            ratio=res["rate"] / sq["rate"], replicas=n, postgres=pg.bin.parent.name,
                            **{k: v for k, v in res.items() if k != "rate"},
                            repeats=REPEATS, note="value: the median of the interleaved runs; ratio: value / "
                            "baseline (higher is better); the PostgreSQL server, the replicas and the load generator "
                            "share the machine's cores; every write transaction holds the one advisory lock"))
        per_round, kills, answers = kill_test(pg, td)
    acked = sum(r["acknowledged"] for r in per_round)
    common = dict(rounds=len(per_round), clients_per_round=KILL_K, kills=kills, answers=answers, per_round=per_round)
    rows.append(row("aggregator_replicas", f"kill -9 of one of 2 replicas during ingestion ({kills} kills): "
                    "acknowledged updates lost", sum(r["lost"] for r in per_round), "updates",
                    "acknowledged updates", acked, ratio=None, **common))
    rows.append(row("aggregator_replicas", "... accepted updates counted twice", sum(r["double_counted"] for r in per_round),
                    "updates", "accepted updates", sum(r["accepted"] for r in per_round), ratio=None))
    rows.append(row("aggregator_replicas", "... rounds that published exactly one version",
                    sum(r["versions_published"] == 1 and r["status"] == "closed" for r in per_round), "rounds",
                    "rounds", len(per_round), versions_per_round=[r["versions_published"] for r in per_round]))
    rows.append(row("aggregator_replicas", "... max |published - FedAvg of the counted frames|",
                    max(r["max_abs_diff_vs_fedavg"] for r in per_round), "abs", "int8 quantisation step", 2 ** -7,
                    ratio=None))
    write_results("aggregator_replicas", rows)


if __name__ == "__main__":
    main()
