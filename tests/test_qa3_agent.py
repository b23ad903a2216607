"""QA pass 3, the device agent (edge/agent.py and its mixins): `--sensitivity` across the agent's own
adaptation (a stale calibration never stops it: the defaults, said once, and the calibration again
once it matches), a kill -9 of the agent ends its adaptation child and `status` says the agent
ended, and no adaptation run when nothing new was labelled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from agent_helpers import CLI, ROOT
from devstate_helpers import make_data, make_keyword_clips, make_sysfs

from edge.agent import Agent, AgentConfig, read_status
from edge.audio import write_wav
from edge.device import CHUNK, Device
from edge.device_models import calibrated_for


def _room(tmp_path, seconds=31, seed=1):
    return write_wav(tmp_path / f"room{seed}.wav", (np.random.default_rng(seed).standard_normal(16000 * seconds) * 300)
                     .astype(np.int16))


def _noise_chunks(seconds, seed=0):
    pcm = (np.random.default_rng(seed).standard_normal(int(seconds * 16000)) * 100).astype(np.int16)
    return [pcm[i:i + CHUNK] for i in range(0, len(pcm), CHUNK)]


def _default_thresholds(state):
    det, _ = Device(state).detector(replay=False)
    return det.thresholds.tolist()


def _calibrated_thresholds(state, r):
    det, _ = Device(state).detector(sensitivity=r, replay=False)
    return det.thresholds.tolist()


# -- 1. a stale calibration never stops the agent -----------------------------------------------------

def test_the_agents_own_adaptation_makes_the_calibration_stale_and_detection_goes_on(tmp_path, capsys):
    """The QA repro: calibrate, then `device run --sensitivity 2 --data ... --adapt-every`: the
    agent's commit made operating.json stale and the rebuilt detector's error ended the agent (rc 2,
    agent.json "failed"), and every restart failed. Now it detects at the defaults (said once), and
    at the calibration again after `device calibrate` runs while it runs."""
    state, data = tmp_path / "st", make_data(tmp_path / "data")
    dev = Device(state)
    dev.calibrate([_room(tmp_path)])
    calibrated = _calibrated_thresholds(state, 2.0)
    seen = {}

    def audio():
        for i, c in enumerate(_noise_chunks(30)):
            if i == 10:  # the agent's own adaptation run commits (as its child would)
                seen["in_use_before"] = (agent.status.get("calibration") or {}).get("in_use")
                seen["before"] = agent._det.thresholds.tolist()
                Device(state).adapt(data, force=True, steps=3)
            if i == 80:  # two watches later
                seen["stale"] = agent._det.thresholds.tolist()
                seen["status"] = dict(agent.status["calibration"])
                seen["on_disk"] = read_status(state)["calibration"]
                Device(state).calibrate([_room(tmp_path, seed=2)])  # `device calibrate` again
            yield c

    agent = Agent(state, AgentConfig(source=audio(), sensitivity=2.0, status_every_s=0))
    agent._emit = lambda ev: None
    agent.run()  # used to raise: "operating.json was calibrated for {... 'context': None ...}"
    assert seen["before"] == calibrated and seen["in_use_before"] is True
    assert seen["status"]["in_use"] is False and "calibrate" in seen["status"]["note"]
    assert seen["on_disk"]["in_use"] is False
    stale_ctx = calibrated_for(Device(state).bundle, state)
    assert stale_ctx["context"] == "default"
    assert seen["stale"] == pytest.approx(_default_thresholds(state))  # the model's own defaults meanwhile
    # back on the calibration made for the adapted context
    assert agent.status["calibration"]["in_use"] is True
    assert agent._det.thresholds.tolist() == pytest.approx(_calibrated_thresholds(state, 2.0))
    st = read_status(state)
    assert st["state"] == "stopped" and "error" not in st and st["calibration"]["in_use"] is True
    err = capsys.readouterr().err
    assert err.count("is not used") == 1 and err.count("matches the model again") == 1, err


def test_an_agent_starts_on_a_stale_calibration_and_a_missing_one_is_still_refused(tmp_path, capsys):
    """The restart after that used to fail at once; `device detect --sensitivity` still refuses it."""
    state, data = tmp_path / "st", make_data(tmp_path / "data")
    cfg = lambda src: AgentConfig(source=src, sensitivity=2.0)  # noqa: E731
    with pytest.raises(Exception, match="does not exist"):  # never calibrated: the setup is wrong
        Agent(state, cfg(_noise_chunks(1))).run()
    Device(state).calibrate([_room(tmp_path)])
    Device(state).adapt(data, force=True, steps=3)  # what the agent's run did before the restart
    agent = Agent(state, cfg(_noise_chunks(3)))
    agent._emit = lambda ev: None
    agent.run()
    st = read_status(state)
    assert st["state"] == "stopped" and st["calibration"]["in_use"] is False, st
    assert agent._det.thresholds.tolist() == pytest.approx(_default_thresholds(state))
    assert "is not used" in capsys.readouterr().err
    r = subprocess.run(CLI + ["device", "detect", "--state", str(state), "--wav", str(_room(tmp_path)),
                              "--sensitivity", "2", "--no-replay"], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 2 and "calibrated for" in r.stderr and "Traceback" not in r.stderr


# -- 2. kill -9 of the agent: its adaptation child dies with it; status says the agent ended -------

REAPER = textwrap.dedent("""
    # a sub-reaper: the agent's orphans are reparented to this process, so their ends can be read
    import ctypes, json, os, signal, subprocess, sys, time
    sys.path.insert(0, sys.argv[1] + "/tests")
    import numpy as np
    from agent_helpers import adapting_agent
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    from pathlib import Path
    state, data, sysfs = map(Path, sys.argv[2:5])
    pcm = (np.random.default_rng(0).standard_normal(16000) * 100).astype(np.int16)
    p = adapting_agent(state, pcm, data, sysfs)
    os.kill(p.pid, signal.SIGKILL)  # the agent only, not its group: the child is left behind
    p.wait()
    ends = []
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        ends.append(-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
    print(json.dumps({"agent": p.pid, "orphans": ends}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_kill_9_of_the_agent_ends_its_adaptation_child_and_status_says_it_ended(tmp_path):
    state = tmp_path / "st"
    Device(state).enroll("hey edge", make_keyword_clips(tmp_path / "kw"))
    data, sysfs = make_data(tmp_path / "data"), make_sysfs(tmp_path / "sys")
    r = subprocess.run([sys.executable, "-c", REAPER, str(ROOT), str(state), str(data), str(sysfs)],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    # the `device adapt` child got SIGTERM when the agent died (it used to train on and exit 0)
    assert out["orphans"] == [-signal.SIGTERM], out
    st = read_status(state)
    assert st["state"] == "ended" and st["was"] == "adapting" and st["adapting"] is False, st
    assert st["note"] == (f"the agent (pid {out['agent']}) is not running: it ended without stopping "
                          "(killed or power cut)")
    assert Device(state).status()["agent"]["state"] == "ended"  # `device status` reads it so
    raw = json.loads((state / "agent.json").read_text())
    assert raw["state"] == "adapting"  # nothing is written by reading
    # the state is usable, and the next agent starts from it and stops cleanly
    agent = Agent(state, AgentConfig(source=_noise_chunks(1)))
    agent._emit = lambda ev: None
    agent.run()
    assert read_status(state)["state"] == "stopped"


def test_read_status_knows_a_dead_a_zombie_a_live_and_another_boots_agent(tmp_path):
    from edge.agent_liveness import boot_id

    def written(**kw):
        (tmp_path / "agent.json").write_text(json.dumps({"state": "running", "adapting": True, **kw}))
        return read_status(tmp_path)

    other = subprocess.Popen(["sleep", "60"])  # another program under the pid (a reboot, a wrap)
    try:
        # between fork and exec the child's cmdline is still this Python's: wait until it is sleep's
        for _ in range(1000):
            with open(f"/proc/{other.pid}/cmdline", "rb") as f:
                if f.read().startswith(b"sleep"):
                    break
            time.sleep(0.01)
        assert written(pid=other.pid)["state"] == "ended"
    finally:
        other.kill()
        other.wait()
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert written(pid=p.pid)["state"] == "running"
    p.kill()
    os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped: a zombie
    assert written(pid=p.pid)["state"] == "ended"
    p.wait()
    assert written(pid=p.pid)["state"] == "ended"
    assert written(pid=os.getpid())["state"] == "running"
    if boot_id() is not None:
        assert written(pid=os.getpid(), boot_id=boot_id())["state"] == "running"
        assert written(pid=os.getpid(), boot_id="another boot")["state"] == "ended"  # a power cut
    stopped = written(pid=p.pid, state="stopped")
    assert stopped["state"] == "stopped" and "note" not in stopped  # an agent that stopped says so itself


# -- 6. no adaptation run when nothing new was labelled -------------------------------------------

def test_the_agent_adapts_again_only_when_something_is_new(tmp_path):
    """With --adapt-every 0 the agent used to commit a new version at every tick on the same clips
    (v2-v7 in 12 s), each training the last one further and adding the same clips to the replay
    buffer again. Now a second run waits for new clips (or detections, or a new version)."""
    state = tmp_path / "st"
    data, sysfs = make_data(tmp_path / "data"), make_sysfs(tmp_path / "sys")
    pcm = (np.random.default_rng(0).standard_normal(CHUNK) * 100).astype(np.int16)
    runs, seen = [], {}

    def audio():  # bounded: 10 minutes
        i, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < 600:
            i += 1
            time.sleep(0.002)
            if agent.child is not None and (not runs or runs[-1] is not agent.child):
                runs.append(agent.child)
            last = agent.status["last_adapt"]
            if len(runs) == 1 and agent.child is None and last and "quiet" not in seen:
                seen["quiet"] = i  # the first run is read back: now many ticks with nothing new
            if "quiet" in seen and i == seen["quiet"] + 200 and "added" not in seen:
                seen["runs_while_quiet"] = len(runs)
                write_wav(data / "yes" / "new.wav", (np.random.default_rng(7).standard_normal(16000) * 3000)
                          .astype(np.int16))  # a new labelled clip
                seen["added"] = i
            if len(runs) == 2 and agent.child is None:
                break
            yield pcm

    agent = Agent(state, AgentConfig(source=audio(), data=data, adapt_every_s=0, status_every_s=0),
                  sysfs_root=sysfs)
    agent._emit = lambda ev: None
    agent.run()
    assert seen.get("runs_while_quiet") == 1, (seen, runs, agent.status["last_adapt"])
    assert len(runs) == 2, (seen, runs)
    st = read_status(state)
    assert st["last_adapt"]["status"] == "done" and st["last_adapt"]["version"] == 2, st["last_adapt"]
    assert sorted(p.name for p in (state / "adapt" / "default").glob("v*.npz")) == ["v1.npz", "v2.npz"]


def test_the_wyoming_server_detects_at_the_defaults_while_its_calibration_is_stale(tmp_path, capsys):
    """`edgelearn wyoming --sensitivity R` (and `device run --wyoming`) built every stream's detector
    with the calibration: once the state was adapted, every stream failed. It now detects at the
    model's own thresholds, said once, and at the calibrated ones again after `device calibrate`."""
    from edge.wyoming import WakeServer

    state, data = tmp_path / "st", make_data(tmp_path / "data")
    Device(state).calibrate([_room(tmp_path)])
    Device(state).adapt(data, force=True, steps=3)
    server = WakeServer(Device(state), sensitivity=2.0)
    assert server.model_set().template.thresholds.tolist() == pytest.approx(_default_thresholds(state))
    Device(state).adapt(data, force=True, steps=3)  # another commit: loaded again, said once only
    server.model_set()
    assert capsys.readouterr().err.count("is not used") == 1
    Device(state).calibrate([_room(tmp_path)])
    assert server.model_set().template.thresholds.tolist() == pytest.approx(_calibrated_thresholds(state, 2.0))
