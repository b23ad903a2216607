"""Enrolment: errors for bad clips and names, state bound to its bundle, survives SIGKILL mid-save."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edge.bundle import load_bundle
from edge.detect import Detector, detect_pcm
from edge.enroll import DeviceState, StateError, enroll
from edge.errors import EdgelearnError
from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def km():
    return KeywordModel(load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys()))


@pytest.fixture(scope="module")
def clips():
    from host.data import synth

    voice = synth.Voice("flite", "rms")  # the never-trained-on synthesizer
    return synth.render(voice, [("hey robot", r, p) for r, p in
                                ((0.9, 1.0), (1.0, 0.95), (1.1, 1.05), (0.95, 1.1), (1.05, 0.9), (1.0, 1.0),
                                 (0.97, 1.03), (1.03, 0.97))])


def test_enrol_then_detect_in_a_stream(km, clips, tmp_path):
    state = DeviceState.open(tmp_path, km.bundle)
    rep = enroll(km, state, "Hey  Robot", clips[:5])
    from edge.enroll import FAR_TARGET, negative_bank

    n_bank = len(negative_bank(km.bundle))  # the quantile's own step: one bank window
    assert rep["keyword"] == "hey robot" and rep["used"] == 5
    assert rep["bank_false_accept_rate"] <= FAR_TARGET + 1.0 / n_bank
    state = DeviceState.open(tmp_path, km.bundle)  # reloaded from disk
    assert state.names() == ["hey robot"]
    rng = np.random.default_rng(3)
    found = 0
    for held_out in clips[5:]:  # three held-out renders; the two stages miss about 1 in 10 on the bench
        held_out = held_out.astype(np.float32)
        x = np.concatenate([np.zeros(20000, np.float32), held_out, np.zeros(24000, np.float32)])
        x += rng.standard_normal(x.size).astype(np.float32) * 50
        events = detect_pcm(Detector(km, custom=state.custom()), x.astype(np.int16))
        assert [e["keyword"] for e in events] in ([], ["hey robot"])  # nothing else, at most once
        if events:
            found += 1
            assert abs(events[0]["time_s"] - (20000 + len(held_out)) / 16000) < 0.3
    assert found >= 2


def test_bad_clips_and_names_change_nothing(km, clips, tmp_path):
    state = DeviceState.open(tmp_path, km.bundle)
    enroll(km, state, "hey robot", clips[:5])
    before = (tmp_path / "keywords.json").read_bytes()
    cases = [
        (dict(name="other", clips=clips[:2]), "need 3-10"),
        (dict(name="other", clips=clips[:5] * 3), "need 3-10"),
        (dict(name="yes", clips=clips[:5]), "base keyword"),
        (dict(name="hey robot", clips=clips[:5]), "already enrolled"),
        (dict(name="bad/name!", clips=clips[:5]), "not usable"),
        (dict(name="other", clips=clips[:4] + [clips[0][:2000]]), "too short|of speech"),
        (dict(name="other", clips=clips[:4] + [np.zeros(16000, np.int16)]), "silent"),
        (dict(name="other", clips=clips[:4] + [np.zeros(16000 * 3, np.int16)]), "too long"),
    ]
    for kw, msg in cases:
        with pytest.raises(EdgelearnError, match=msg):
            enroll(km, DeviceState.open(tmp_path, km.bundle), kw["name"], kw["clips"])
        assert (tmp_path / "keywords.json").read_bytes() == before


def test_outlier_clip_is_reported(km, clips, tmp_path):
    from host.data import synth

    [odd] = synth.render(synth.Voice("flite", "awb"), [("umbrella thunder", 1.0, 1.0)])
    rep = enroll(km, DeviceState.open(tmp_path, km.bundle), "hey robot", clips[:5] + [odd])
    assert [o["clip"] for o in rep["outliers"]] == ["clip 6"] and rep["used"] == 5


def test_wrong_format_wav_is_a_clear_cli_error(tmp_path):
    bad = tmp_path / "a.wav"
    bad.write_bytes(b"RIFF....WAVEjunk")
    res = subprocess.run([sys.executable, "-m", "edge.cli", "device", "enroll", "--state", str(tmp_path / "s"),
                          "--keyword", "x", "--wav", str(bad), str(bad), str(bad)],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 2 and "a.wav" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "s" / "keywords.json").exists()


def test_state_from_another_bundle_is_refused(km, tmp_path):
    (tmp_path / "keywords.json").write_text(json.dumps(
        {"format": 1, "model_id": km.bundle.model_id, "model_version": km.bundle.version + 7, "keywords": []}))
    with pytest.raises(StateError, match="belongs to bundle .* v8|re-enrol"):
        DeviceState.open(tmp_path, km.bundle)
    (tmp_path / "keywords.json").write_text("{not json")
    with pytest.raises(StateError, match="unreadable"):
        DeviceState.open(tmp_path, km.bundle)


SAVER = """
import sys, os, time, json
sys.path.insert(0, {root!r})
from edge import store
from edge.enroll import DeviceState
real_replace = os.replace
def slow_replace(a, b):
    print("writing", flush=True)
    time.sleep(30)          # the kill lands here: the temp file is written, not yet renamed
    real_replace(a, b)
store.os.replace = slow_replace
st = DeviceState({state!r}, {mid!r}, {ver}, [{{"name": "second", "w": [0.0] * 64, "b": 0.0, "threshold": 0.9}}])
st.save()
"""


def test_kill_during_save_keeps_the_old_state(km, clips, tmp_path):
    from pathlib import Path as P

    st = DeviceState.open(tmp_path, km.bundle)
    enroll(km, st, "hey robot", clips[:5])
    before = (tmp_path / "keywords.json").read_bytes()
    code = SAVER.format(root=str(ROOT), state=str(P(tmp_path)), mid=km.bundle.model_id, ver=km.bundle.version)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (tmp_path / "keywords.json").read_bytes() == before
    again = DeviceState.open(tmp_path, km.bundle)
    assert again.names() == ["hey robot"] and again.custom() is not None
    # the orphaned temp file does not confuse the next save
    enroll(km, again, "banana split", clips[:5])
    assert DeviceState.open(tmp_path, km.bundle).names() == ["hey robot", "banana split"]


def test_kill_at_random_moments_never_corrupts(km, tmp_path):
    code = ("import sys; sys.path.insert(0, %r)\nfrom edge.enroll import DeviceState\n"
            "i = 0\nwhile True:\n    i += 1\n"
            "    DeviceState(%r, %r, %d, [{'name': 'k%%d' %% j, 'w': [0.1] * 64, 'b': 0.0, 'threshold': 0.9}"
            " for j in range(i %% 50)]).save()\n") % (str(ROOT), str(tmp_path), km.bundle.model_id, km.bundle.version)
    for delay in (0.3, 0.45, 0.6):
        proc = subprocess.Popen([sys.executable, "-c", code])
        time.sleep(delay)
        proc.kill()
        proc.wait()
        if (tmp_path / "keywords.json").exists():
            DeviceState.open(tmp_path, km.bundle)  # always a complete file
