"""Wyoming wake-word servers over loopback TCP: detection latency and CPU per second of audio.

Ours: ``edgelearn wyoming`` (edge/wyoming.py) with the chirp keyword of tests/devstate_helpers.py
enrolled, on a stream of noise with the keyword said every ``GAP_S`` seconds (so where each keyword
ends is known from how the stream was built). Reference: wyoming-openwakeword (Home Assistant's
openWakeWord add-on, its ``hey_jarvis`` model) in its own virtualenv (``make .venv-wyoming-oww``),
on the same kind of stream with "hey jarvis" said by espeak-ng instead of the chirp (it cannot
detect our chirp; espeak-ng's voice is what this machine can say). Each server runs as its own
process; the client is the ``wyoming`` library's ``AsyncTcpClient``, sending Home Assistant's
events (detect, audio-start, 1,024-sample audio-chunks at real time, audio-stop).

- latency: from the moment the chunk holding the keyword's last sample was sent to the arrival of
  its ``detection`` (p50, p99 over every keyword of every client);
- CPU per second of audio per connected client: the server process's CPU time (all threads,
  /proc) while the streams run, over audio seconds x clients, with 1 and with ``CLIENTS`` clients
  streaming at once;
- the detections found of the keywords said, and ours' timestamp error (``timestamp`` against the
  keyword's true end).

    $ edgelearn bench wyoming_latency
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import row, write_results

ROOT = Path(__file__).resolve().parents[1]
OWW = ROOT / ".venv-wyoming-oww" / "bin" / "python"
CHUNK = 1024
RATE = 16000
SECONDS = 45       # of audio per client stream, sent at real time
GAP_S = 3.0        # between keywords
CLIENTS = 4
TICK_HZ = os.sysconf("SC_CLK_TCK")


def _chirp(i: int, rng) -> np.ndarray:
    """tests/devstate_helpers.make_keyword_clips: a 0.5 s 400->700 Hz chirp between 0.125 s of silence."""
    t = np.arange(8000) / 16000
    f = 400 + 300 * t / t[-1]
    x = np.sin(2 * np.pi * np.cumsum(f) / 16000) * 8000 * (1 + 0.05 * i)
    return (np.r_[np.zeros(2000), x, np.zeros(2000)] + rng.standard_normal(12000) * 50).astype(np.int16)


def _espeak(text: str, tmp: Path) -> np.ndarray | None:
    """``text`` said by espeak-ng at 16 kHz (None without espeak-ng)."""
    if shutil.which("espeak-ng") is None:
        return None
    from edge.audio import read_wav

    out = tmp / "say.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(out), text], check=True, capture_output=True)
    if shutil.which("sox"):
        subprocess.run(["sox", str(out), "-r", "16000", "-c", "1", "-b", "16", str(tmp / "say16.wav")], check=True)
        return read_wav(tmp / "say16.wav")
    raise RuntimeError("sox is needed to resample espeak-ng's 22.05 kHz output")


def _stream(kw: np.ndarray, seconds: float, seed: int, end_in_clip: int) -> tuple[np.ndarray, list[float]]:
    """Noise with ``kw`` every GAP_S s; (pcm, the keywords' true ends in s)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    pcm = rng.standard_normal(n) * 100
    ends, start = [], int(1.0 * RATE)
    while start + len(kw) < n - RATE:
        pcm[start:start + len(kw)] += kw
        ends.append((start + end_in_clip) / RATE)
        start += int(GAP_S * RATE)
    return np.clip(pcm, -32768, 32767).astype(np.int16), ends


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK_HZ  # utime + stime, every thread


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
        # the keyword this detection is of: the latest one fully sent before it arrived, not yet taken
        cands = [j for j, s in enumerate(sent_end) if s <= t_recv and t_recv - s < GAP_S and j not in found]
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
        c_setup = _cpu_s(pid)

        def ready():
            n["ready"] += 1
            if n["ready"] == len(streams):
                cpu["setup"] = _cpu_s(pid) - c_setup
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
            "cpu_ms_per_s": cpu_s / audio_s * 1e3, "clients": len(streams),
            "setup_cpu_ms_per_client": cpu["setup"] / len(streams) * 1e3}


def _start(cmd, port: int, env=None) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[:3]} exited: {proc.stderr.read().decode()[-2000:]}")
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


def _pct(xs, q):
    return round(float(np.percentile(xs, q)) * 1e3, 1) if xs else None


def main():
    from edge.device import Device

    tmp = Path(tempfile.mkdtemp(prefix="wyoming-bench-"))
    rng = np.random.default_rng(1)
    clips = [_chirp(i, rng) for i in range(5)]
    Device(tmp / "st").enroll("hey edge", clips)
    kw = _chirp(0, np.random.default_rng(7))
    ours_streams = [_stream(kw, SECONDS, seed, end_in_clip=10000) for seed in range(CLIENTS)]

    port = _free_port()
    proc = _start([sys.executable, "-m", "edge.cli", "wyoming", "--uri", f"tcp://127.0.0.1:{port}",
                   "--state", str(tmp / "st")], port)
    try:
        _run(port, proc.pid, [(p[:5 * RATE], e) for p, e in ours_streams[:1]], ["hey edge"], True)  # warm-up
        ours1 = _run(port, proc.pid, ours_streams[:1], ["hey edge"], True)
        oursN = _run(port, proc.pid, ours_streams, ["hey edge"], True)
    finally:
        _stop(proc)

    ref1 = refN = None
    ref_note = "not installed (make .venv-wyoming-oww)"
    if OWW.exists():
        said = _espeak("hey jarvis", tmp)
        if said is not None:
            from edge.enroll import speech_bounds

            b = speech_bounds(said)
            end = b[1] if b else len(said)
            ref_streams = [_stream((said.astype(np.float64) * 0.9).astype(np.int16), SECONDS, 100 + s, end)
                           for s in range(CLIENTS)]
        else:
            ref_streams = [_stream(np.zeros(1, np.int16), SECONDS, 100 + s, 1) for s in range(CLIENTS)]
        port = _free_port()
        proc = _start([str(OWW), "-m", "wyoming_openwakeword", "--uri", f"tcp://127.0.0.1:{port}",
                       "--preload-model", "hey_jarvis"], port, env={k: v for k, v in os.environ.items()
                                                                    if k != "PYTHONPATH"})
        try:
            _run(port, proc.pid, [(p[:5 * RATE], e) for p, e in ref_streams[:1]], ["hey_jarvis"], False)  # warm-up
            ref1 = _run(port, proc.pid, ref_streams[:1], ["hey_jarvis"], False)
            refN = _run(port, proc.pid, ref_streams, ["hey_jarvis"], False)
        finally:
            _stop(proc)
        ref_note = "wyoming-openwakeword hey_jarvis (espeak-ng 'hey jarvis')"

    both = lambda r: (r["lat"] if r else [])  # noqa: E731
    lat_ours = ours1["lat"] + oursN["lat"]
    lat_ref = both(ref1) + both(refN)
    rows = [
        row("wyoming_latency", "detection latency after the keyword's end, p50", _pct(lat_ours, 50), "ms",
            ref_note, _pct(lat_ref, 50) if lat_ref else None,
            said=ours1["said"] + oursN["said"], found=ours1["found"] + oursN["found"],
            ref_said=(ref1["said"] + refN["said"]) if ref1 else None,
            ref_found=(ref1["found"] + refN["found"]) if ref1 else None),
        row("wyoming_latency", "detection latency after the keyword's end, p99", _pct(lat_ours, 99), "ms",
            ref_note, _pct(lat_ref, 99) if lat_ref else None),
        row("wyoming_latency", "detection timestamp minus the keyword's true end, median",
            round(float(np.median(ours1["ts_err"] + oursN["ts_err"])), 1) if ours1["ts_err"] else None, "ms",
            None, None),
        row("wyoming_latency", "server CPU per second of audio per client, 1 client", round(ours1["cpu_ms_per_s"], 2),
            "ms", ref_note, round(ref1["cpu_ms_per_s"], 2) if ref1 else None),
        row("wyoming_latency", f"server CPU per second of audio per client, {CLIENTS} clients at once",
            round(oursN["cpu_ms_per_s"], 2), "ms", ref_note, round(refN["cpu_ms_per_s"], 2) if refN else None),
        # over CLIENTS streams set up at once: /proc counts CPU in 10 ms ticks
        row("wyoming_latency", "server CPU to set up one stream (its detector and models)",
            round(oursN["setup_cpu_ms_per_client"], 1), "ms", ref_note,
            round(refN["setup_cpu_ms_per_client"], 1) if refN else None),
    ]
    write_results("wyoming_latency", rows)
    print(json.dumps({"ours": [{k: v for k, v in r.items() if k not in ("lat", "ts_err")} for r in (ours1, oursN)],
                      "ref": [{k: v for k, v in r.items() if k not in ("lat", "ts_err")} for r in (ref1, refN) if r]}))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
