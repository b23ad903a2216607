"""Helpers of the agent tests (tests/test_agent.py, tests/test_agent_fleet.py): the audio stream that
says the enrolled test keyword (a voiced buzz), the trusted-keys directory a federated device verifies versions
with, known inputs for the health check, a sysfs tree on battery, a free loopback port, signed versions."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
from devstate_helpers import make_keyword_clips

from edge.audio import read_wav, write_wav
from host.netutil import free_port

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "edge.cli"]


def stream(tmp: Path, copies: int = 1, seed: int = 5) -> np.ndarray:
    """Noise with the enrolled buzz keyword said three times, ``copies`` times over."""
    clips = make_keyword_clips(tmp / "kwclips")
    rng = np.random.default_rng(seed)
    kw = read_wav(clips[0])
    noise = lambda n: rng.standard_normal(n) * 100  # noqa: E731
    one = np.concatenate([noise(16000), kw, noise(40000), kw, noise(30000), kw, noise(16000)])
    return np.tile(one, copies).astype(np.int16)


def trusted_keys(agg_state: Path, out: Path) -> Path:
    """What /etc/edgelearn/keys holds on a Pi: the release key and the federation's signing key."""
    out.mkdir(parents=True, exist_ok=True)
    for pub in [ROOT / "models" / "keys" / "release.pub", *(Path(agg_state) / "keys").glob("*.pub")]:
        shutil.copy(pub, out / pub.name)
    return out


def make_silence_data(root: Path, n: int = 3, seed: int = 0) -> Path:
    """Labelled clips the shipped model names right: quiet and loud noise in ``_silence_/`` (the
    health check's known inputs; a version that names them otherwise is broken)."""
    rng = np.random.default_rng(seed)
    d = root / "_silence_"
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        write_wav(d / f"{i}.wav", (rng.standard_normal(16000) * (30, 300, 3000)[i % 3]).astype(np.int16))
    return root


def make_battery_sysfs(root: Path, pct: int = 40) -> Path:
    """A board on battery (``pct`` %, discharging, 40 C): the adaptation scheduler waits (below its
    50 %), while an aggregator with ``min_battery`` below ``pct`` lets it join rounds."""
    bat = root / "sys/class/power_supply/BAT0"
    bat.mkdir(parents=True, exist_ok=True)
    (bat / "type").write_text("Battery\n")
    (bat / "capacity").write_text(f"{pct}\n")
    (bat / "status").write_text("Discharging\n")
    tz = root / "sys/class/thermal/thermal_zone0"
    tz.mkdir(parents=True, exist_ok=True)
    (tz / "temp").write_text("40000\n")
    return root


def signed_version(tmp: Path, version: int, broken: bool, agg_state: Path) -> Path:
    """The shipped bundle as federated version ``version``, signed with the aggregator's key; when
    ``broken``, its keyword model is another network (the backbone file in the encoder's place),
    which does not run on the health check's inputs."""
    from host.bundle import sign_bundle

    b = tmp / f"v{version}{'-broken' if broken else ''}"
    if b.exists():
        return b
    shutil.copytree(ROOT / "models" / "kws-dscnn-s", b)
    (b / "manifest.sig").unlink()
    m = json.loads((b / "manifest.json").read_text())
    m["version"] = version
    if broken:
        shutil.copy(b / "backbone_int8.tflite", b / "encoder_int8.tflite")
        raw = (b / "encoder_int8.tflite").read_bytes()
        m["files"]["encoder_int8.tflite"] = {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    (b / "manifest.json").write_text(json.dumps(m))
    sign_bundle(b, next((Path(agg_state) / "keys").glob("*.key")))
    return b


def federate(state, pcm, data, agg):
    """One real round with the aggregator ``agg`` (its fixture: url, key, trusted): an agent on
    ``state`` without local adaptation streams ``pcm`` until it joined a round and runs the version
    the federation published. Returns (the agent, the bundle version it ran at each chunk)."""
    import time

    from edge.agent import Agent, AgentConfig
    from edge.device import CHUNK

    # no local adaptation: an adapted conv tail, when its run happened to finish first, is what
    # detection runs instead of the federated head (it raced before)
    cfg = AgentConfig(source=None, data=data, aggregator=agg["url"], device_id="pi-0", device_key=agg["key"],
                      checkin_every_s=0.05, status_every_s=0, adapt=False)
    versions = []

    def audio():
        t0, i = time.monotonic(), 0
        while time.monotonic() - t0 < 300:
            yield pcm[i % len(pcm): i % len(pcm) + CHUNK]
            i += CHUNK
            versions.append(agent.device.bundle.version)
            if agent.status["rounds_joined"] >= 1 and versions[-1] > versions[0]:
                return
            time.sleep(0.005)

    cfg.source = audio()
    agent = Agent(state, cfg, trusted_keys=agg["trusted"])
    agent._emit = lambda ev: None
    agent.run()
    return agent, versions


def adapting_agent(state, pcm, data, sysfs, stderr=None):
    """`edgelearn device run --stdin` on ``state`` (its own session, so a signal can reach the agent
    and its training child together), fed ``pcm`` until its adaptation child runs; the caller stops it."""
    import os
    import subprocess
    import time

    from edge.agent import read_status
    from edge.device import CHUNK

    p = subprocess.Popen(CLI + ["device", "run", "--state", str(state), "--stdin", "--data", str(data),
                                "--adapt-every", "0", "--sysfs-root", str(sysfs)],
                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL if stderr is None else stderr, cwd=ROOT, start_new_session=True)
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 300:
            p.stdin.write(pcm[:CHUNK].tobytes())
            p.stdin.flush()
            st = read_status(state)
            if st and st.get("adapting"):
                break
            time.sleep(0.01)
        assert read_status(state)["adapting"]
    except BaseException:
        os.killpg(p.pid, 9)
        p.wait()
        raise
    return p


def run_refused_agent(state: Path, aggregator: dict, key_file, pcm: np.ndarray, chunks: int = 80, mid_at: int = 70):
    """The agent on ``state`` against ``aggregator`` (tests/test_agent.py's fixture) with ``key_file``,
    on a simulated clock (one second per ``pcm`` chunk, each check-in awaited), ``chunks`` chunks:
    (the agent after its run, the clock times of its check-ins, agent.json at chunk ``mid_at``). For
    the tests of a key the aggregator refuses (a wrong one, a revoked one): the check-ins back off."""
    from edge.agent import Agent, AgentConfig, read_status

    now, tries, seen = [0.0], [], {}

    def audio():
        for i in range(chunks):
            yield pcm
            if agent._fl_thread is not None:
                agent._fl_thread.join(120)
            now[0] += 1.0
            if i == mid_at:
                seen["mid"] = read_status(state)

    agent = Agent(state, AgentConfig(source=audio(), aggregator=aggregator["url"], device_id="pi-0",
                                     device_key=key_file, checkin_every_s=1, status_every_s=0, adapt=False),
                  trusted_keys=aggregator["trusted"], clock=lambda: now[0])
    round_ = agent._round
    agent._round = lambda: (tries.append(now[0]), round_())
    agent._emit = lambda ev: None
    agent.run()
    return agent, tries, seen["mid"]
