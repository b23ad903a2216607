"""Several people enrol one custom keyword (issue 17, `device enroll --add`): a voice the keyword
never heard is missed; after that person adds 5 clips it is found, and the first voice still is.
The device keeps every speaker's clips (never uploaded), so a new version re-derives all of them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_enroll_verify import RATES, in_stream

from edge.device import Device
from edge.enroll import MAX_SPEAKERS
from edge.errors import EdgelearnError

ROOT = Path(__file__).resolve().parents[1]
KW = "hey robot"


@pytest.fixture(scope="module")
def voices():
    from host.data import synth

    return {v: synth.render(synth.Voice("flite", v), [(KW, r, p) for r, p in RATES]) for v in ("rms", "awb")}


def found(st, clips) -> list[int]:
    return [sum(e["keyword"] == KW for e in Device(st).detect(in_stream(c), replay=False)) for c in clips]


def test_a_second_speaker_is_heard_after_adding_their_clips(voices, tmp_path):
    st = tmp_path / "st"
    Device(st).enroll(KW, voices["rms"][:5], sensitivity="high")
    assert found(st, voices["rms"][5:]) == [1, 1, 1]
    assert found(st, voices["awb"][5:]) == [0, 0, 0]  # another voice: not near rms's templates
    rep = Device(st).enroll(KW, voices["awb"][:5], add=True)
    assert (rep["speakers"], rep["used"], rep["sensitivity"]) == (2, 10, "high")  # the keyword's own level
    assert found(st, voices["awb"][5:]) == [1, 1, 1] and found(st, voices["rms"][5:]) == [1, 1, 1]
    e = json.loads((st / "keywords.json").read_text())["keywords"][0]
    assert e["speakers"] == 2 and len(e["verify"]["steps"]) == 10  # every speaker's templates
    clips, who = Device(st).enrolment_clips(KW, speakers=True)
    assert who == [0] * 5 + [1] * 5 and all(np.array_equal(a, b) for a, b in zip(clips[5:], voices["awb"][:5]))


def test_a_new_version_re_derives_every_speaker(voices, tmp_path):
    from test_device_carry import new_version

    st = tmp_path / "st"
    Device(st).enroll(KW, voices["rms"][:5])
    Device(st).enroll(KW, voices["awb"][:5], add=True)
    new = new_version(tmp_path, 2, change_negatives=True)
    assert Device(st).carry_to(new)["rederived"] == [KW]
    e = json.loads((st / "keywords.json").read_text())["keywords"][0]
    assert e["speakers"] == 2 and len(e["verify"]["steps"]) == 10


def test_refusals_change_nothing(voices, tmp_path):
    st = tmp_path / "st"
    with pytest.raises(EdgelearnError, match="--add needs an enrolled keyword"):
        Device(st).enroll(KW, voices["rms"][:5], add=True)
    Device(st).enroll(KW, voices["rms"][:5])
    before = (st / "keywords.json").read_bytes()
    with pytest.raises(EdgelearnError, match="2 enrolment clips given from speaker 2"):
        Device(st).enroll(KW, voices["awb"][3:5], add=True)
    assert (st / "keywords.json").read_bytes() == before
    assert Device(st).enrolment_clips(KW, speakers=True)[1] == [0] * 5
    for _ in range(MAX_SPEAKERS - 1):
        Device(st).enroll(KW, voices["awb"][:3], add=True)
    full = (st / "keywords.json").read_bytes()
    with pytest.raises(EdgelearnError, match=f"at most {MAX_SPEAKERS} can enrol one keyword"):
        Device(st).enroll(KW, voices["awb"][3:6], add=True)
    assert (st / "keywords.json").read_bytes() == full != before
    res = subprocess.run([sys.executable, "-m", "edge.cli", "device", "enroll", "--state", str(st), "--keyword", KW,
                          "--wav", "a.wav", "--add", "--replace"], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode != 0 and "not allowed with argument" in res.stderr and "Traceback" not in res.stderr


def test_each_speaker_has_a_first_stage_head_and_any_one_fires_the_keyword(voices, tmp_path):
    """A keyword's first stage is one logistic head per speaker, each at its share of the bank
    false-accept rate: the keyword's score crosses its threshold exactly when some head crosses its own."""
    from edge.enroll import CustomKeywords, StateError

    st = tmp_path / "st"
    Device(st).enroll(KW, voices["rms"][:5])
    Device(st).enroll(KW, voices["awb"][:5], add=True)
    doc = json.loads((st / "keywords.json").read_text())
    e = doc["keywords"][0]
    assert len(e["speaker_heads"]) == 1
    from edge.enroll import augment, prepare_clip

    km = Device(st).keyword_model()
    clips = [prepare_clip(c, "clip") for v in ("rms", "awb") for c in voices[v]]
    emb = km.infer(km.features(augment(clips, np.random.default_rng(0), snrs_db=(10.0, 0.0))))[0]
    ck = CustomKeywords([e])
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    own = [1 / (1 + np.exp(-(unit @ np.asarray(h["w"]) + h["b"]))) >= h["threshold"]
           for h in [e] + e["speaker_heads"]]
    assert np.array_equal(ck.scores(emb)[:, 0] >= e["threshold"], np.any(own, axis=0))
    assert own[0].sum() and own[1].sum() and (own[1] & ~own[0]).sum()  # the second head adds hits
    e["speaker_heads"][0]["w"] = e["speaker_heads"][0]["w"][:-1]  # damaged by hand
    (st / "keywords.json").write_text(json.dumps(doc))
    with pytest.raises(StateError, match="speaker head 'w'"):
        Device(st).enrolled()
