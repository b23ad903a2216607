"""Wyoming wake-word servers over loopback TCP: detection latency, CPU, set-up and memory per client.

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
  its ``detection`` (p50, p99 over every phrase of the 1- and 4-client runs; and of the 8-client run);
  negative when a detector fires before the phrase's last loud frame was sent (a detection up to
  ``LEAD_S`` early is the phrase's; until 2026-12-05 an early one was taken for the phrase before);
- CPU per second of audio per connected client: the server process's CPU time (all threads,
  /proc) while the streams run, over audio seconds x clients, with 1, 4 and 8 clients at once;
- set-up CPU per stream: ``SETUP_N`` connections at once, each detect + audio-start (ours: until
  the pong of a ping sent after it, so its detector exists; the reference answers no ping: 2 s),
  the server's CPU over that beyond its idle CPU, per connection (/proc counts 10 ms ticks: 0.3 ms
  per connection);
- RSS with N connections: the server's VmRSS once N clients are set up (N = 1, 4, 8, after a
  warm-up stream; the high-water mark of what ran before is in it, as for any long-running server);
- the detections found of the phrases said, and ours' timestamp error (``timestamp`` against the
  phrase's true end);
- why a lock and not an interpreter per thread (edge/wyoming.py ``ModelSet``), in this process: 8
  streams pushed from 8 threads at real time through one shared model set (its lock) and through
  a set each (no lock, what a pool or per-thread interpreters would be): CPU per second of audio,
  the pushes that found the lock held and the time they waited, and the memory and CPU a set takes
  to load. The events of both must be the same.

The servers are driven and measured by ``bench/_wyoming_clients.py`` (``measure``).

    $ edgelearn bench wyoming_latency
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# driving the servers (clients, /proc counters, the server process) has a module of its own
from bench._wyoming_clients import CHUNK, CLIENTS, GAP_S, RATE, ROOT, SETUP_N, _rss_mb, measure
from bench.common import row, write_results
from host.netutil import free_port as _free_port

OWW = ROOT / ".venv-wyoming-oww" / "bin" / "python"
SECONDS = 45       # of audio per client stream, sent at real time (1 and 4 clients)
SECONDS_8 = 30     # with 8 clients (a rate: 30 s is plenty, and keeps the bench under ~6 min)
MANY = 8
LOCK_S = 10        # seconds of audio per thread in the lock experiment (each of 4 passes)


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


def _pct(xs, q):
    return round(float(np.percentile(xs, q)) * 1e3, 1) if xs else None



def lock_choice(state: Path, streams) -> dict:
    """In this process: ``MANY`` streams pushed from as many threads at real time (1,024-sample
    chunks every 64 ms) through one shared ``ModelSet`` under its lock, and through a set each
    without one (per-thread or pooled interpreters); CPU per second of audio, waits, load cost."""
    import resource
    import threading

    from edge.device import Device
    from edge.wyoming import ModelSet, WakeServer

    pcm = [p[:LOCK_S * RATE] for p, _ in streams]

    def pushed(sets):
        """Each thread its own detector of ``sets[i]``, every thread's chunks due at the same
        moments (the worst case for a lock); (events per stream, the process's CPU s, how late
        each push returned after its chunk was due, s)."""
        got, late = [None] * len(pcm), [[] for _ in pcm]
        go = threading.Barrier(len(pcm) + 1)
        t0 = []

        def worker(i):
            ms = sets[i]
            det, evs = ms.detector(), []
            go.wait()
            for j in range(0, len(pcm[i]), CHUNK):
                due = t0[0] + (j + CHUNK) / RATE  # the chunk's last sample has arrived
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                evs += ms.push(det, pcm[i][j:j + CHUNK])
                late[i].append(time.monotonic() - due)
            got[i] = [(e["keyword"], e["time_s"]) for e in evs + ms.flush(det)]

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(pcm))]
        for t in threads:
            t.start()
        t0.append(time.monotonic() + 0.05)
        c0 = time.process_time()
        go.wait()
        for t in threads:
            t.join()
        return got, time.process_time() - c0, [x for xs in late for x in xs]

    srv = WakeServer(Device(state), "tcp://127.0.0.1:0")
    shared = srv.model_set([PHRASE])
    rss0, c0 = _rss_mb(os.getpid()), time.process_time()
    own = [ModelSet(Device(state).detector(keywords=[], enrolled=[PHRASE], replay=False)[0]) for _ in pcm]
    load_cpu = (time.process_time() - c0) / len(pcm)
    load_mb = (_rss_mb(os.getpid()) - rss0) / len(pcm)
    res = {"own": [0.0, [], None], "shared": [0.0, [], None]}
    for which in ("own", "shared", "shared", "own"):  # ABBA: the machine is shared, its load drifts
        evs, cpu, late = pushed(own if which == "own" else [shared] * len(pcm))
        res[which][0] += cpu / 2
        res[which][1] += late
        res[which][2] = evs
    if res["shared"][2] != res["own"][2]:
        raise RuntimeError(f"the shared models under the lock gave other events than a set each: "
                           f"{res['shared'][2]} vs {res['own'][2]}")
    audio_s = sum(len(p) for p in pcm) / RATE
    pct = lambda xs, q: float(np.percentile(xs, q)) * 1e3  # noqa: E731
    return {"streams": len(pcm), "audio_s": audio_s, "events": sum(map(len, res["shared"][2])),
            "cpu_ms_per_s_shared": res["shared"][0] / audio_s * 1e3, "cpu_ms_per_s_own": res["own"][0] / audio_s * 1e3,
            "late_p50_ms_shared": pct(res["shared"][1], 50), "late_p99_ms_shared": pct(res["shared"][1], 99),
            "late_p50_ms_own": pct(res["own"][1], 50), "late_p99_ms_own": pct(res["own"][1], 99),
            "pushes": shared.pushes, "waits": shared.waits, "wait_ms_total": shared.wait_s * 1e3,
            "load_cpu_ms": load_cpu * 1e3, "load_mb": load_mb}


def main():
    from edge.device import Device

    tmp = Path(tempfile.mkdtemp(prefix="wyoming-bench-"))
    said = _espeak(PHRASE, tmp, *SAY)
    Device(tmp / "st").enroll(PHRASE, [_espeak(PHRASE, tmp, r, p) for r, p in ENROL])
    from edge import features as F
    from edge.enroll import speech_bounds

    b = speech_bounds(said)  # frames: the phrase ends with its last loud frame's last sample
    end = b[1] * F.HOP_LENGTH + F.FRAME_LENGTH if b else len(said)
    kw = (said.astype(np.float64) * 0.9).astype(np.int16)
    streams = [_stream(kw, SECONDS, 100 + s, end) for s in range(CLIENTS)]
    streams8 = [_stream(kw, SECONDS_8, 200 + s, end) for s in range(MANY)]

    lock = lock_choice(tmp / "st", streams8)
    port = _free_port()
    ours = measure([sys.executable, "-m", "edge.cli", "wyoming", "--uri", f"tcp://127.0.0.1:{port}",
                    "--state", str(tmp / "st")], port, tmp / "ours.log", "edgelearn wyoming", [PHRASE], True,
                   streams, streams8)
    ref = None
    ref_note = "not installed (make .venv-wyoming-oww)"
    if OWW.exists():
        port = _free_port()
        ref = measure([str(OWW), "-m", "wyoming_openwakeword", "--uri", f"tcp://127.0.0.1:{port}",
                       "--preload-model", "hey_jarvis"], port, tmp / "reference.log", "wyoming-openwakeword",
                      ["hey_jarvis"], False, streams, streams8,
                      env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        ref_note = "wyoming-openwakeword hey_jarvis (same streams)"
    write_results("wyoming_latency", rows(ours, ref, ref_note, lock))
    keep = lambda r: {k: v for k, v in r.items() if k not in ("lat", "ts_err")}  # noqa: E731
    print(json.dumps({"ours": {k: keep(v) if isinstance(v, dict) else v for k, v in ours.items()},
                      "ref": {k: keep(v) if isinstance(v, dict) else v for k, v in ref.items()} if ref else None,
                      "lock": lock}))
    shutil.rmtree(tmp, ignore_errors=True)


def rows(ours: dict, ref: dict | None, ref_note: str, lock: dict | None) -> list[dict]:
    def rnd(v, n):
        return None if v is None else round(v, n)

    lat_ours = ours["one"]["lat"] + ours["four"]["lat"]
    lat_ref = (ref["one"]["lat"] + ref["four"]["lat"]) if ref else []
    out = [
        row("wyoming_latency", "detection latency after the keyword's end, p50", _pct(lat_ours, 50), "ms",
            ref_note, _pct(lat_ref, 50) if lat_ref else None,
            said=ours["one"]["said"] + ours["four"]["said"], found=ours["one"]["found"] + ours["four"]["found"],
            ref_said=(ref["one"]["said"] + ref["four"]["said"]) if ref else None,
            ref_found=(ref["one"]["found"] + ref["four"]["found"]) if ref else None),
        row("wyoming_latency", "detection latency after the keyword's end, p99", _pct(lat_ours, 99), "ms",
            ref_note, _pct(lat_ref, 99) if lat_ref else None),
        row("wyoming_latency", f"detection latency after the keyword's end, p50, {MANY} clients at once",
            _pct(ours["eight"]["lat"], 50), "ms", ref_note, _pct(ref["eight"]["lat"], 50) if ref else None,
            said=ours["eight"]["said"], found=ours["eight"]["found"],
            ref_said=ref["eight"]["said"] if ref else None, ref_found=ref["eight"]["found"] if ref else None),
        row("wyoming_latency", f"detection latency after the keyword's end, p99, {MANY} clients at once",
            _pct(ours["eight"]["lat"], 99), "ms", ref_note, _pct(ref["eight"]["lat"], 99) if ref else None),
        row("wyoming_latency", "detection timestamp minus the keyword's true end, median",
            round(float(np.median(ours["one"]["ts_err"] + ours["four"]["ts_err"])), 1)
            if ours["one"]["ts_err"] else None, "ms", None, None),
    ]
    for key, n in (("one", 1), ("four", CLIENTS), ("eight", MANY)):
        label = "1 client" if n == 1 else f"{n} clients at once"
        out.append(row("wyoming_latency", f"server CPU per second of audio per client, {label}",
                       rnd(ours[key]["cpu_ms_per_s"], 2), "ms", ref_note,
                       rnd(ref[key]["cpu_ms_per_s"], 2) if ref else None))

    def setup(r):  # beyond what the server burns idle over the same time (the reference polls)
        su = r["setup"]
        return su["setup_cpu_ms_per_client"] - r["idle_cpu_ms_per_s"] * su["setup_wall_s"] / su["clients"]

    out.append(row("wyoming_latency", f"server CPU to set up one stream ({SETUP_N} at once, models loaded; "
                   "beyond its idle CPU)", rnd(setup(ours), 2), "ms", ref_note, rnd(setup(ref), 2) if ref else None,
                   raw=rnd(ours["setup"]["setup_cpu_ms_per_client"], 2),
                   ref_raw=rnd(ref["setup"]["setup_cpu_ms_per_client"], 2) if ref else None))
    out.append(row("wyoming_latency", "server CPU per second, listening, no client", rnd(ours["idle_cpu_ms_per_s"], 2),
                   "ms", ref_note, rnd(ref["idle_cpu_ms_per_s"], 2) if ref else None))
    out.append(row("wyoming_latency", "server RSS, listening, before any client", ours["idle_rss_mb"], "MB",
                   ref_note, ref["idle_rss_mb"] if ref else None))
    for key, n in (("one", 1), ("four", CLIENTS), ("eight", MANY), ("setup", SETUP_N)):
        out.append(row("wyoming_latency", f"server RSS with {n} connection{'s' if n > 1 else ''} set up",
                       ours[key]["rss_mb"], "MB", ref_note, ref[key]["rss_mb"] if ref else None))
    if lock is not None:
        note = (f"a model set per stream, no shared lock (as a pool or per-thread interpreters; "
                f"{lock['streams']} threads)")
        title = f"{lock['streams']} streams from as many threads at real time through one shared model set (its lock)"
        out += [
            row("wyoming_latency", f"{title}: CPU per second of audio per stream", rnd(lock["cpu_ms_per_s_shared"], 2),
                "ms", note, rnd(lock["cpu_ms_per_s_own"], 2), events=lock["events"]),
            row("wyoming_latency", f"{title}: a push returns after its chunk is due, p50",
                rnd(lock["late_p50_ms_shared"], 3), "ms", note, rnd(lock["late_p50_ms_own"], 3)),
            row("wyoming_latency", f"{title}: a push returns after its chunk is due, p99",
                rnd(lock["late_p99_ms_shared"], 3), "ms", note, rnd(lock["late_p99_ms_own"], 3)),
            row("wyoming_latency", "pushes that found the shared set's lock held (every thread's chunk due at once)",
                lock["waits"], "pushes", None, None, of=lock["pushes"], wait_ms_total=rnd(lock["wait_ms_total"], 3)),
            row("wyoming_latency", "loading one model set (what a set per thread repeats): CPU",
                rnd(lock["load_cpu_ms"], 2), "ms", None, None),
            row("wyoming_latency", "loading one model set: RSS", rnd(lock["load_mb"], 2), "MB", None, None),
        ]
    return out


if __name__ == "__main__":
    main()
