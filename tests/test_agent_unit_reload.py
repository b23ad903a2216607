"""The device agent's unit, reload and update paths: ``device run --print-unit`` carries every option
given onto the unit's ExecStart (parsed back by the real parser of ``device run``), a keyword
enrolled while the agent runs is heard without a restart, and an agent never picked for a round
still installs each new version the aggregator publishes."""

from __future__ import annotations

import argparse
import shlex
import subprocess
from pathlib import Path

import pytest
from agent_helpers import CLI, ROOT

from edge.commands import device as device_cmd

SOURCES = {"mic", "wav", "stdin", "print_unit", "help"}


def run_parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="edgelearn device")
    device_cmd.add_arguments(top)
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["run"]


def _values(level: str) -> dict:
    """A value for every option of ``device run`` (a new option without one fails the test)."""
    return {"bundle": ["--bundle", "part-rpi4"], "pubkey": ["--pubkey", "trust", "--pubkey", "/etc/k 2"],
            "backend": ["--backend", "onnxruntime"], "state": ["--state", "sa"],
            "mic_device": ["--mic-device", "hw:1,0"],
            "threshold": ["--threshold", "0.8"], "sensitivity": ["--sensitivity", "2.5"],
            "keywords": ["--keywords", "yes,no"], "confirm": ["--confirm", "0.95"], "asr": ["--asr"],
            "phrase": ["--phrase"], "no_phrase": ["--no-phrase"],
            "on_detect": ["--on-detect", "echo 'hi there' >> \"$HOME/log\"; logger -t kws"],
            "data": ["--data", "my data"], "strategy": ["--strategy", "lora"], "keep_versions": ["--keep-versions", "4"],
            "no_adapt": ["--no-adapt"],
            "adapt_every": ["--adapt-every", "600"], "aggregator": ["--aggregator", "http://127.0.0.1:18470"],
            "device_id": ["--device-id", "d 1"], "device_key": ["--device-key", "devkeys/d1.hmac"],
            "checkin_every": ["--checkin-every", "30"], "network": ["--network", "ethernet"],
            "wyoming": ["--wyoming", "tcp://0.0.0.0:10400"], "zeroconf": ["--zeroconf", "kitchen edge"],
            "sysfs_root": ["--sysfs-root", "fake sys"]}


def _resolved(ns: argparse.Namespace, cwd: Path) -> dict:
    out = {}
    for k, v in vars(ns).items():
        if k in SOURCES:
            continue
        if isinstance(v, list):
            v = [(cwd / x).resolve() if isinstance(x, Path) else x for x in v]
        out[k] = (cwd / v).resolve() if isinstance(v, Path) else v
    return out


@pytest.mark.parametrize("level", ["threshold", "sensitivity"])
def test_print_unit_carries_every_option_given(tmp_path, level):
    parser = run_parser()
    values = _values(level)
    # the options one run cannot take together: the other level, and two of the three second-stage
    # choices (--no-phrase: test_phrase_stage_wiring.py's unit test)
    other = {"sensitivity", "phrase", "no_phrase"} if level == "threshold" else {"threshold", "asr", "no_phrase"}
    dests = {a.dest for a in parser._actions} - SOURCES
    assert dests <= set(values), f"no test value for {sorted(dests - set(values))}"
    argv = ["--mic"]
    for dest in sorted(dests - other):
        argv += values[dest]
    r = subprocess.run(CLI + ["device", "run", "--print-unit", *argv[1:]], capture_output=True, text=True,
                       cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert r.returncode == 0, r.stderr
    exec_line = next(line for line in r.stdout.splitlines() if line.startswith("ExecStart="))
    words = shlex.split(exec_line[len("ExecStart="):])
    at = words.index("device")
    assert words[at + 1] == "run"
    rest = words[at + 2:]
    # every option given appears, the audio source is the microphone
    for dest in dests - other:
        assert values[dest][0] in rest, values[dest][0]
    assert "--mic" in rest and "--print-unit" not in rest
    back = parser.parse_args(rest)
    want = parser.parse_args(argv)
    assert back.mic
    assert _resolved(back, Path("/")) == _resolved(want, tmp_path)
    for dest in ("bundle", "data", "device_key", "state", "sysfs_root"):
        assert getattr(back, dest).is_absolute()
    assert all(p.is_absolute() for p in (back.pubkey if isinstance(back.pubkey, list) else [back.pubkey]))


def test_print_unit_of_a_bare_run_is_the_microphone_only(tmp_path):
    r = subprocess.run(CLI + ["device", "run", "--state", "st", "--print-unit"], capture_output=True, text=True,
                       cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert r.returncode == 0, r.stderr
    exec_line = next(line for line in r.stdout.splitlines() if line.startswith("ExecStart="))
    rest = shlex.split(exec_line)[shlex.split(exec_line).index("run") + 1:]
    assert rest == ["--state", str((tmp_path / "st").resolve()), "--mic"]


# -- a keyword enrolled while the agent runs ------------------------------------------------------

def _other_clips(root: Path, n: int = 5, seed: int = 2) -> list[Path]:
    """Clips of a second keyword that sounds unlike the buzz: a brighter voice falling 320 -> 200 Hz."""
    import numpy as np

    from edge.audio import write_wav

    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    t = np.arange(8000) / 16000
    phase = 2 * np.pi * np.cumsum(320 - 120 * t / t[-1]) / 16000
    x0 = sum(np.sin(k * phase) / k ** 0.5 for k in range(1, 8)) * np.hanning(len(t))
    out = []
    for i in range(n):
        x = np.r_[np.zeros(2000), x0 * 4000 * (1 + 0.05 * i), np.zeros(2000)] + rng.standard_normal(12000) * 50
        out.append(write_wav(root / f"o{i}.wav", x.astype(np.int16)))
    return out


def _same(got, want):
    assert [e["keyword"] for e in got] == [e["keyword"] for e in want]
    assert [e["time_s"] for e in got] == pytest.approx([e["time_s"] for e in want], abs=0.021)


def test_a_keyword_enrolled_while_the_agent_runs_is_heard(tmp_path):
    import shutil

    import numpy as np
    from agent_helpers import stream
    from devstate_helpers import make_keyword_clips

    from edge.agent import Agent, AgentConfig
    from edge.audio import read_wav
    from edge.device import CHUNK, Device

    state = tmp_path / "st"
    Device(state).enroll("hey edge", make_keyword_clips(tmp_path / "kw"))
    beta_clips = _other_clips(tmp_path / "beta")
    beta = read_wav(beta_clips[0])
    rng = np.random.default_rng(9)
    noise = lambda s: rng.standard_normal(int(s * 16000)) * 100  # noqa: E731
    hey = stream(tmp_path, copies=1)                # "hey edge" three times
    before = np.concatenate([hey, noise(0.5), beta, noise(1.0)])   # beta said before it is enrolled
    before = before[: len(before) // CHUNK * CHUNK]
    after = np.concatenate([noise(4.0), beta, noise(2.0), beta, noise(1.0), hey])
    pcm = np.concatenate([before, after]).astype(np.int16)
    enrolled_at = len(before) / 16000

    # what one uninterrupted detector hears: the buzz (only it enrolled), and beta once enrolled
    want_hey = [e for e in Device(state).detect(pcm, replay=False) if e["keyword"] == "hey edge"]
    both = tmp_path / "both"
    shutil.copytree(state, both)
    Device(both).enroll("beta", beta_clips)
    want_beta = [e for e in Device(both).detect(pcm, replay=False)
                 if e["keyword"] == "beta" and e["time_s"] > enrolled_at]
    assert len(want_hey) == 6 and len(want_beta) == 2

    def chunks():
        for i in range(0, len(pcm), CHUNK):
            if i == len(before):  # `edgelearn device enroll`, another process, while the agent runs
                r = subprocess.run(CLI + ["device", "enroll", "--state", str(state), "--keyword", "beta",
                                          "--wav", *map(str, beta_clips)], capture_output=True, text=True,
                                   cwd=ROOT, timeout=300)
                assert r.returncode == 0, r.stderr
            yield pcm[i:i + CHUNK]

    out = []
    agent = Agent(state, AgentConfig(source=chunks(), adapt=False))
    agent._emit = out.append
    agent.run()
    _same([e for e in out if e["keyword"] == "hey edge"], want_hey)   # none dropped, none repeated
    _same([e for e in out if e["keyword"] == "beta"], want_beta)      # heard from the enrolment on
    assert {e["keyword"] for e in out} == {"hey edge", "beta"}


# -- a new version installed without being picked for a round -------------------------------------

def test_an_agent_never_picked_still_installs_each_new_version(tmp_path):
    """One device on battery (never eligible for a round) at the first version; the federation
    publishes two more (another device's rounds). Its check-ins are answered ``wait`` naming the
    current version, and the agent installs it, health-checks it and detects with it."""
    import time

    import numpy as np
    from agent_helpers import make_battery_sysfs, stream, trusted_keys
    from aggregator_helpers import FIRST, start

    from edge.agent import FL_DIR, Agent, AgentConfig, read_status
    from edge.device import CHUNK
    from edge.fl import FLClient
    from host.aggregator.app import build_app
    from host.aggregator.config import AggregatorConfig
    from host.aggregator.inprocess import InProcessTransport, make_state
    from host.aggregator.setup import write_device_key
    from host.netutil import free_port

    cfg = AggregatorConfig(clients_per_round=1, overselect=1.0, eval_tolerance=1.0, round_timeout=60,
                           min_battery=0.5)
    agg, keys = make_state(tmp_path, cfg, n_devices=2, prefix="pi-")
    trusted = trusted_keys(agg, tmp_path / "trusted")
    state = tmp_path / "st"
    rng = np.random.default_rng(0)
    other = (np.abs(rng.standard_normal((60, 64))).astype(np.float32), rng.integers(0, 37, 60))
    with InProcessTransport(build_app(agg, tick_interval=0)) as t:
        # the agent's device joined when the first version was current
        FLClient(t, "pi-0", keys["pi-0"], state / FL_DIR, trusted_keys=trusted).ensure_model(FIRST)
        peer = FLClient(t, "pi-1", keys["pi-1"], tmp_path / "peer", trusted_keys=trusted, data=other, seed=1)
        for _ in range(2):
            assert peer.run_once({"battery": 1.0, "charging": True})["action"] == "uploaded"
    latest = FIRST + 2
    port = free_port()
    proc = start(agg, port)
    try:
        url = f"http://127.0.0.1:{port}"
        pcm = stream(tmp_path)
        checkins = []
        agent = None

        def audio():
            i = 0
            while len(checkins) < 6 and agent.device.bundle.version != latest:
                yield pcm[i % len(pcm): i % len(pcm) + CHUNK]
                i += CHUNK
                time.sleep(0.005)

        acfg = AgentConfig(source=audio(), aggregator=url, device_id="pi-0",
                           device_key=write_device_key(tmp_path / "devkeys", "pi-0", keys["pi-0"]),
                           checkin_every_s=0.05, status_every_s=0, adapt=False)
        agent = Agent(state, acfg, trusted_keys=trusted, sysfs_root=make_battery_sysfs(tmp_path / "sys", 40))
        assert agent.device.bundle.version == FIRST
        after = agent._after_round
        agent._after_round = lambda kind, res: (checkins.append((kind, res)), after(kind, res))
        agent._emit = lambda ev: None
        agent.run()
        st = read_status(state)
        assert agent.device.bundle.version == latest, checkins
        assert st["fl_version"] == latest and st["last_health"]["ok"], st
        assert st["rounds_joined"] == 0 and st["last_checkin"]["action"] == "wait", st
        assert all(res["answer"]["action"] == "wait" for kind, res in checkins if kind == "ok"), checkins
        # up to date now: the wait answer names no version
        c = FLClient(url, "pi-0", keys["pi-0"], state / FL_DIR, trusted_keys=trusted)
        ans = c.checkin({"battery": 0.4, "charging": False})
        assert ans["action"] == "wait" and "model_version" not in ans, ans
    finally:
        proc.kill()
        proc.wait()
