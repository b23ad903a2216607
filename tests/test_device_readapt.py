"""A device that adapted locally, and a newer federated version (issue 18): detection hears with the
new version's head at once (the adapted context rebased onto it) and the agent adapts the context
again on that version from its labelled clips; a kill -9 in between leaves a working state.

The new version's head is the shipped classifier with the outputs of ``_silence_`` and ``left``
swapped: on quiet noise the shipped model (adapted or not) says ``_silence_`` over ``left``, a
model that scores with the new head says ``left`` over ``_silence_``. The local clips are loud
noise labelled ``yes``/``no``, which neither model names so without adapting."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from agent_helpers import CLI, ROOT, free_port
from aggregator_helpers import BASE_VERSION, FIRST
from devstate_helpers import make_data, make_sysfs

from edge.agent import Agent, AgentConfig, read_status
from edge.bundle import load_bundle
from edge.device import CHUNK, Device, base_models, detection_info
from edge.errors import EdgelearnError

# The versions this file names v1..v4 (their numbers when the shipped bundle was version 1): the shipped
# bundle itself, the federation's first version (base + 1, as the aggregator publishes it), and two later ones.
V1, V2, V3, V4 = BASE_VERSION, FIRST, FIRST + 1, FIRST + 2


def federated_version(tmp: Path, version: int, params: dict, operating: dict | None = None):
    """The shipped bundle as federated version ``version`` with head ``params`` (``head.npz``, as
    the aggregator publishes it: ``trainable.strategy == "federated-head"``), signed with a test
    key; returns (its directory, the trusted-keys directory: the release key and the test key)."""
    from host.bundle import sign_bundle
    from host.keys import generate_keypair

    keys = tmp / "keys"
    if not (keys / "rel.key").exists():
        generate_keypair(keys, "rel")
        shutil.copy(ROOT / "models" / "keys" / "release.pub", keys / "release.pub")
    b = tmp / f"fed-v{version}"
    shutil.copytree(ROOT / "models" / "kws-dscnn-s", b)
    (b / "manifest.sig").unlink()
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v, np.float32) for k, v in params.items()})
    raw = buf.getvalue()
    (b / "head.npz").write_bytes(raw)
    m = json.loads((b / "manifest.json").read_text())
    m["version"] = version
    m["files"]["head.npz"] = {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    m["trainable"] = {**m["trainable"], "strategy": "federated-head", "file": "head.npz", "tensors": sorted(params)}
    if operating is not None:
        m["extra"] = {**m.get("extra", {}), "operating": operating}
    (b / "manifest.json").write_text(json.dumps(m))
    sign_bundle(b, keys / "rel.key", refresh=True)
    return b, keys


def swapped_head(bundle, a="_silence_", b="left") -> dict:
    from edge.adapt import classifier_from_bundle

    head = classifier_from_bundle(bundle)
    i, j = bundle.labels.index(a), bundle.labels.index(b)
    for k in ("classifier.w", "classifier.b"):
        h = head[k].copy()
        h[..., [i, j]] = h[..., [j, i]]
        head[k] = h
    return head


def posteriors(models, pcm) -> np.ndarray:
    km, head = models
    emb, p = km.infer(km.features(pcm))
    return p if head is None else head.probs(emb)


@pytest.fixture
def adapted(tmp_path):
    """A state adapted (bias-only, as the agent runs it) on the shipped model; its clips; v2."""
    data = make_data(tmp_path / "data")
    dev = Device(tmp_path / "st")
    assert dev.adapt(data, force=True)["status"] == "done"
    v2_dir, keys = federated_version(tmp_path, V2, swapped_head(dev.bundle))
    rng = np.random.default_rng(3)
    quiet = np.stack([(rng.standard_normal(16000) * a).astype(np.int16) for a in (20, 50, 100, 200)])
    from edge.device_data import load_labelled

    clips = load_labelled(dev.keyword_model(), data)
    return {"state": tmp_path / "st", "data": data, "v2": load_bundle(v2_dir, trusted_keys=keys),
            "v2_dir": v2_dir, "keys": keys, "quiet": quiet, "clips": clips, "labels": list(dev.bundle.labels)}


def hears_new_head(models, s) -> bool:
    """The swapped outputs: ``left`` over ``_silence_`` on every quiet-noise window."""
    p = posteriors(models, s["quiet"])
    return bool(np.all(p[:, s["labels"].index("left")] > p[:, s["labels"].index("_silence_")]))


def personal(models, s) -> np.ndarray:
    """Each local clip's posterior of its own label."""
    w, y = s["clips"]
    return posteriors(models, w)[np.arange(len(y)), y]


def test_the_new_head_is_heard_at_once_and_the_context_adapted_again_on_it(adapted):
    s = adapted
    dev, v2 = Device(s["state"]), s["v2"]
    assert not hears_new_head(dev.models(), s)  # the adapted shipped model
    new_base = personal(base_models(v2), s)
    assert new_base.max() < 0.05 and personal(dev.models(), s).min() > 0.2  # what adapting learned
    assert detection_info(dev.bundle, s["state"]) == {"version": V1, "federated_head": False, "context": "default",
                                                      "context_version": 1, "adapted_on": V1, "rebased": False}
    assert dev.carry_to(v2) == {"keywords": 0, "contexts": 1, "rederived": [], "voices_dropped": []}
    on2 = Device(s["state"], v2)
    # at once: the new head, with the personal offsets (before: the shipped classifier, v2 ignored)
    assert hears_new_head(on2.models(), s)
    assert personal(on2.models(), s).min() > 4 * new_base.max()
    info = on2.status()["detection"]
    assert info == {"version": V2, "federated_head": True, "context": "default", "context_version": 1,
                    "adapted_on": V1, "rebased": True}
    # adapted again on v2: trained through v2's head, and no longer rebased
    res = on2.adapt(s["data"], force=True)
    assert res["status"] == "done" and res["version"] == 2  # the context's version (its second save), not the bundle's
    assert detection_info(v2, s["state"])["adapted_on"] == V2 and not detection_info(v2, s["state"])["rebased"]
    assert hears_new_head(on2.models(), s) and personal(on2.models(), s).min() > 4 * new_base.max()
    # the tail a context adapts on v2 is v2's model itself (the head at its end), not tail.npz's classifier
    from edge.adapt import TailModel

    tm = TailModel(v2)
    assert np.abs(tm.infer(tm.features(s["quiet"]))[1] - posteriors(base_models(v2), s["quiet"])).max() < 0.01


@pytest.mark.parametrize("strategy,train_dw", [("full", True), ("bias-only", False), ("bias-only", True),
                                               ("lora", False)])
def test_training_through_a_federated_heads_projection_has_the_true_gradients(strategy, train_dw):
    """The tail of a federated version (relu(e P + p) before the classifier): every trained
    tensor's gradient against central finite differences of the loss, in float64."""
    from edge.adapt.conv import ConvTail
    from edge.adapt.convtrain import ConvTrainer
    from edge.adapt.trainer import _xent

    rng = np.random.default_rng(0)
    c, k = 8, 5
    shapes = {"dw4_w": (3, 3, c), "dw4_b": (c,), "pw4_w": (c, c), "pw4_b": (c,), "cls_w": (c, k), "cls_b": (k,),
              "proj_w": (c, c), "proj_b": (c,)}
    base = {n: rng.standard_normal(sh) * (0.3 if n.startswith(("dw4", "pw4")) else 1.0) for n, sh in shapes.items()}
    x, y = rng.standard_normal((4, 5, 3, c)), rng.integers(0, k, 4)
    tail = ConvTail(base, train_dw=train_dw)
    tr = ConvTrainer(tail, strategy, "sgd", forward_chunk=None)
    for n in tr.names:
        tail.delta[n] = tail.delta[n].astype(np.float64)
    tr.gradients(x, y)
    assert "proj_w" not in tr.names  # the head's projection stays as the federation trained it
    for n in tr.names:
        p = tail.delta[n]
        for idx in list(np.ndindex(p.shape))[:6]:
            old = p[idx]
            p[idx] = old + 1e-6
            up = _xent(tail.forward(x)[0], y, None)
            p[idx] = old - 1e-6
            down = _xent(tail.forward(x)[0], y, None)
            p[idx] = old
            assert tr.grads[n][idx] == pytest.approx((up - down) / 2e-6, rel=1e-4, abs=1e-7), (n, idx)


def test_an_adapted_context_detects_at_the_versions_operating_point(adapted, tmp_path):
    s = adapted
    op = {"thresholds": {"yes": 0.81, "no": 0.62}, "matched_to_version": V2}
    v3_dir, keys = federated_version(tmp_path, V3, swapped_head(Device(s["state"]).bundle), operating=op)
    v3 = load_bundle(v3_dir, trusted_keys=keys)
    Device(s["state"]).carry_to(v3)
    det, _ = Device(s["state"], v3).detector(replay=False)
    thr = dict(zip(det.names, det.thresholds.tolist()))
    assert thr["yes"] == pytest.approx(0.81) and thr["no"] == pytest.approx(0.62) and thr["up"] == pytest.approx(0.7)


def test_a_head_a_tail_cannot_end_in_is_refused_in_one_sentence(adapted, tmp_path):
    s = adapted
    head = swapped_head(Device(s["state"]).bundle)
    head["adapter.a"] = np.zeros((64, 4), np.float32)
    bad_dir, keys = federated_version(tmp_path, V4, head)
    dev = Device(s["state"])
    with pytest.raises(EdgelearnError) as e:
        dev.carry_to(load_bundle(bad_dir, trusted_keys=keys))
    msg = str(e.value)
    assert "head" in msg and "\n" not in msg and e.value.fix
    assert detection_info(Device(s["state"]).bundle, s["state"])["context_version"] == 1  # nothing moved
    assert not hears_new_head(Device(s["state"]).models(), s)


@pytest.mark.parametrize("delay", [0.0, 0.5])
def test_the_agent_adapts_again_on_a_new_version_and_a_kill_9_between_leaves_a_working_state(
        adapted, tmp_path, delay):
    """The agent starts with v2 installed but never checked (as a round leaves it): it checks it,
    detects through the rebased context, starts the re-adaptation at once; kill -9 of the agent and
    its training child ``delay`` s after the run started (at once: the child is still starting, so
    nothing of it is committed; later: before or after its commit); the state reads and hears with
    v2; the restarted agent finishes the re-adaptation on v2 and says so."""
    from edge.store import BundleStore
    from host.aggregator.setup import write_device_key

    s = adapted
    state, keys = s["state"], s["keys"]
    BundleStore(state / "fl" / "store", keys).install(s["v2_dir"])
    key = write_device_key(tmp_path / "devkeys", "pi-0", os.urandom(32))
    sysfs = make_sysfs(tmp_path / "sys")
    agg = ["--aggregator", f"http://127.0.0.1:{free_port()}", "--device-id", "pi-0", "--device-key", str(key)]
    pcm = (np.random.default_rng(0).standard_normal(CHUNK) * 100).astype(np.int16)
    p = subprocess.Popen(CLI + ["device", "run", "--state", str(state), "--stdin", "--data", str(s["data"]),
                                "--adapt-every", "0", "--sysfs-root", str(sysfs),
                                "--pubkey", str(keys), *agg],
                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                         start_new_session=True)
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 300:  # audio until the re-adaptation child runs on v2
            p.stdin.write(pcm.tobytes())
            p.stdin.flush()
            st = read_status(state)
            if st and st.get("adapting") and st.get("fl_version") == V2:
                break
            time.sleep(0.01)
        st = read_status(state)
        assert st["adapting"] and st["model"]["readapt_pending"] and st["model"]["adapted_on"] == V1, st
        assert st["last_health"]["ok"] and st["version"].endswith(f" v{V2}")
        time.sleep(delay)
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # the agent and its training child, at once
        p.wait()
    v2 = s["v2"]
    dev = Device(state, v2)
    info = dev.status()["detection"]  # old (rebased, adapted on v1) or new (adapted on v2): never broken
    assert info["version"] == V2 and info["adapted_on"] in (V1, V2) and info["rebased"] == (info["adapted_on"] == V1)
    if delay == 0:
        assert info["rebased"], "killed before the run could commit: the context adapted on v1, rebased"
    assert hears_new_head(dev.models(), s)
    out, done = [], {}

    def audio():  # until the restarted agent's adaptation run has ended (bounded: 5 minutes)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 300:
            yield pcm
            if agent.status["last_adapt"] and agent.status["last_adapt"].get("time", 0) > t_start:
                done.update(agent.status["last_adapt"])
                return
            time.sleep(0.005)

    t_start = time.time()
    agent = Agent(state, AgentConfig(source=audio(), data=s["data"], aggregator=agg[1], device_id="pi-0",
                                     device_key=key, status_every_s=0), trusted_keys=keys, sysfs_root=sysfs)
    assert agent.device.bundle.version == V2  # it ran v2 before the kill: used at once
    assert agent.status["model"]["readapt_pending"] == info["rebased"]
    agent._emit = out.append
    agent.run()
    assert done.get("status") == "done", done
    st = read_status(state)
    assert st["model"] == {"version": V2, "federated_head": True, "context": "default",
                           "context_version": st["model"]["context_version"], "adapted_on": V2, "rebased": False,
                           "readapt_pending": False}
    again = Device(state, v2)
    assert hears_new_head(again.models(), s)
    assert personal(again.models(), s).min() > 4 * personal(base_models(v2), s).max()


@pytest.fixture
def fleet_agent(adapted, tmp_path):
    """What an Agent on ``adapted``'s state needs to see v2 in its store: an aggregator address
    (nothing listens there: each check-in fails and is retried) and a device key."""
    from host.aggregator.setup import write_device_key

    key = write_device_key(tmp_path / "devkeys", "pi-0", os.urandom(32))
    return dict(aggregator=f"http://127.0.0.1:{free_port()}", device_id="pi-0", device_key=key)


def test_the_switch_mid_stream_drops_and_repeats_no_event(adapted, fleet_agent, tmp_path):
    """v2 arrives in the middle of a stream: the enrolled keyword (scored on the adapted tail's
    embedding, which the rebase keeps) is found exactly where one uninterrupted detector finds it,
    and detection ends on v2's head."""
    from agent_helpers import stream
    from devstate_helpers import make_keyword_clips

    from edge.store import BundleStore

    s = adapted
    state = s["state"]
    Device(state).enroll("hey edge", make_keyword_clips(tmp_path / "kwclips"))
    pcm = stream(tmp_path, copies=2)
    # the one base keyword reported is "stop": the head adapted on noise labelled "yes" and "no"
    # (make_data) calls the buzz "no" too, and a base candidate that opens first takes the event
    base = ["stop"]
    want = [e for e in Device(state).detect(pcm, replay=False, keywords=base) if e["keyword"] == "hey edge"]
    chunks = [pcm[i:i + CHUNK] for i in range(0, len(pcm), CHUNK)]
    half_s = len(chunks) // 2 * CHUNK / 16000
    assert min(e["time_s"] for e in want) < half_s < max(e["time_s"] for e in want)  # found on both sides
    agent = Agent(state, AgentConfig(source=chunks, data=s["data"], adapt=False, checkin_every_s=10 ** 6,
                                     keywords=base, **fleet_agent), trusted_keys=s["keys"])
    out, n = [], {"i": 0}
    agent._emit = out.append

    def tick():
        n["i"] += 1
        if n["i"] == len(chunks) // 2:
            BundleStore(state / "fl" / "store", s["keys"]).install(s["v2_dir"])
            agent._switch_version(V2)

    agent._tick = tick
    agent.run()
    assert agent.device.bundle.version == V2 and agent.status["model"]["rebased"]
    assert not agent.status["model"]["readapt_pending"]  # this agent does not adapt (--no-adapt)
    got = [e for e in out if e["keyword"] == "hey edge"]
    assert [e["time_s"] for e in got] == pytest.approx([e["time_s"] for e in want], abs=0.021)
    assert hears_new_head(agent.device.models(), s)


def test_a_run_in_progress_at_the_switch_is_stopped_and_the_next_one_adapts_on_the_new_version(
        adapted, fleet_agent, tmp_path):
    """A run that trains against v1 when v2 is used would commit a v1 context over the carried
    pointer: it is stopped, and the run that follows trains on v2."""
    from edge.store import BundleStore

    s = adapted
    state = s["state"]
    sysfs = make_sysfs(tmp_path / "sys")
    pcm = (np.random.default_rng(0).standard_normal(CHUNK) * 100).astype(np.int16)
    seen = {}

    def audio():  # bounded: 5 minutes
        t0 = time.monotonic()
        while time.monotonic() - t0 < 300:
            yield pcm
            if agent.child is not None and "stopped" not in seen:
                BundleStore(state / "fl" / "store", s["keys"]).install(s["v2_dir"])
                agent._switch_version(V2)
                seen["stopped"] = dict(agent.status["last_adapt"])
                assert agent.child is None
            elif "stopped" in seen and agent.status["last_adapt"].get("status") == "done":
                return
            time.sleep(0.005)

    agent = Agent(state, AgentConfig(source=audio(), data=s["data"], adapt_every_s=10 ** 6, checkin_every_s=10 ** 6,
                                     **fleet_agent), trusted_keys=s["keys"], sysfs_root=sysfs)
    agent._emit = lambda ev: None
    agent.run()
    assert seen["stopped"]["status"] == "stopped" and f"version {V2}" in seen["stopped"]["reason"]
    assert agent.status["last_adapt"]["status"] == "done"  # asked for at once, not after adapt_every_s
    info = detection_info(s["v2"], state)
    assert info["adapted_on"] == V2 and not info["rebased"]
    assert hears_new_head(Device(state, s["v2"]).models(), s)


def test_a_version_that_undoes_the_adaptation_fails_its_health_check(adapted, fleet_agent, tmp_path):
    """v3's head swaps ``yes`` with ``up`` and ``no`` with ``down``. The device's clips (loud noise
    labelled yes/no) are named by neither base model (``_silence_``), so comparing the two versions'
    base models (the check before 2026-12-03) let it through; detection would run the adapted context
    rebased onto it, which now names them up or down: rolled back, and detection stays on the
    running adapted model."""
    from edge.agent import health_check

    s = adapted
    state = s["state"]
    running = Device(state).bundle
    head = swapped_head(running, "yes", "up")
    a, b = running.labels.index("no"), running.labels.index("down")
    for k in ("classifier.w", "classifier.b"):  # and no <-> down
        head[k][..., [a, b]] = head[k][..., [b, a]]
    v3_dir, keys = federated_version(tmp_path, V3, head)
    agent = Agent(state, AgentConfig(source=[], data=s["data"], **fleet_agent), trusted_keys=keys)
    clips = agent.labelled_clips()
    before = health_check(running, clips, state_dir=state)
    assert before["ok"] and before["accuracy"] > 0.2  # what the device adapted to (base: 0, all _silence_)
    v3 = load_bundle(v3_dir, trusted_keys=keys)
    assert health_check(v3, clips, baseline=health_check(running, clips)["accuracy"])["ok"]  # the old comparison
    agent._fl_store().install(v3_dir)
    agent._switch_version(V3)
    h = agent.status["last_health"]
    assert not h["ok"] and h["accuracy"] < 0.5 and "the running version" in h["reason"], h
    assert agent.device.bundle.version == running.version and agent.status["rejected"] == [V3]
    after = Device(state)  # the adapt pointer never moved: the running path as it was
    assert detection_info(after.bundle, state)["context"] == "default"
    assert health_check(after.bundle, clips, state_dir=state)["accuracy"] == before["accuracy"]
