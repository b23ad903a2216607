"""QA pass 4, the device agent: one agent per state (a second `device run` is refused with the first
one's pid, and a kill -9 frees the state), agent.json's ``model`` follows a detector rebuilt after
another process adapted the state, and a refused device key is on record and backs off."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import time

import numpy as np
import pytest
from agent_helpers import CLI, ROOT, run_refused_agent
from devstate_helpers import make_data
from test_agent import aggregator  # noqa: F401 (fixture: a real aggregator on loopback)

from edge.agent import Agent, AgentConfig, read_status
from edge.device import CHUNK, Device
from edge.errors import EdgelearnError


def _noise(seconds, seed=0):
    return (np.random.default_rng(seed).standard_normal(int(seconds * 16000)) * 100).astype(np.int16)


def _wait_running(state, p):
    """Until the agent ``p`` wrote "running" (bounded: 5 minutes; it fails sooner if p exits)."""
    for _ in range(3000):
        st = read_status(state)
        if st and st.get("pid") == p.pid and st.get("state") == "running":
            return st
        assert p.poll() is None, p.stderr.read().decode()
        time.sleep(0.1)
    raise AssertionError("the agent never ran")


# -- 1. one agent per state ----------------------------------------------------------------------

def test_a_second_agent_on_the_same_state_is_refused_and_a_kill_9_frees_it(tmp_path):
    """Two `device run` on one state both detected and rewrote agent.json (and with an aggregator
    collided on check-ins, installs, the replay buffer). The second is now refused: rc 2, one
    sentence naming the first one's pid and the fix, and it writes nothing. A kill -9 of the first
    frees the state (the kernel drops the flock): the next one starts."""
    state = tmp_path / "st"
    Device(state)
    run = CLI + ["device", "run", "--state", str(state), "--stdin"]
    first = subprocess.Popen(run, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        before = _wait_running(state, first)
        lock = state / "agent.lock"
        assert stat.S_IMODE(lock.stat().st_mode) == 0o600 and lock.read_text().strip() == str(first.pid)
        second = subprocess.run(run, input=_noise(1).tobytes(), capture_output=True, cwd=ROOT, timeout=300)
        err = second.stderr.decode()
        assert second.returncode == 2, err
        assert f"pid {first.pid}" in err and f"kill {first.pid}" in err and "systemctl stop edgelearn-agent" in err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        after = read_status(state)  # the refused agent wrote nothing
        assert after["pid"] == first.pid and after["state"] == "running" and after["started"] == before["started"]
        # the Python API is refused the same way (the Wyoming-only and --stdin modes are all an Agent)
        with pytest.raises(EdgelearnError, match=f"pid {first.pid}"):
            Agent(state, AgentConfig(source="none", wyoming="tcp://127.0.0.1:0"))
    finally:
        first.kill()  # kill -9: no clean exit, the lock file stays
        first.wait()
    third = subprocess.run(run, input=_noise(1).tobytes(), capture_output=True, cwd=ROOT, timeout=300)
    assert third.returncode == 0, third.stderr.decode()
    st = read_status(state)
    assert st["state"] == "stopped" and st["pid"] != first.pid


def test_the_adaptation_child_does_not_hold_the_agent_lock(tmp_path):
    """The adaptation child (and the hooks) must not inherit the lock's fd: a child outliving a
    killed agent would keep every restart out."""
    from agent_helpers import adapting_agent
    from devstate_helpers import make_sysfs

    state = tmp_path / "st"
    data, sysfs = make_data(tmp_path / "data"), make_sysfs(tmp_path / "sys")
    p = adapting_agent(state, _noise(1), data, sysfs)
    try:
        lock = str((state / "agent.lock").resolve())
        children = [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and _ppid(pid) == p.pid]
        assert children, "the adaptation child runs"

        def holds(pid):
            fds = f"/proc/{pid}/fd"
            try:
                return any(os.readlink(f"{fds}/{fd}") == lock for fd in os.listdir(fds))
            except OSError:
                return False

        assert holds(p.pid) and not any(holds(c) for c in children)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _ppid(pid):
    try:
        s = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    return int(s[s.rfind(")") + 2:].split()[1])


# -- 2. agent.json's model follows a rebuilt detector ---------------------------------------------

def test_agent_json_model_follows_a_state_adapted_by_another_process(tmp_path):
    """`device adapt` (or use / rollback) on the state while the agent runs: the state watch rebuilt
    the detector on the adapted context, but agent.json's ``model`` kept "context": None."""
    from edge.device_models import detection_info

    state, data = tmp_path / "st", make_data(tmp_path / "data")
    Device(state)
    pcm = _noise(0.1)

    def audio():
        yield pcm
        Device(state).adapt(data, force=True, steps=3)  # what another process's `device adapt` does
        for _ in range(40):  # 4 s of audio: the state watch looks every 2 s
            yield pcm

    agent = Agent(state, AgentConfig(source=audio(), adapt=False, status_every_s=10 ** 6))
    assert agent.status["model"]["context"] is None
    agent._emit = lambda ev: None
    agent.run()
    want = detection_info(Device(state).bundle, state)
    assert want["context"] == "default" and want["context_version"] == 1
    assert agent.status["model"]["context"] == "default"
    assert read_status(state)["model"]["context_version"] == 1
    assert Device(state).status()["agent"]["model"]["context"] == "default"  # `device status`


# -- 3. a refused device key is on record and backs off -------------------------------------------

def test_a_refused_device_key_is_recorded_and_checkins_back_off(tmp_path, aggregator):  # noqa: F811
    """With a wrong --device-key the agent checked in (and was refused, 401) at every interval for
    ever while agent.json said nothing. Now agent.json has ``federation`` with the refusal and the
    check-ins back off exponentially (capped at 10 intervals); detection goes on; a check-in that
    works ends it. A simulated clock: one second of it per chunk, each check-in awaited."""
    from host.aggregator.setup import write_device_key

    state = tmp_path / "st"
    Device(state)
    bad = write_device_key(tmp_path / "bad", "pi-0", os.urandom(32))
    agent, tries, mid = run_refused_agent(state, aggregator, bad, _noise(0.1))
    assert mid["state"] == "running" and "401" in mid["federation"]["error"], mid
    assert mid["federation"]["refusals"] >= 3 and "--device-key" in mid["federation"]["fix"]
    gaps = np.diff(tries)
    assert len(tries) <= 12, tries  # every second before: 80
    assert list(gaps) == sorted(gaps) and gaps.max() <= 11, tries  # growing, capped at 10 intervals
    assert agent.status["audio_s"] == pytest.approx(8.0, abs=0.11) and agent.status["state"] == "stopped"
    agent._after_round("ok", {"answer": {"action": "wait"}, "bytes": 0, "version": None})  # one that works
    assert agent.status["federation"] is None and agent._auth_refusals == 0
