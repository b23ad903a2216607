"""The device agent (``edgelearn device run``, edge/agent.py): detections as JSON lines and hooks,
restarts that drop nothing and repeat nothing, adaptation in the background, a real aggregator on
loopback (a round joined, the new version pulled, health-checked and used; a broken one rolled
back), and a kill -9 mid-run that leaves the state usable."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import pytest
from agent_helpers import CLI, ROOT, adapting_agent, federate, free_port, signed_version, stream, trusted_keys
from devstate_helpers import make_data, make_keyword_clips, make_sysfs

from edge.agent import Agent, AgentConfig, health_check, read_status
from edge.device import CHUNK, Device


@pytest.fixture
def enrolled(tmp_path):
    """A state with the buzz keyword enrolled, and the stream that says it."""
    clips = make_keyword_clips(tmp_path / "kwclips")
    Device(tmp_path / "st").enroll("hey edge", clips)
    return tmp_path / "st", stream(tmp_path, copies=2)


def chunked(pcm):
    return [pcm[i:i + CHUNK] for i in range(0, len(pcm), CHUNK)]


def reference(state, pcm):
    return list(Device(state).detect(pcm, replay=False))


def test_stdin_run_prints_each_detection_and_runs_the_hook(enrolled, tmp_path):
    state, pcm = enrolled
    want = reference(state, pcm)
    assert len(want) >= 2
    hooks = tmp_path / "hooks.txt"
    r = subprocess.run(CLI + ["device", "run", "--state", str(state), "--stdin", "--on-detect",
                              f"cat >> {hooks}; echo \"$EDGELEARN_KEYWORD\" >> {hooks}.kw"],
                       input=pcm.tobytes(), capture_output=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr.decode()
    got = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert got == want
    # every hook ran once with its event and was waited for at exit; hooks run side by side (never
    # waited for while detecting), so two may append in either order
    by_time = lambda evs: sorted(evs, key=lambda e: e["time_s"])  # noqa: E731
    assert by_time(json.loads(line) for line in hooks.read_text().splitlines()) == by_time(want)
    assert sorted((tmp_path / "hooks.txt.kw").read_text().split("\n")[:-1]) == sorted(e["keyword"] for e in want)
    st = read_status(state)
    assert st["state"] == "stopped" and st["detections"] == len(want)
    assert st["audio_s"] == pytest.approx(len(pcm) / 16000, abs=0.1)
    assert Device(state).status()["agent"]["detections"] == len(want)  # `device status` shows it


def test_a_restart_on_every_chunk_drops_nothing_and_repeats_nothing(enrolled, monkeypatch):
    """The detector restarts on the last second of audio whenever the model changes: with a
    restart every few chunks the events are those of one uninterrupted detector."""
    state, pcm = enrolled
    want = reference(state, pcm)
    for every in (1, 7):
        out = []
        agent = Agent(state, AgentConfig(source=chunked(pcm)))
        agent._emit = lambda ev: out.append(ev)  # noqa: B023
        n = {"i": 0}

        def tick(agent=agent, n=n, every=every):
            n["i"] += 1
            agent._restart = n["i"] % every == 0

        monkeypatch.setattr(agent, "_tick", tick)
        agent.run()
        assert [e["keyword"] for e in out] == [e["keyword"] for e in want], every
        assert [e["time_s"] for e in out] == pytest.approx([e["time_s"] for e in want], abs=0.021), every


def test_adapts_in_the_background_without_stopping_detection(enrolled, tmp_path):
    state, pcm = enrolled
    data, sysfs = make_data(tmp_path / "data"), make_sysfs(tmp_path / "sys")
    cfg = AgentConfig(source=None, data=data, adapt_every_s=10 ** 6, status_every_s=0)
    out, seen = [], {"adapting": False}

    def slow_audio():  # audio keeps coming until the run has finished (bounded: 10 minutes)
        t0 = time.monotonic()
        i = 0
        while time.monotonic() - t0 < 600:
            yield pcm[i % len(pcm): i % len(pcm) + CHUNK]
            i += CHUNK
            seen["adapting"] |= agent.child is not None
            if agent.status["last_adapt"] is not None and i > len(pcm):
                return
            time.sleep(0.002)

    cfg.source = slow_audio()
    agent = Agent(state, cfg, sysfs_root=sysfs)
    agent._emit = out.append
    agent.run()
    assert seen["adapting"]
    last = read_status(state)["last_adapt"]
    assert last["status"] == "done" and last["version"] == 1, last
    assert Device(state).status()["adapt"]["active"] == "default"
    assert out, "detection kept reporting while and after the run"


def test_print_unit_and_bad_options_are_one_sentence(tmp_path):
    r = subprocess.run(CLI + ["device", "run", "--state", str(tmp_path / "st"), "--print-unit"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0
    assert "Restart=on-failure" in r.stdout and f"--state {(tmp_path / 'st').resolve()} --mic" in r.stdout
    r = subprocess.run(CLI + ["device", "run", "--state", str(tmp_path / "st"), "--stdin",
                              "--aggregator", "http://127.0.0.1:9"], capture_output=True, text=True, cwd=ROOT,
                       timeout=120, input="")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--device-id" in r.stderr
    r = subprocess.run(CLI + ["device", "run", "--state", str(tmp_path / "st"), "--stdin", "--data",
                              str(tmp_path / "nope")], capture_output=True, text=True, cwd=ROOT, timeout=120, input="")
    assert r.returncode == 2 and "is not a directory" in r.stderr and "Traceback" not in r.stderr


def test_kill_9_while_adapting_leaves_a_usable_state(enrolled, tmp_path):
    state, pcm = enrolled
    data, sysfs = make_data(tmp_path / "data"), make_sysfs(tmp_path / "sys")
    p = adapting_agent(state, pcm, data, sysfs)
    try:
        time.sleep(0.5)
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # the agent and its training child, at once
        p.wait()
    st = Device(state).status()  # every file old or new: the state reads
    assert st["keywords"] == ["hey edge"]
    res = Device(state).adapt(data, force=True)  # and the next run finishes what the crash left
    assert res["status"] == "done"
    assert reference(state, pcm), "the enrolled keyword is still heard"


# -- against a real aggregator on loopback ------------------------------------------------------

@pytest.fixture
def aggregator(tmp_path):
    from aggregator_helpers import start

    from host.aggregator.config import AggregatorConfig
    from host.aggregator.inprocess import make_state
    from host.aggregator.setup import write_device_key

    cfg = AggregatorConfig(clients_per_round=1, overselect=1.0, eval_tolerance=1.0, round_timeout=60)
    agg, keys = make_state(tmp_path, cfg, n_devices=1, prefix="pi-")
    key_file = write_device_key(tmp_path / "devkeys", "pi-0", keys["pi-0"])
    trusted = trusted_keys(agg, tmp_path / "trusted")
    port = free_port()
    proc = start(agg, port)
    try:
        yield {"url": f"http://127.0.0.1:{port}", "state": agg, "key": key_file, "trusted": trusted}
    finally:
        proc.kill()
        proc.wait()


def test_joins_a_round_then_pulls_checks_and_uses_the_new_version(enrolled, tmp_path, aggregator):
    state, pcm = enrolled
    data = make_data(tmp_path / "data")
    trusted = aggregator["trusted"]
    agent, versions = federate(state, pcm, data, aggregator)
    st = read_status(state)
    assert st["rounds_joined"] >= 1 and st["bytes_uploaded"] > 0, st
    assert versions[-1] > versions[0]  # the federation published a new version and detection runs it
    now = agent.device.bundle.version
    assert st["version"].endswith(f" v{now}") and now >= versions[-1] and st["last_health"]["ok"]
    assert Device(state, agent.device.bundle).status()["keywords"] == ["hey edge"]  # carried to the new version
    from edge.fl import load_head

    km, head = agent.device.models()  # detection scores with the head the federation trained
    assert head is not None and set(head.base) >= set(load_head(agent.device.bundle))
    # a restart starts on the installed version, not the shipped one
    again = Agent(state, AgentConfig(source=[], aggregator=aggregator["url"], device_id="pi-0",
                                     device_key=aggregator["key"]), trusted_keys=trusted)
    assert again.device.bundle.version == now


def test_a_version_that_fails_the_health_check_is_rolled_back(enrolled, tmp_path, aggregator):
    """A signed version whose keyword model is another network (the backbone file in the encoder's
    place) does not run on known inputs: rolled back, and the running version stays."""
    state, _ = enrolled
    data = make_data(tmp_path / "data")
    trusted = aggregator["trusted"]
    agent = Agent(state, AgentConfig(source=[], data=data, aggregator=aggregator["url"], device_id="pi-0",
                                     device_key=aggregator["key"]), trusted_keys=trusted)
    store = agent._fl_store()
    for version, broken in ((5, False), (6, True)):
        store.install(signed_version(tmp_path, version, broken, aggregator["state"]))
        agent._switch_version(version)
        assert agent.status["last_health"]["ok"] != broken, agent.status["last_health"]
    assert agent.device.bundle.version == 5  # the broken one never ran
    assert store.current().version == 5
    assert agent.status["rollbacks"] == 1 and not agent.status["last_health"]["ok"]
    assert "does not run" in agent.status["last_health"]["reason"]
    assert health_check(store.current())["ok"]


@pytest.mark.parametrize("garbage", [b"not json", b"[1, 2]", b'{"detections": "many", "rejected": 7, "last_adapt": 3}'])
def test_a_damaged_agent_json_starts_afresh(enrolled, garbage):
    state, pcm = enrolled
    (state / "agent.json").write_bytes(garbage)
    out = []
    agent = Agent(state, AgentConfig(source=chunked(pcm)))
    agent._emit = out.append
    agent.run()
    st = read_status(state)
    assert st["state"] == "stopped" and st["rejected"] == [] and st["last_adapt"] is None


def test_a_restart_checks_what_was_installed_unchecked_and_drops_a_rejected_one(enrolled, tmp_path, aggregator):
    """What a kill -9 can leave in the store: a version installed by a round but never checked (it is
    checked at start, before detection uses it), and a rejected version re-installed to train a
    round on (the running one is made current again, so a later install cannot prune it)."""
    state, pcm = enrolled
    data = make_data(tmp_path / "data")
    trusted = aggregator["trusted"]
    cfg = dict(aggregator=aggregator["url"], device_id="pi-0", device_key=aggregator["key"])
    agent = Agent(state, AgentConfig(source=[], data=data, **cfg), trusted_keys=trusted)
    store = agent._fl_store()
    store.install(signed_version(tmp_path, 5, False, aggregator["state"]))
    agent._switch_version(5)
    agent._write_status()
    store.install(signed_version(tmp_path, 6, True, aggregator["state"]))  # ... and the kill -9, before any check
    again = Agent(state, AgentConfig(source=chunked(pcm), data=data, **cfg), trusted_keys=trusted)
    assert again.device.bundle.version == 5 and again.status["rejected"] == [6]
    assert store.pointer()["current"] == "kws-dscnn-s-v5"
    again._write_status()
    store.install(signed_version(tmp_path, 6, True, aggregator["state"]))  # a round trains on it; the kill -9
    third = Agent(state, AgentConfig(source=chunked(pcm), data=data, **cfg), trusted_keys=trusted)
    assert third.device.bundle.version == 5 and third.status["rollbacks"] == 1  # not checked again
    assert store.pointer() == {"current": "kws-dscnn-s-v5", "previous": None}
    out = []
    third._emit = out.append
    third.run()
    want = list(Device(state, third.device.bundle).detect(pcm, replay=False))
    assert [e["keyword"] for e in out] == [e["keyword"] for e in want] != []
