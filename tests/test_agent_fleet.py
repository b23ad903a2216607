"""Three ``edgelearn device run`` processes against a real aggregator on loopback (issue 18): rounds
complete and version 2 is pulled and used by every agent, then round 1's v3 without a round (a wait
answer names it); a validly signed but broken version (v4,
published by the operator path ``host.aggregator.setup.publish_version``) is rejected by each
agent's health check and rolled back to v3; a kill -9 of one agent before its upload and of another
after it loses nothing and double-sends nothing, both come back on v3 (the unchecked v4 is checked
at start) and join the next round; the round trained on v4 repairs it (v5), and every agent checks
v5 and uses it.

The fairness budget (``max_rounds_per_window`` over a window longer than the test) paces the
fleet: each phase allows exactly the rounds it needs, so every version number below is determined.
Two agents carry ``EDGELEARN_AGENT_HOLD`` (edge/agent_federation.py ``_HeldTransport``): their federated
thread stops at their second upload, before sending it or after its answer, which is where the
test kills them. Timeouts only guard against hangs; nothing is asserted about time."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from agent_helpers import CLI, ROOT, free_port, make_battery_sysfs, make_silence_data, stream, trusted_keys
from aggregator_helpers import FIRST
from aggregator_helpers import start as start_aggregator
from devstate_helpers import make_keyword_clips

from edge.agent import HOLD_ENV, read_status
from edge.device import CHUNK, Device
from edge.errors import EdgelearnError
from edge.store import BundleStore

NAMES = ("pi-0", "pi-1", "pi-2")
TIMEOUT = 240.0  # a guard against hangs (a loaded 2-core machine), never an assertion
# The versions this test names v2..v5 (their numbers when the shipped bundle was version 1): the
# federation's first version (the shipped model with its own head), round 1's, the operator's broken
# one and its repair; each relative to the shipped bundle's version.
V2, V3, V4, V5 = FIRST, FIRST + 1, FIRST + 2, FIRST + 3


class AgentProc:
    """One agent process fed the keyword stream on stdin (about 3x real time); its detections
    are collected from stdout."""

    def __init__(self, name, root: Path, pcm, url, key, trusted):
        self.name, self.root, self.pcm = name, root, pcm
        self.state, self.data, self.sysfs = root / "state", root / "data", root / "sys"
        self.argv = CLI + ["device", "run", "--state", str(self.state), "--stdin", "--data", str(self.data),
                           "--aggregator", url, "--device-id", name, "--device-key", str(key),
                           "--checkin-every", "0.3", "--adapt-every", "86400", "--pubkey", str(trusted),
                           "--sysfs-root", str(self.sysfs)]
        self.events: list = []
        self.proc = None

    def start(self, hold: str | None = None):
        env = {k: v for k, v in os.environ.items() if k != HOLD_ENV}
        if hold:
            env[HOLD_ENV] = hold
        self.err = open(self.root / f"stderr.{int(time.time() * 1000)}.txt", "wb")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
                                     cwd=ROOT, env=env, start_new_session=True)
        self._stop = threading.Event()
        self._feeder = threading.Thread(target=self._feed, args=(self.proc, self._stop), daemon=True)
        self._reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True)
        self._feeder.start()
        self._reader.start()

    def _feed(self, proc, stop):
        i = 0
        while not stop.is_set():
            try:
                proc.stdin.write(self.pcm[i: i + CHUNK].tobytes())
                proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                return
            i = (i + CHUNK) % (len(self.pcm) - CHUNK)
            time.sleep(0.033)

    def _read(self, proc):
        for line in proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if "keyword" in ev:
                self.events.append(ev)

    def status(self) -> dict:
        return read_status(self.state) or {}

    def kill9(self):
        os.killpg(self.proc.pid, signal.SIGKILL)  # the agent and whatever it started
        self.proc.wait()
        self._stop.set()
        self._reader.join(timeout=10)
        self.err.close()

    def finish(self) -> int:
        """End the audio (stdin closed): the agent finishes and exits."""
        self._stop.set()
        self._feeder.join(timeout=10)
        self.proc.stdin.close()
        rc = self.proc.wait(timeout=120)
        self._reader.join(timeout=10)
        self.err.close()
        return rc

    def stderr_tail(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-1500:] for p in sorted(self.root.glob("stderr.*.txt")))


def wait_for(cond, what: str, agents=(), timeout: float = TIMEOUT):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return
        for a in agents:
            if a.proc is not None and a.proc.poll() is not None:
                raise AssertionError(f"{a.name} exited ({a.proc.returncode}) while waiting for {what}:\n"
                                     f"{a.stderr_tail()}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}: " + json.dumps(
        {a.name: a.status() for a in agents}, indent=1, default=str)[:6000])


def db(agg: Path, sql: str, args=()):
    """Rows of the aggregator's database (a reader beside the serving process: WAL)."""
    c = sqlite3.connect(agg / "state.sqlite", timeout=30)
    try:
        return c.execute(sql, args).fetchall()
    finally:
        c.close()


def rounds(agg) -> dict:
    return {r: (status, accepted, result) for r, status, accepted, result in
            db(agg, "SELECT round_id, status, accepted, result_version FROM rounds")}


def refusals(port) -> dict:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    return {line.split("{", 1)[1].split("}", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("edgelearn_refusals_total{")}


def set_budget(agg: Path, rounds_per_device: int) -> None:
    from host.aggregator.config import AggregatorConfig

    cfg = AggregatorConfig.load(agg / "config.json")
    cfg.max_rounds_per_window = rounds_per_device
    cfg.save(agg / "config.json")


def test_three_agents_federate_reject_a_broken_version_and_survive_kill_9(tmp_path):
    from host.aggregator.config import AggregatorConfig
    from host.aggregator.inprocess import make_state
    from host.aggregator.setup import publish_version, write_device_key
    from host.fleet.data import extract_head

    # an aggregator whose first version (v2) is the shipped model with its own head; one round per device for now
    cfg = AggregatorConfig(clients_per_round=3, overselect=1.0, max_overselect=1.0, round_timeout=600,
                           min_battery=0.3, fairness_window=1000, max_rounds_per_window=1)
    agg, keys = make_state(tmp_path, cfg, n_devices=3, params=extract_head(), prefix="pi-")
    trusted = trusted_keys(agg, tmp_path / "trusted")
    template = tmp_path / "template"
    Device(template).enroll("hey edge", make_keyword_clips(tmp_path / "kwclips"))
    pcm = stream(tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    agents = []
    for i, name in enumerate(NAMES):
        root = tmp_path / name
        shutil.copytree(template, root / "state")
        make_silence_data(root / "data", seed=i)
        make_battery_sysfs(root / "sys")
        agents.append(AgentProc(name, root, pcm, url, write_device_key(tmp_path / "keys", name, keys[name]), trusted))
    a0, a1, a2 = agents
    marks = {a.name: a.root / "held.json" for a in agents}
    server = start_aggregator(agg, port)
    ok = False
    try:
        a0.start()
        a1.start(hold=f"before,/v1/updates,2,{marks['pi-1']}")  # its second upload: stopped before sending
        a2.start(hold=f"after,/v1/updates,2,{marks['pi-2']}")   # ... stopped after its answer came back

        # -- round 1: every agent pulls v2, checks it and detects with it --------------------------
        # (>=: an agent done with round 1 may already pull v3 while another still checks v2)
        wait_for(lambda: all((a.status().get("fl_version") or 0) >= V2 for a in agents), "every agent on v2", agents)
        n_before = {a.name: len(a.events) for a in agents}
        wait_for(lambda: rounds(agg).get(1, (None,))[0] == "closed", "round 1 closed", agents)
        assert rounds(agg)[1] == ("closed", 3, V3)  # three updates made v3 (nobody may join round 2 yet)
        # nobody is picked for round 2 (the budget), yet every agent pulls v3: the aggregator's wait
        # answer names it (docs/protocol.md), and each agent checks it and detects with it
        wait_for(lambda: all(a.status().get("fl_version") == V3 for a in agents), "every agent on v3", agents)
        for a in agents:
            st = a.status()
            assert st["version"] == f"kws-dscnn-s v{V3}" and st["rejected"] == [] and st["rollbacks"] == 0, st
            assert st["last_health"]["version"] == V3 and st["last_health"]["ok"], st
            assert st["last_health"]["accuracy"] == 1.0, st  # the known inputs are named right
            assert st["rounds_joined"] == 1 and st["bytes_uploaded"] > 0, st
        wait_for(lambda: all(len(a.events) > n_before[a.name] for a in agents), "detections on v2, v3", agents)
        assert {e["keyword"] for a in agents for e in a.events} == {"hey edge"}

        # -- the operator publishes a broken v4: signed, but its head names every class as the next --
        cur = dict(np.load(agg / "models" / f"v{V3}.npz"))
        broken = {**cur, "classifier.w": np.roll(cur["classifier.w"], 1, axis=1),
                  "classifier.b": np.roll(cur["classifier.b"], 1)}
        with pytest.raises(EdgelearnError, match="in use by"):  # not beside a serving aggregator
            publish_version(agg, broken)
        server.kill()  # kill -9: the aggregator's state survives it too
        server.wait()
        with pytest.raises(EdgelearnError, match="same tensors"):
            publish_version(agg, {"classifier.w": cur["classifier.w"]})
        assert publish_version(agg, broken, note="a broken head, for the test") == V4
        set_budget(agg, 3)  # two more rounds per device
        server = start_aggregator(agg, port)
        assert rounds(agg)[2][0] == "failed"  # round 2 (v3, joined by nobody) was superseded

        # -- round 3 trains v4: pi-0 uploads and rejects v4; pi-1 holds before its upload, pi-2 after --
        checked = lambda a: (a.status().get("last_health") or {}).get("version") == V4  # noqa: E731
        wait_for(lambda: checked(a0), "pi-0 checks v4", agents)
        st = a0.status()
        assert st["version"] == f"kws-dscnn-s v{V3}" and st["fl_version"] == V3 and st["rejected"] == [V4], st
        assert st["rollbacks"] == 1 and BundleStore(a0.state / "fl" / "store", trusted).current().version == V3
        wait_for(lambda: marks["pi-1"].exists() and marks["pi-2"].exists(), "pi-1 and pi-2 held mid-round", agents)
        in_round3 = {d for (d,) in db(agg, "SELECT device_id FROM updates WHERE round_id=3")}
        assert in_round3 == {"pi-0", "pi-2"} and rounds(agg)[3][:2] == ("open", 2)  # pi-1's never left the device
        last = a0.status()["last_health"]
        assert last["version"] == V4 and not last["ok"] and last["accuracy"] == 0.0, last
        seen = {a.name: a.status() for a in (a1, a2)}
        for a in (a1, a2):
            a.kill9()
            st = read_status(a.state)  # every file old or new: the state reads
            assert st is not None and st["fl_version"] == V3, st
            store = BundleStore(a.state / "fl" / "store", trusted)
            assert store.current().version == V4  # installed by the round, never checked
            assert json.loads((a.state / "fl" / "fl_state.json").read_text())["seq"] == 2
            assert st["rounds_joined"] == seen[a.name]["rounds_joined"] == 1
        n_before = {a.name: len(a.events) for a in agents}

        # -- both come back on v3 (v4 checked at start and rolled back), pi-1 completes round 3 -----
        # pi-2 first: round 3 stays open until pi-1 is back, so pi-2 learns from its check-in that its
        # round-3 update arrived (and counts it, once); then pi-1, as systemd restarts it (no hold)
        t_restart = time.time()
        a2.start()
        wait_for(lambda: a2.status().get("pid") == a2.proc.pid
                 and (a2.status().get("last_checkin") or {}).get("time", 0) > t_restart, "pi-2 checks in", (a0, a2))
        st = a2.status()
        assert st["last_checkin"]["action"] == "wait", st  # told it contributed already: it sends nothing
        assert st["last_round"] == 3 and st["rounds_joined"] == 2, st  # and counts that update, once
        assert st["version"] == f"kws-dscnn-s v{V3}" and st["fl_version"] == V3 and st["rejected"] == [V4], st
        assert not st["last_health"]["ok"] and st["rollbacks"] == 1, st
        a1.start()  # it may run through rounds 3 and 4 before the next look: only what lasts is asserted
        wait_for(lambda: a1.status().get("pid") == a1.proc.pid and V4 in a1.status().get("rejected", []),
                 "pi-1 restarted and rejected v4", agents)
        st = a1.status()
        assert st["rejected"] == [V4] and st["rollbacks"] == 1 and st["version"] != f"kws-dscnn-s v{V4}", st
        wait_for(lambda: rounds(agg).get(3, (None,))[0] == "closed", "round 3 closed", agents)
        assert rounds(agg)[3] == ("closed", 3, V5)

        # -- round 4 trains v5 (round 3's update of v4), all three join it, the killed ones included;
        # it names the known inputs right again, so every agent checks it against v3 and uses it -----
        wait_for(lambda: rounds(agg).get(4, (None,))[0] == "closed", "round 4 closed", agents)
        assert rounds(agg)[4][:2] == ("closed", 3)
        # (>= v5: a version published after it is pulled from the wait answers as soon as it exists)
        wait_for(lambda: all((a.status().get("last_health") or {}).get("version", 0) >= V5
                             and a.status()["last_health"]["ok"] for a in agents), "every agent checks v5", agents)
        for a in agents:
            st = a.status()
            assert st["last_health"]["ok"] and st["fl_version"] >= V5 and st["rejected"] == [V4], st
            # the running version stayed in the store whenever the client installed one (it keeps two):
            # pi-1 re-installed the rejected v4 to train round 3 on it, and the agent dropped it again
            # (the client may have installed a newer one since, which the agent is still checking: the
            # running version is then the store's previous)
            ptr = BundleStore(a.state / "fl" / "store", trusted).pointer()
            running = f"kws-dscnn-s-v{st['fl_version']}"
            assert (ptr["current"] == running or ptr.get("previous") == running) \
                and f"kws-dscnn-s-v{V4}" not in ptr.values(), (a.name, ptr, st["fl_version"])
        wait_for(lambda: all(len(a.events) > n_before[a.name] for a in agents), "detections after the restarts",
                 agents)
        # every device's update counted once in each closed round: 3 updates a round, 3 rounds a device
        joined = dict(db(agg, "SELECT device_id, rounds_joined FROM devices"))
        assert joined == {n: 3 for n in NAMES}, joined
        assert db(agg, "SELECT round_id, COUNT(*) FROM selections GROUP BY round_id") == [(1, 3), (3, 3), (4, 3)]
        seqs = dict(db(agg, "SELECT device_id, last_seq FROM devices"))
        for a in agents:  # the aggregator's last accepted seq is the device's last reserved one
            assert json.loads((a.state / "fl" / "fl_state.json").read_text())["seq"] == seqs[a.name]
        assert seqs == {"pi-0": 3, "pi-1": 4, "pi-2": 3}  # pi-1's unsent seq 2 was never reused
        assert refusals(port) == {}  # nothing was resent: no AlreadyContributed, no replayed seq
        ok = True
    finally:
        rcs = {}
        for a in agents:
            if a.proc is not None and a.proc.poll() is None:
                if ok:
                    rcs[a.name] = a.finish()
                else:
                    a.kill9()
        server.kill()
        server.wait()
    assert rcs == {n: 0 for n in NAMES}, {a.name: a.stderr_tail() for a in agents}
    for a in agents:
        st = read_status(a.state)
        assert st["state"] == "stopped" and V4 in st["rejected"] and st["version"] != f"kws-dscnn-s v{V4}", st
        # rounds 1, 3 and 4, each counted once: pi-2 learnt at its restart that its round-3 update had arrived
        assert st["rounds_joined"] == 3 and st["last_round"] == 4, st
        assert Device(a.state, BundleStore(a.state / "fl" / "store", trusted).current()).status()["keywords"] \
            == ["hey edge"]  # the enrolled keyword moved with every version detection used
