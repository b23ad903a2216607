"""End-to-end HTTP ingest of 10k-parameter int8 updates, and aggregator memory vs number of clients.

Ours: ``edgelearn aggregator serve`` (uvicorn with uvloop + httptools when
installed, one process) on loopback, with group commit (one SQLite transaction
and fsync for every update the event loop staged meanwhile; an update is
acknowledged only after its transaction committed), fed by an asyncio load
generator over 64 keep-alive connections (the benchmark's own process, so
server and client each get one of the 2 cores). Reference, same frames:
``RoundManager.submit`` called in-process (no HTTP), one commit per update: the
cost of the checks, decode, SQLite commit and running sum alone. Memory:
server RSS after each quarter of the updates; the running sum is O(model),
frames live in SQLite.

    $ edgelearn bench aggregator_ingest
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import row, write_results  # noqa: E402

N_PARAMS = 10_000
N_UPDATES = 6000


def _setup(d: Path, n: int, synchronous: str):
    from edge.portable.wire import INT8, Header
    from host.aggregator.app import Aggregator
    from host.aggregator.config import AggregatorConfig
    from host.aggregator.inprocess import make_state
    from host.wire_numpy import encode_update

    params = {"w": np.zeros((100, 100), np.float32)}
    state, keys = make_state(d, AggregatorConfig(clients_per_round=10**6, overselect=1.0, round_timeout=10**6,
                                                 max_concurrency=10**6, max_rounds_per_window=10**6,
                                                 synchronous=synchronous), n_devices=n, params=params)
    agg = Aggregator(state)
    rng = np.random.default_rng(0)
    frames = []
    for dev, key in keys.items():
        t = agg.rounds.checkin(dev, {"battery": 1.0, "charging": True})["task"]
        frames.append((dev, encode_update(Header(dev, t["round_id"], t["model_version"], 1, 10),
                                          [("w", (rng.standard_normal((100, 100)) * 0.01).astype(np.float32))],
                                          key, codec=INT8)))
    agg.close()
    return state, frames


async def _load(port, frames, conns=64):
    async def worker(items, out):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        for dev, f in items:
            w.write(b"POST /v1/updates HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
                    b"X-Edgelearn-Device: " + dev.encode() + b"\r\nContent-Length: " + str(len(f)).encode() +
                    b"\r\n\r\n" + f)
            await w.drain()
            status = int((await r.readline()).split()[1])
            length = 0
            while (line := await r.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await r.readexactly(length)
            out.append(status)
        w.close()
    out = []
    await asyncio.gather(*(worker(frames[i::conns], out) for i in range(conns)))
    return out


def _run(coro):
    try:
        import uvloop
        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def _status(port) -> dict:
    import http.client
    import json
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/v1/status")
    return json.loads(c.getresponse().read())


def _cpu(pid) -> float:
    """CPU seconds (user + system) a process has used."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _rss(pid) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _serve(state, port, *extra):
    """`aggregator serve` (``extra``: more options, e.g. ``--db URL``), once it answers /v1/status."""
    import http.client

    p = subprocess.Popen([sys.executable, "-m", "edge.cli", "aggregator", "serve", "--state", str(state),
                          "--port", str(port), *map(str, extra)], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    for _ in range(1200):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/v1/status")
            c.getresponse().read()
            return p
        except OSError:
            if p.poll() is not None:
                raise RuntimeError(f"aggregator exited: {p.stderr.read().decode()[-2000:]}") from None
            time.sleep(0.05)
    p.kill()
    raise RuntimeError("aggregator did not start")


def _stack() -> str:
    import importlib.util
    have = [m for m in ("uvloop", "httptools") if importlib.util.find_spec(m)]
    return "uvicorn" + (" + " + " + ".join(have) if have else " (asyncio, h11)")


def main():
    rows = []
    for sync in ("full", "normal"):
        with tempfile.TemporaryDirectory() as td:
            state, frames = _setup(Path(td), N_UPDATES, sync)
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            p = _serve(state, port)
            try:
                rss, done, t_total, rates, cpu_srv, cpu_cli = [], 0, 0.0, [], 0.0, 0.0
                for k in range(0, N_UPDATES, N_UPDATES // 4):
                    batch = frames[k:k + N_UPDATES // 4]
                    t, c_srv, c_cli = time.perf_counter(), _cpu(p.pid), time.process_time()
                    st = _run(_load(port, batch))
                    dt = time.perf_counter() - t
                    assert all(x == 200 for x in st), set(st)
                    rates.append(round(len(batch) / dt, 1))
                    if k:  # the first quarter is the warm-up (a fresh process, cold caches)
                        t_total += dt
                        done += len(batch)
                        cpu_srv += _cpu(p.pid) - c_srv
                        cpu_cli += time.process_time() - c_cli
                    rss.append((k + len(batch), _rss(p.pid)))
                gc = _status(port)["group_commit"]
            finally:
                p.send_signal(signal.SIGTERM)
                p.wait()
            http_rate = done / t_total  # quarters 2-4
        with tempfile.TemporaryDirectory() as td:
            from host.aggregator.app import Aggregator
            state, frames2 = _setup(Path(td), 2000, sync)
            agg = Aggregator(state)
            t = time.perf_counter()
            for dev, f in frames2:
                agg.rounds.submit(f, dev)
            direct = len(frames2) / (time.perf_counter() - t)
            agg.close()
        rows.append(row("aggregator_ingest", f"HTTP ingest of 10k-param INT8 updates (sqlite synchronous={sync})",
                        round(http_rate, 1), "updates/s", "in-process submit(), one commit per update (no HTTP)", round(direct, 1),
                        ratio=http_rate / direct, goal=2000, frame_bytes=len(frames[0][1]),
                        mean_batch=round(gc["updates"] / max(1, gc["batches"]), 1), server=_stack(),
                        rate_per_quarter=rates, note="value: quarters 2-4; the first is the warm-up",
                        server_cpu_us_per_update=round(1e6 * cpu_srv / done, 1),
                        server_core_busy=round(cpu_srv / t_total, 3), loadgen_core_busy=round(cpu_cli / t_total, 3)))
        rows.append(row("aggregator_ingest", f"server RSS growth from {rss[0][0]} to {rss[-1][0]} clients "
                        f"(synchronous={sync})", round(rss[-1][1] - rss[0][1], 2), "MiB",
                        f"RSS at {rss[0][0]} clients", round(rss[0][1], 1), rss_curve=rss))
    write_results("aggregator_ingest", rows)


if __name__ == "__main__":
    main()
