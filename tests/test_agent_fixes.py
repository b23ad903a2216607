"""The device agent's way in and out (edge/agent.py, `edgelearn device run`), and what the other device
commands open after it installed a federated version:

- every `edgelearn device` command on a state whose agent installed a federated version (a real round
  with a real aggregator on loopback) uses that version; `--bundle` naming another version with the
  same encoder says which one is installed and where; `--bundle STATE/fl/store/current` works;
- a microphone that cannot be opened (a fake `arecord` that fails) ends `device detect --mic` and
  `device run --mic` with rc 2 and one sentence, and agent.json says "failed";
- a missing or wrong device key and a URL that is no URL stop `device run` before it starts; an
  unreachable aggregator is one line on stderr, and the agent runs on;
- Ctrl-C while adapting, with a round uploaded, leaves agent.json "stopped" with the round counted;
  a model that does not load leaves it "failed", never "running".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from agent_helpers import CLI, ROOT, adapting_agent, free_port
from agent_helpers import federate as run_round
from devstate_helpers import make_data, make_keyword_clips, make_sysfs
from test_agent import aggregator, enrolled  # noqa: F401 (fixtures: a real aggregator on loopback, a state)

from edge.agent import Agent, AgentConfig, read_status
from edge.audio import write_wav
from edge.device import CHUNK, Device
from edge.errors import EdgelearnError

SHIPPED = ROOT / "models" / "kws-dscnn-s"
RELEASE_KEYS = ROOT / "models" / "keys"


def cli(args, env=None, **kw):
    return subprocess.run(CLI + args, capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "EDGELEARN_KEYS": str(RELEASE_KEYS), **(env or {})}, **kw)


def last_line(r) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""


# -- 1. the installed federated version is every command's bundle ------------------------------------

def federate(state, pcm, data, agg) -> int:
    """One real round (``agent_helpers.federate``): the version the agent installed, checked and runs."""
    agent, versions = run_round(state, pcm, data, agg)
    assert read_status(state)["rounds_joined"] >= 1 and versions[-1] > versions[0]
    return agent.device.bundle.version


def test_every_device_command_uses_the_version_the_agent_installed(enrolled, tmp_path, aggregator):  # noqa: F811
    state, pcm = enrolled
    v = federate(state, pcm, make_data(tmp_path / "data"), aggregator)
    installed = state / "fl" / "store" / "bundles" / f"kws-dscnn-s-v{v}"
    assert installed.is_dir() and json.loads(installed.joinpath("manifest.json").read_text())["version"] == v
    trusted = str(aggregator["trusted"])
    wav = write_wav(tmp_path / "talk.wav", pcm)

    # no --bundle: the installed version (verified with the keys the agent runs with)
    r = cli(["device", "status", "--state", str(state), "--pubkey", trusted])
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["bundle"] == f"kws-dscnn-s v{v}" and st["keywords"] == ["hey edge"]
    r = cli(["device", "status", "--state", str(state)], env={"EDGELEARN_KEYS": trusted})  # /etc/edgelearn/keys
    assert r.returncode == 0 and json.loads(r.stdout)["bundle"] == f"kws-dscnn-s v{v}", r.stderr
    r = cli(["device", "detect", "--state", str(state), "--pubkey", trusted, "--wav", str(wav), "--json",
             "--no-replay"])
    assert r.returncode == 0, r.stderr
    want = list(Device(state, installed, trusted_keys=trusted).detect(pcm, replay=False))
    assert [json.loads(line)["keyword"] for line in r.stdout.splitlines()] == [e["keyword"] for e in want] != []
    assert Device(state, trusted_keys=trusted).bundle.version == v  # Python too (edgelearn wyoming's Device)

    # keys that do not verify it: one sentence naming the installed version and the fix, no other encoder
    r = cli(["device", "status", "--state", str(state)])
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert str(installed) in r.stderr and "--pubkey" in r.stderr and "another encoder" not in r.stderr

    # --bundle of another version with the same encoder: says which version is installed, and where
    for cmd in (["status"], ["detect", "--wav", str(wav)], ["calibrate", "--wav", str(wav)],
                ["enroll", "--keyword", "other", "--wav", *map(str, make_keyword_clips(tmp_path / "kw2"))]):
        r = cli(["device", cmd[0], "--state", str(state), "--pubkey", trusted, "--bundle", str(SHIPPED), *cmd[1:]])
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert f"runs kws-dscnn-s v{v}" in r.stderr and str(installed) in r.stderr, r.stderr
        assert "another encoder" not in r.stderr
    assert Device(state, trusted_keys=trusted).status()["keywords"] == ["hey edge"]  # nothing was changed

    # --bundle STATE/fl/store/current (the store's pointer) or the store directory: the version it names
    for b in (state / "fl" / "store" / "current", state / "fl" / "store"):
        r = cli(["device", "status", "--state", str(state), "--pubkey", trusted, "--bundle", str(b)])
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["bundle"] == f"kws-dscnn-s v{v}"


def test_a_version_installed_but_never_checked_is_not_used(enrolled, tmp_path, aggregator):  # noqa: F811
    """What the agent opens on, the commands open on: a version a round installed but the agent never
    checked (a kill -9 came between) is not used until the agent checked it."""
    from agent_helpers import signed_version

    state, _ = enrolled
    trusted = aggregator["trusted"]
    agent = Agent(state, AgentConfig(source=[], aggregator=aggregator["url"], device_id="pi-0",
                                     device_key=aggregator["key"]), trusted_keys=trusted)
    store = agent._fl_store()
    store.install(signed_version(tmp_path, 5, False, aggregator["state"]))
    assert Device(state, trusted_keys=trusted).bundle.version == 3  # installed, not checked
    agent._switch_version(5)
    agent._write_status()
    assert Device(state, trusted_keys=trusted).bundle.version == 5
    store.install(signed_version(tmp_path, 6, True, aggregator["state"]))  # and the kill -9, before any check
    assert Device(state, trusted_keys=trusted).bundle.version == 5
    assert Device(state, trusted_keys=trusted).status()["keywords"] == ["hey edge"]


# -- 2. a microphone that cannot be opened --------------------------------------------------------

def fake_arecord(tmp: Path, script: str) -> dict:
    """PATH with an `arecord` running ``script`` (its arguments are written to tmp/arecord.args)."""
    bindir = tmp / "fakebin"
    bindir.mkdir(exist_ok=True)
    exe = bindir / "arecord"
    exe.write_text(f"#!/bin/sh\necho \"$@\" > {tmp}/arecord.args\n{script}\n")
    exe.chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ['PATH']}"}


NO_CARD = ('echo "ALSA lib confmisc.c:855:(parse_card) cannot find card \'7\'" >&2\n'
           'echo "arecord: main:850: audio open error: No such file or directory" >&2\nexit 1')


def test_a_microphone_that_cannot_be_opened_ends_detect_and_run_non_zero(enrolled, tmp_path):
    state, _ = enrolled
    env = fake_arecord(tmp_path, NO_CARD)
    r = cli(["device", "detect", "--state", str(state), "--mic", "--mic-device", "hw:7,0"], env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "microphone could not be opened" in last_line(r) and "audio open error" in last_line(r)
    assert "arecord -l" in last_line(r)
    assert "-D hw:7,0" in (tmp_path / "arecord.args").read_text()

    r = cli(["device", "run", "--state", str(state), "--mic"], env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    line = last_line(r)
    assert line.startswith("edgelearn device: the microphone could not be opened") and "audio open error" in line
    st = read_status(state)
    assert st["state"] == "failed" and "microphone" in st["error"], st


def test_a_microphone_that_stops_mid_run_fails_and_one_that_ends_cleanly_does_not(enrolled, tmp_path):
    state, pcm = enrolled
    raw = tmp_path / "pcm.raw"
    raw.write_bytes(pcm.tobytes())
    env = fake_arecord(tmp_path, f'cat {raw}\necho "arecord: pcm_read:2221: read error: No such device" >&2\nexit 1')
    r = cli(["device", "run", "--state", str(state), "--mic"], env=env)
    assert r.returncode == 2 and "microphone stopped" in last_line(r) and "read error" in last_line(r), r.stderr
    st = read_status(state)
    assert st["state"] == "failed" and st["audio_s"] > 0 and st["detections"] >= 2  # it heard until then
    env = fake_arecord(tmp_path, f"cat {raw}")
    r = cli(["device", "run", "--state", str(state), "--mic"], env=env)
    assert r.returncode == 0, r.stderr
    st = read_status(state)
    assert st["state"] == "stopped" and "error" not in st


def test_systemd_stopping_the_agent_and_its_recorder_is_a_clean_stop(enrolled, tmp_path):
    """systemd's stop sends SIGTERM to the agent and arecord at once: the recorder's death is not a
    failure then (rc 0, "stopped")."""
    state, _ = enrolled
    env = fake_arecord(tmp_path, "exec cat /dev/zero")
    p = subprocess.Popen(CLI + ["device", "run", "--state", str(state), "--mic"],
                         cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 120:
            st = read_status(state)
            if st and st.get("state") == "running" and st.get("pid") == p.pid:
                break
            time.sleep(0.05)
        time.sleep(0.3)
        os.killpg(p.pid, signal.SIGTERM)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 0, err
    assert read_status(state)["state"] == "stopped"


# -- 3. the device key and the aggregator URL, before starting ----------------------------------------

def test_a_bad_key_or_url_stops_the_agent_before_it_starts(tmp_path, aggregator):  # noqa: F811
    state = tmp_path / "st"
    wav = write_wav(tmp_path / "sil.wav", np.zeros(16000, np.int16))
    base = ["device", "run", "--state", str(state), "--wav", str(wav), "--device-id", "pi-0"]
    cases = [(["--aggregator", aggregator["url"], "--device-key", str(tmp_path / "nope.hmac")], "no such file"),
             (["--aggregator", aggregator["url"], "--device-key", str(wav)], "not a device key"),
             (["--aggregator", "notaurl", "--device-key", str(aggregator["key"])], "not an aggregator URL"),
             (["--aggregator", "ftp://host:1", "--device-key", str(aggregator["key"])], "not an aggregator URL")]
    for extra, what in cases:
        r = cli(base + extra)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (extra, r.stderr)
        assert what in last_line(r) and len(r.stderr.strip().splitlines()) <= 2, (extra, r.stderr)
        assert read_status(state) is None  # it never started


def test_an_unreachable_aggregator_is_one_line_on_stderr_and_the_agent_runs_on(enrolled, tmp_path, aggregator):  # noqa: F811
    state, pcm = enrolled
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    r = subprocess.run(CLI + ["device", "run", "--state", str(state), "--stdin", "--aggregator", url, "--device-id",
                              "pi-0", "--device-key", str(aggregator["key"]), "--checkin-every", "0.01", "--pubkey",
                              str(aggregator["trusted"])],
                       input=np.tile(pcm, 2).tobytes(), capture_output=True, cwd=ROOT, timeout=300)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    warned = [line for line in err.splitlines() if "check-in with" in line]
    assert len(warned) == 1 and url in warned[0] and "unreachable" in warned[0], err
    st = read_status(state)
    assert st["state"] == "stopped" and "unreachable" in st["last_checkin"]["error"]
    assert len(r.stdout.decode().splitlines()) >= 2  # detection ran on


# -- 3b/4. whatever ends the agent, agent.json is final --------------------------------------------------

def test_ctrl_c_while_adapting_keeps_the_uploaded_round_and_says_stopped(enrolled, tmp_path, aggregator,  # noqa: F811
                                                                         monkeypatch):
    """Ctrl-C while an adaptation run is in progress and a round's upload has just come back, and a
    second Ctrl-C while the agent checks the version that round installed, on its way out."""
    state, pcm = enrolled
    data, sysfs = make_data(tmp_path / "data"), make_sysfs(tmp_path / "sys")
    cfg = AgentConfig(source=None, data=data, aggregator=aggregator["url"], device_id="pi-0",
                      device_key=aggregator["key"], checkin_every_s=10 ** 6, status_every_s=10 ** 6,
                      adapt_every_s=0)
    seen = {}

    def audio():
        i = 0
        while agent.child is None or agent._fl_thread is None:
            yield pcm[i % len(pcm): i % len(pcm) + CHUNK]
            i += CHUNK
        seen["on_disk"] = read_status(state)["state"]
        agent._fl_thread.join(timeout=300)  # the round's answer is in, not yet read by the loop
        raise KeyboardInterrupt  # Ctrl-C

    def second_ctrl_c(version):
        raise KeyboardInterrupt

    cfg.source = audio()
    agent = Agent(state, cfg, trusted_keys=aggregator["trusted"], sysfs_root=sysfs)
    agent._emit = lambda ev: None
    monkeypatch.setattr(agent, "_switch_version", second_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        agent.run()
    assert seen["on_disk"] == "adapting"
    st = read_status(state)
    assert st["state"] == "stopped" and st["adapting"] is False, st
    assert st["last_checkin"]["action"] == "uploaded" and st["rounds_joined"] == 1, st
    assert st["last_round"] == st["last_checkin"]["round_id"] and st["bytes_uploaded"] > 0


def test_ctrl_c_on_the_command_is_a_clean_stop(enrolled, tmp_path):
    state, pcm = enrolled
    data, sysfs = make_data(tmp_path / "data"), make_sysfs(tmp_path / "sys")
    p = adapting_agent(state, pcm, data, sysfs, stderr=subprocess.PIPE)
    try:
        os.killpg(p.pid, signal.SIGINT)  # Ctrl-C reaches the agent and its child
        try:  # the agent stops at its next chunk, and reads no more
            for _ in range(20):
                p.stdin.write(pcm[:CHUNK].tobytes())
                p.stdin.flush()
            p.stdin.close()
        except BrokenPipeError:
            pass
        err = p.stderr.read().decode()
        p.wait(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 130 and "Traceback" not in err, err
    st = read_status(state)
    assert st["state"] == "stopped" and st["adapting"] is False


def test_a_model_that_does_not_load_leaves_agent_json_failed_not_running(enrolled, tmp_path):
    state, pcm = enrolled
    agent = Agent(state, AgentConfig(source=[pcm[:CHUNK]]), backend="nosuch")
    with pytest.raises(EdgelearnError):
        agent.run()
    st = read_status(state)
    assert st["state"] == "failed" and "nosuch" in st["error"]
    r = cli(["device", "run", "--state", str(state), "--stdin", "--backend", "nosuch"], input="")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    st = read_status(state)
    assert st is None or st["state"] != "running"
