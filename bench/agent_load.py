"""The agent's detection path with and without a training run in progress on the same cores.

``edgelearn device run``'s loop (``edge.agent.Agent``) is fed 60 s of audio at real time, in 0.1 s
chunks as a microphone delivers them, twice: alone (the reference), and while a training run
(``edgelearn device adapt --force --strategy full``, the heaviest strategy, at ``nice`` 10 as the
agent starts it) runs back to back on the same machine. Per chunk: the latency from the chunk's
arrival to the end of its processing (p50, p99), the agent's lag behind real time at the worst
moment (a microphone ring buffer of 0.5 s drops audio beyond that), and the agent process's CPU per
second of audio once its models are loaded (the training child is a separate process). Then one hour of audio fed as fast as
the agent takes it: its resident memory after the first 5 minutes and at the end (flat means no
leak). Writes ``bench/results/agent_load.json``.

    $ edgelearn bench agent_load
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import row, write_results

CHUNK = 1600
SECONDS = 60
MIC_BUFFER_S = 0.5


def _labelled_data(root: Path, km, per_label: int = 3) -> Path:
    """A few clips per command label (noise-like, enough for the trainer to have work)."""
    from edge.audio import write_wav

    rng = np.random.default_rng(0)
    for lab in [w for w in km.labels if not w.startswith("_")][:10] + ["_unknown_", "_silence_"]:
        d = root / lab
        d.mkdir(parents=True)
        for i in range(per_label):
            write_wav(d / f"{i}.wav", (rng.standard_normal(16000) * 3000).astype(np.int16))
    return root


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _paced(pcm, stats):
    """Yield 0.1 s chunks at real time; record each chunk's processing latency and the lag."""
    t0 = time.monotonic()
    prev = None
    stats["cpu0"] = _cpu()  # from the first chunk on: the models are loaded by then
    for i in range(0, len(pcm) - CHUNK + 1, CHUNK):
        due = t0 + i / 16000
        now = time.monotonic()
        if prev is not None:
            stats["latency"].append(now - prev)
            stats["lag"] = max(stats["lag"], now - due)
        if now < due:
            time.sleep(due - now)
        prev = max(time.monotonic(), due)  # the chunk "arrives" at its time, or now when late
        yield pcm[i:i + CHUNK]
    if prev is not None:
        stats["latency"].append(time.monotonic() - prev)
    stats["cpu1"] = _cpu()


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_paced(state: Path, pcm) -> dict:
    from edge.agent import Agent, AgentConfig

    stats = {"latency": [], "lag": 0.0}
    agent = Agent(state, AgentConfig(source=_paced(pcm, stats), status_every_s=10.0), out=open(os.devnull, "w"))
    agent.run()
    cpu = stats["cpu1"] - stats["cpu0"]
    lat = np.array(stats["latency"]) * 1e3
    return {"p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "max_lag_s": float(stats["lag"]), "cpu_ms_per_s": cpu / (len(pcm) / 16000) * 1e3}


def trainer_loop(state: Path, data: Path, stop: Path) -> subprocess.Popen:
    """Back-to-back `device adapt --force --strategy full` runs at nice 10 until ``stop`` exists."""
    cmd = (f"while [ ! -e {stop} ]; do {sys.executable} -m edge.cli device adapt --state {state} "
           f"--data {data} --strategy full --steps 400 --force > /dev/null 2>&1; echo run >> {state}/runs; done")
    return subprocess.Popen(["nice", "-n", "10", "bash", "-c", cmd])


def main():
    from edge.device import Device

    tmp = Path(tempfile.mkdtemp(prefix="agent_load-"))
    rows = []
    try:
        rng = np.random.default_rng(1)
        pcm = (rng.standard_normal(16000 * SECONDS) * 2000).astype(np.int16)
        km = Device(tmp / "probe").keyword_model()
        data = _labelled_data(tmp / "data", km)

        alone = run_paced(tmp / "alone", pcm)
        stop = tmp / "stop"
        trainer = trainer_loop(tmp / "train", data, stop)
        try:
            time.sleep(5)  # the first run is past its start-up (bundle load, feature cache)
            busy = run_paced(tmp / "busy", pcm)
        finally:
            stop.touch()
            trainer.wait()
        runs = len((tmp / "train" / "runs").read_text().split()) if (tmp / "train" / "runs").exists() else 0
        for key, metric, unit in (("p50_ms", "chunk latency p50", "ms"), ("p99_ms", "chunk latency p99", "ms"),
                                  ("max_lag_s", "worst lag behind real time", "s"),
                                  ("cpu_ms_per_s", "agent CPU per second of audio", "ms/s")):
            rows.append(row("agent_load", f"{metric}, training run in progress", round(busy[key], 3), unit,
                            baseline="the same agent, no training", baseline_value=round(alone[key], 3),
                            training_runs=runs, audio_s=SECONDS))
        rows.append(row("agent_load", "audio dropped by a 0.5 s microphone buffer, training run in progress",
                        int(busy["max_lag_s"] > MIC_BUFFER_S), "bool", baseline="no training",
                        baseline_value=int(alone["max_lag_s"] > MIC_BUFFER_S), ratio=None))

        # an hour of audio as fast as the agent takes it: resident memory at 5 minutes and at the end
        from edge.agent import Agent, AgentConfig

        marks = {}

        def hour():
            for i in range(0, 3600 * 16000, CHUNK):
                if i == 300 * 16000:
                    marks["5min"] = _rss_mb()
                yield pcm[i % len(pcm): i % len(pcm) + CHUNK]
            marks["end"] = _rss_mb()

        t = time.monotonic()
        Agent(tmp / "hour", AgentConfig(source=hour(), status_every_s=60.0), out=open(os.devnull, "w")).run()
        rows.append(row("agent_load", "agent RSS after 1 h of audio (fed faster than real time)",
                        round(marks["end"], 1), "MiB", baseline="RSS after the first 5 minutes",
                        baseline_value=round(marks["5min"], 1), ratio=None,
                        wall_s=round(time.monotonic() - t, 1)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_results("agent_load", rows)


if __name__ == "__main__":
    main()
