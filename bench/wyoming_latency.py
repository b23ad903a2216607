"""Wyoming wake-word servers over loopback TCP: detection latency and CPU per second of audio.

Both servers get the same streams: noise with espeak-ng saying "hey jarvis" every ``GAP_S``
seconds (so where each phrase ends is known from how the stream was built). Ours: ``edgelearn
wyoming`` (edge/wyoming.py) with "hey jarvis" enrolled from five *other* espeak-ng renders (other
rates and pitches), as a user enrols from a few recordings. Reference: wyoming-openwakeword (Home
Assistant's openWakeWord add-on, its released ``hey_jarvis`` model) in its own virtualenv (``make
.venv-wyoming-oww``). Each server runs as its own process (its log in a file: a reference that
fails to run its model, as wyoming-openwakeword 1.8.2 did under numpy 2, stops the bench with its
log instead of being measured idle); the client is the ``wyoming`` library's ``AsyncTcpClient``,
sending Home Assistant's events (detect, audio-start, 1,024-sample audio-chunks at real time,
audio-stop).

- latency: from the moment the chunk holding the phrase's last sample was sent to the arrival of
  its ``detection`` (p50, p99 over every phrase of every client);
- CPU per second of audio per connected client: the server process's CPU time (all threads,
  /proc) while the streams run, over audio seconds x clients, with 1 and with ``CLIENTS`` clients
  streaming at once;
- the detections found of the phrases said, and ours' timestamp error (``timestamp`` against the
  phrase's true end).

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


PHRASE = "hey jarvis"
SAY = (150, 50)                                            # espeak-ng rate (wpm) and pitch of the streams
ENROL = ((135, 40), (145, 60), (160, 45), (170, 55), (140, 50))  # the five renders ours enrols from


def _espeak(text: str, tmp: Path, rate: int = 150, pitch: int = 50) -> np.ndarray:
    """``text`` said by espeak-ng (en-us) at 16 kHz."""
    from edge.audio import read_wav

    for tool in ("espeak-ng", "sox"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is needed (espeak-ng says the phrase, sox resamples its 22.05 kHz output)")
    out, out16 = tmp / "say.wav", tmp / "say16.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", str(rate), "-p", str(pitch), "-w", str(out), text],
                   check=True, capture_output=True)
    subprocess.run(["sox", str(out), "-r", "16000", "-c", "1", "-b", "16", str(out16)], check=True)
    return read_wav(out16)


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


def _start(cmd, port: int, log: Path, env=None) -> subprocess.Popen:
    """The server, its output in ``log`` (a pipe nobody reads would fill and stall it)."""
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
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


def _pct(xs, q):
    return round(float(np.percentile(xs, q)) * 1e3, 1) if xs else None


def main():
    from edge.device import Device

    tmp = Path(tempfile.mkdtemp(prefix="wyoming-bench-"))
    said = _espeak(PHRASE, tmp, *SAY)
    Device(tmp / "st").enroll(PHRASE, [_espeak(PHRASE, tmp, r, p) for r, p in ENROL])
    from edge import features as F
    from edge.enroll import speech_bounds

    b = speech_bounds(said)  # frames: the phrase ends with its last loud frame's last sample
    end = b[1] * F.HOP_LENGTH + F.FRAME_LENGTH if b else len(said)
    streams = [_stream((said.astype(np.float64) * 0.9).astype(np.int16), SECONDS, 100 + s, end)
               for s in range(CLIENTS)]
    warm = [(p[:5 * RATE], e) for p, e in streams[:1]]

    port, log = _free_port(), tmp / "ours.log"
    proc = _start([sys.executable, "-m", "edge.cli", "wyoming", "--uri", f"tcp://127.0.0.1:{port}",
                   "--state", str(tmp / "st")], port, log)
    try:
        _run(port, proc.pid, warm, [PHRASE], True)  # warm-up
        ours1 = _run(port, proc.pid, streams[:1], [PHRASE], True)
        oursN = _run(port, proc.pid, streams, [PHRASE], True)
    finally:
        _stop(proc)
    _check_log(log, "edgelearn wyoming")

    ref1 = refN = None
    ref_note = "not installed (make .venv-wyoming-oww)"
    if OWW.exists():
        port, log = _free_port(), tmp / "reference.log"
        proc = _start([str(OWW), "-m", "wyoming_openwakeword", "--uri", f"tcp://127.0.0.1:{port}",
                       "--preload-model", "hey_jarvis"], port, log,
                      env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        try:
            _run(port, proc.pid, warm, ["hey_jarvis"], False)  # warm-up
            ref1 = _run(port, proc.pid, streams[:1], ["hey_jarvis"], False)
            refN = _run(port, proc.pid, streams, ["hey_jarvis"], False)
        finally:
            _stop(proc)
        _check_log(log, "wyoming-openwakeword")
        ref_note = "wyoming-openwakeword hey_jarvis (same streams)"

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
