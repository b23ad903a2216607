"""Wyoming servers as processes, driven over loopback TCP by clients that send Home Assistant's
events at real time: what bench/wyoming_latency.py measures of each server (``measure``: a warm-up
stream, then 1, 4 and 8 clients, then ``SETUP_N`` set-ups; detection latency, CPU from /proc,
RSS), the same for ours and the reference.

    >>> out = measure(cmd, port, tmp / "ours.log", "edgelearn wyoming", ["hey jarvis"], True, streams, streams8)
    >>> out["one"]["lat"], out["four"]["cpu_ms_per_s"], out["setup"]["rss_mb"]
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 1024
RATE = 16000
GAP_S = 3.0        # between keywords
LEAD_S = 1.0       # a detection may come this long before its phrase's end (the phrase is ~0.9 s)
CLIENTS = 4
SETUP_N = 32       # connections set up at once to measure set-up CPU
IDLE_S = 5         # listening, no client: the server's own CPU
TICK_HZ = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK_HZ  # utime + stime, every thread


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


async def _client(port: int, pcm: np.ndarray, names, ping: bool, ready, go):
    """Connect, detect, audio-start; once set up (``ping``: the server's pong, else 2 s) say ``ready``
    and wait for ``go`` (the start time), then stream ``pcm`` at real time; returns (send time of
    each chunk, [(recv time, event)])."""
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.client import AsyncTcpClient
    from wyoming.ping import Ping
    from wyoming.wake import Detect

    sent, got = [], []
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Detect(names=names).event())
        await client.write_event(AudioStart(rate=RATE, width=2, channels=1, timestamp=0).event())
        if ping:  # answered after audio-start, so after the connection's detector is built
            await client.write_event(Ping().event())
            while (ev := await client.read_event()) is not None and ev.type != "pong":
                pass
        else:
            await asyncio.sleep(2.0)
        ready()
        t0 = await go

        async def reader():
            while True:
                ev = await client.read_event()
                if ev is None:
                    return
                got.append((time.monotonic(), ev))
                if ev.type in ("not-detected", "pong"):
                    return

        task = asyncio.create_task(reader())
        for i in range(0, len(pcm), CHUNK):
            delay = t0 + i / RATE - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await client.write_event(AudioChunk(rate=RATE, width=2, channels=1, audio=pcm[i:i + CHUNK].tobytes(),
                                                timestamp=int(i * 1000 / RATE)).event())
            sent.append(time.monotonic())
        await client.write_event(AudioStop().event())
        if ping:
            await client.write_event(Ping().event())  # everything of the stream has come once its pong has
        try:
            await asyncio.wait_for(task, 3)
        except asyncio.TimeoutError:
            task.cancel()
    return sent, got


def _score(sent, got, ends):
    """(latencies s, timestamp errors ms, keywords found) of one stream's detections."""
    lat, ts_err, found = [], [], set()
    # when the chunk holding each keyword's last sample was sent
    sent_end = [sent[min(int(e * RATE) // CHUNK, len(sent) - 1)] for e in ends]
    for t_recv, ev in got:
        if ev.type != "detection":
            continue
        # the keyword this detection is of: the latest one whose end was due at most LEAD_S after it
        # arrived, not yet taken. A detector may fire before the phrase's last loud frame is sent
        # ("hey jarv..."): its latency is then negative, not a late detection of the phrase before
        cands = [j for j, s in enumerate(sent_end) if s - LEAD_S <= t_recv < s - LEAD_S + GAP_S and j not in found]
        if not cands:
            continue
        j = cands[-1]
        found.add(j)
        lat.append(t_recv - sent_end[j])
        if ev.data.get("timestamp") is not None:
            ts_err.append(ev.data["timestamp"] - ends[j] * 1000)
    return lat, ts_err, len(found)


def _run(port: int, pid: int, streams, names, ping: bool) -> dict:
    """The streams at once; CPU counted from when every client is set up (its detector built)."""
    cpu = {}

    async def main():
        loop = asyncio.get_running_loop()
        go, n = loop.create_future(), {"ready": 0}
        c_setup, t_setup = _cpu_s(pid), time.monotonic()

        def ready():
            n["ready"] += 1
            if n["ready"] == len(streams):
                cpu["setup"] = _cpu_s(pid) - c_setup
                cpu["setup_wall"] = time.monotonic() - t_setup
                cpu["rss"] = _rss_mb(pid)
                cpu["c0"] = _cpu_s(pid)
                go.set_result(time.monotonic() + 0.2)

        return await asyncio.gather(*(_client(port, pcm, names, ping, ready, go) for pcm, _ in streams))

    results = asyncio.run(main())
    cpu_s = _cpu_s(pid) - cpu["c0"]
    lat, ts_err, found, said = [], [], 0, 0
    for (sent, got), (_, ends) in zip(results, streams):
        a, b, n = _score(sent, got, ends)
        lat += a
        ts_err += b
        found += n
        said += len(ends)
    audio_s = sum(len(p) for p, _ in streams) / RATE
    return {"lat": lat, "ts_err": ts_err, "found": found, "said": said,
            "cpu_ms_per_s": cpu_s / audio_s * 1e3 if audio_s else None, "clients": len(streams),
            "setup_cpu_ms_per_client": cpu["setup"] / len(streams) * 1e3, "setup_wall_s": cpu["setup_wall"],
            "rss_mb": round(cpu["rss"], 1)}


def _start(cmd, port: int, log: Path, env=None, cwd=ROOT) -> subprocess.Popen:
    """The server, its output in ``log`` (a pipe nobody reads would fill and stall it)."""
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[:3]} exited: {log.read_text(errors='replace')[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{cmd[:3]} did not listen on {port}")


def _stop(proc):
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _check_log(log: Path, name: str) -> None:
    """A server that logged a traceback did not run what it was asked to: its figures would be an
    idle server's."""
    text = log.read_text(errors="replace")
    if "Traceback" in text:
        raise RuntimeError(f"{name} failed while streaming, so its figures are not its model's; its log "
                           f"({log}):\n{text[-2000:]}")


def measure(cmd, port: int, log: Path, name: str, names, ping: bool, streams, streams8, cwd=ROOT, env=None) -> dict:
    """One server's runs: a warm-up stream, then 1, 4 and 8 clients streaming, then ``SETUP_N``
    set-ups; {"idle_rss_mb", "warm", "one", "four", "eight", "setup"}."""
    proc = _start(cmd, port, log, env=env, cwd=cwd)
    try:
        out = {"idle_rss_mb": round(_rss_mb(proc.pid), 1)}
        c0 = _cpu_s(proc.pid)
        time.sleep(IDLE_S)
        out["idle_cpu_ms_per_s"] = (_cpu_s(proc.pid) - c0) / IDLE_S * 1e3
        out["warm"] = _run(port, proc.pid, [(p[:5 * RATE], [t for t in e if t < 4.5]) for p, e in streams[:1]],
                           names, ping)
        out["one"] = _run(port, proc.pid, streams[:1], names, ping)
        out["four"] = _run(port, proc.pid, streams[:CLIENTS], names, ping)
        out["eight"] = _run(port, proc.pid, streams8, names, ping)
        out["setup"] = _run(port, proc.pid, [(np.zeros(0, np.int16), [])] * SETUP_N, names, ping)
    finally:
        _stop(proc)
    _check_log(log, name)
    return out
