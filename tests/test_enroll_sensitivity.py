"""A custom keyword's sensitivity (issue 17): every level calibrated at enrolment (the first stage's
bank false-accept rate and the second stage's pass rate on distorted clips), kept in the state,
switched later without the clips, kept across versions; bad levels and old entries are clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge import verify as V
from edge.device import Device
from edge.enroll import SENSITIVITIES, CustomKeywords
from edge.errors import EdgelearnError

ROOT = Path(__file__).resolve().parents[1]
KW = "hey robot"


@pytest.fixture(scope="module")
def clips():
    from host.data import synth

    return synth.render(synth.Voice("flite", "rms"), [("hey robot", r, 1.0) for r in (0.9, 1.0, 1.1, 0.95, 1.05)])


@pytest.fixture()
def state(clips, tmp_path):
    st = tmp_path / "st"
    rep = Device(st).enroll(KW, clips, sensitivity="high")
    return st, rep


def entry(st) -> dict:
    return json.loads((st / "keywords.json").read_text())["keywords"][0]


def test_every_level_is_calibrated_and_ordered(state):
    st, rep = state
    assert rep["sensitivity"] == "high" and set(rep["sensitivities"]) == set(SENSITIVITIES)
    e = entry(st)
    low, high = e["sensitivities"]["low"], e["sensitivities"]["high"]
    # first stage: fewer bank windows over a low threshold, more over a high one (never under 0.5)
    assert low["threshold"] >= e["threshold"] >= high["threshold"] >= 0.5
    one = 1 / len(np.load(Device(st).bundle.path("negatives.npy")))  # one bank window: the quantile's step
    assert low["bank_false_accept_rate"] <= SENSITIVITIES["low"][0] + one
    assert high["bank_false_accept_rate"] <= SENSITIVITIES["high"][0] + one
    if high["threshold"] > 0.5:  # not held up by the floor: the quantile itself
        assert high["bank_false_accept_rate"] >= SENSITIVITIES["high"][0] - one
    # what `device sensitivity` shows: every level's bank rate, the default's too, in order
    shown = rep["sensitivities"]
    assert shown["medium"]["bank_false_accept_rate"] == e["bank_false_accept_rate"]
    assert shown["low"]["bank_false_accept_rate"] <= e["bank_false_accept_rate"] <= shown["high"]["bank_false_accept_rate"]
    # second stage: the same noise ranges, distances ordered the same way at every level
    quiet = {r: t for r, t in e["verify"]["levels"]}
    for lo, hi in zip(low["verify_levels"], high["verify_levels"]):
        assert lo[0] == hi[0] and lo[0] in quiet
        assert lo[1] <= quiet[lo[0]] <= hi[1]
    assert any(lo[1] < hi[1] for lo, hi in zip(low["verify_levels"], high["verify_levels"]))


def test_the_detector_uses_the_chosen_level(state):
    st, _ = state
    e = entry(st)
    km = Device(st).keyword_model()
    ck = CustomKeywords([e], bundle=km.bundle)
    assert ck.thresholds[0] == pytest.approx(e["sensitivities"]["high"]["threshold"])
    assert ck.verify_levels[0] == e["sensitivities"]["high"]["verify_levels"]
    res = Device(st).sensitivity(KW, "low")
    assert res["sensitivity"] == "low" and entry(st)["sensitivity"] == "low"
    ck = CustomKeywords([entry(st)], bundle=km.bundle)
    assert ck.thresholds[0] == pytest.approx(e["sensitivities"]["low"]["threshold"])
    # a window exactly at the high level's second-stage limit passes at high, not at low
    feats = np.zeros((49, 10), np.float32)
    hi = float(V.threshold_at(e["sensitivities"]["high"]["verify_levels"], feats, e["verify"]["version"]))
    lo = float(V.threshold_at(e["sensitivities"]["low"]["verify_levels"], feats, e["verify"]["version"]))
    assert lo < hi
    Device(st).sensitivity(KW, "medium")
    assert CustomKeywords([entry(st)], bundle=km.bundle).thresholds[0] == pytest.approx(e["threshold"])
    assert Device(st).status()["sensitivity"] == {KW: "medium"}


def test_the_cli_shows_and_sets_it_and_refuses_bad_levels(state):
    st, _ = state
    run = lambda *a: subprocess.run([sys.executable, "-m", "edge.cli", "device", "sensitivity", "--state", str(st),
                                     *a], capture_output=True, text=True, cwd=ROOT)  # noqa: E731
    shown = run("--keyword", "Hey Robot")
    assert shown.returncode == 0 and json.loads(shown.stdout)["sensitivity"] == "high"
    assert json.loads(run("--keyword", KW, "--level", "low").stdout)["sensitivity"] == "low"
    bad = run("--keyword", KW, "--level", "loud")
    assert bad.returncode != 0 and "invalid choice" in bad.stderr and "Traceback" not in bad.stderr
    missing = run("--keyword", "hey rover")
    assert missing.returncode != 0 and "no keyword 'hey rover' is enrolled" in missing.stderr
    assert "Traceback" not in missing.stderr
    assert entry(st)["sensitivity"] == "low"  # nothing changed by the refusals
    with pytest.raises(EdgelearnError, match="not one of low, medium, high"):
        Device(st).sensitivity(KW, "max")


def test_entries_enrolled_before_sensitivities_have_medium_only(state, tmp_path):
    st, _ = state
    doc = json.loads((st / "keywords.json").read_text())
    for k in ("sensitivity", "sensitivities"):
        doc["keywords"][0].pop(k)
    (st / "keywords.json").write_text(json.dumps(doc))
    assert Device(st).sensitivity(KW)["sensitivity"] == "medium"
    with pytest.raises(EdgelearnError, match="enrolled before sensitivities existed"):
        Device(st).sensitivity(KW, "high")
    Device(st).sensitivity(KW, "medium")
    doc["keywords"][0]["sensitivity"] = "high"  # a hand edit naming a level the entry lacks
    (st / "keywords.json").write_text(json.dumps(doc))
    with pytest.raises(EdgelearnError, match="sensitivity 'high', which its entry has no thresholds for"):
        Device(st).enrolled()


def test_the_level_survives_a_version_that_enrols_the_keyword_again(state, tmp_path):
    from test_device_carry import new_version

    st, _ = state
    Device(st).sensitivity(KW, "low")
    res = Device(st).carry_to(new_version(tmp_path, 2, change_negatives=True))
    assert res["rederived"] == [KW] and entry(st)["sensitivity"] == "low"
    assert "low" in entry(st)["sensitivities"]


def test_calibrate_measures_every_level_on_the_places_audio_and_picks_by_rate(state, clips, tmp_path):
    """`device calibrate` on everyday audio also counts each enrolled keyword's false accepts per
    hour at each level (both stages, as detection runs them); `--max-fa-per-hour R` then picks the
    most sensitive level measured at or under R. The audio here says the keyword twice a minute, so
    the counts are known to be positive at every level that hears it."""
    from edge.audio import write_wav
    from test_enroll_verify import in_stream

    st, _ = state
    rng = np.random.default_rng(5)
    parts = []
    for i in range(4):  # ~2 minutes: noise with the keyword said in it 4 times
        parts += [(rng.standard_normal(16000 * 25) * 200).astype(np.int16), in_stream(clips[i % len(clips)])]
    wav = tmp_path / "place.wav"
    write_wav(wav, np.concatenate(parts))
    table = Device(st).calibrate([wav], targets=[2.0])
    measured = table["enrolled"][KW]
    assert set(measured) == set(SENSITIVITIES)
    hours = table["hours"]
    assert measured["low"] <= measured["medium"] <= measured["high"]
    assert measured["high"] * hours >= 3  # the keyword is said 4 times: high hears most of them
    shown = Device(st).sensitivity(KW)["sensitivities"]
    assert shown["high"]["fa_per_hour"] == measured["high"] and shown["high"]["measured_hours"] > 0
    assert Device(st).sensitivity(KW, max_fa_h=measured["high"])["sensitivity"] == "high"
    if measured["low"] < measured["high"]:
        assert Device(st).sensitivity(KW, max_fa_h=measured["low"])["sensitivity"] in ("low", "medium")
    with pytest.raises(EdgelearnError, match="at best"):
        Device(st).sensitivity(KW, max_fa_h=min(measured.values()) - 1.0)
    Device(st).enroll(KW, clips, replace=True)  # new thresholds: the old measurement no longer holds
    with pytest.raises(EdgelearnError, match="no false-accept rates were measured"):
        Device(st).sensitivity(KW, max_fa_h=5.0)
