"""``edgelearn export voices`` (host/custom_voices.py) and the path it adds (edge/custom_voices.py):
an enrolled keyword's candidate its own two stages do not pass is judged by its phrase models."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from devstate_helpers import make_keyword_clips
from voices_helpers import NAME, entry as _entry, teach_buzz_word
from edge import custom_voices as CV
from edge.audio import read_wav
from edge.detect import Detector, detect_pcm
from edge.device import Device
from edge.errors import EdgelearnError
from edge.keywords import DeviceState, check_keywords


@pytest.fixture(scope="module")
def taught(tmp_path_factory):
    return teach_buzz_word(tmp_path_factory.mktemp("voices"))


def test_teach_writes_the_models_and_a_voices_head_at_half_the_rate(taught):
    e, before = _entry(taught["state"]), taught["before"]
    v = e["voices"]
    # no real speech in the (test's) models' training: the first stage opens where it did
    assert v == {"version": CV.VERSION, "models": v["models"], "cutoff": CV.CUTOFF, "lower": CV.LOWER,
                 "real_speech": []}
    assert len(v["models"]) == len(CV.SEEDS)
    for rel in v["models"]:
        data = (taught["state"] / rel).read_bytes()
        assert data[4:8] == b"TFL3"                                # a TFLite flatbuffer
    heads = e["speaker_heads"]
    assert [h.get("voices", False) for h in heads] == [True]
    # two heads, each at half the bank rate: the user's own head's threshold rises
    assert e["threshold"] >= before["threshold"]
    assert set(heads[0]["sensitivities"]) == set(e["sensitivities"]) == set(before["sensitivities"])
    assert e["bank_false_accept_rate"] <= 0.004 + 1e-9
    assert check_keywords([e]) == [e]
    assert e["w"] == before["w"] and e["verify"] == before["verify"]   # the enrolled stages are kept


def test_status_names_the_keywords_taught_other_voices(taught):
    assert Device(taught["state"]).status()["other_voices"] == {NAME: CV.CUTOFF}


def test_detector_opens_lower_and_loads_the_models(taught):
    det, _ = Device(taught["state"]).detector(replay=False)
    (voices,) = det._voices
    assert isinstance(voices, CV.Voices) and voices.cutoff == CV.CUTOFF
    k = det.names.index(NAME)
    assert det.thresholds[k] == pytest.approx(CV.lowered(det._own[k], CV.LOWER), abs=1e-6)
    assert det.thresholds[k] <= det._own[k] and det._keeps_audio


class Judge:
    """A stand-in for a keyword's phrase models: records each snippet, answers ``answer``."""

    before_s, after_s, lower = CV.BEFORE_S, CV.AFTER_S, CV.LOWER

    def __init__(self, answer: bool):
        self.answer, self.snippets = answer, []

    def says_at(self, pcm, keyword_end_s, tape=None, at=None):
        assert tape is not None and at is not None   # the Detector hands over its stream's tape
        self.snippets.append((len(pcm), keyword_end_s))
        self.audio = getattr(self, "audio", []) + [np.array(pcm)]
        return self.answer


def _stream(clips, gap_s=2.5):
    rng = np.random.default_rng(3)
    parts = [np.zeros(16000, np.int16)]
    for c in clips:
        parts += [read_wav(c), np.zeros(int(gap_s * 16000), np.int16)]
    x = np.concatenate(parts).astype(np.float32) + rng.normal(0, 30, sum(len(p) for p in parts))
    return np.clip(x, -32768, 32767).astype(np.int16)


def _detector(state, judge, own=None):
    from edge.kws import KeywordModel

    dev = Device(state)
    custom = DeviceState.open(state, dev.bundle).custom(verify=True)
    custom.voices = [judge]
    if own is not None:  # the keyword's own stages out of reach: only the phrase models can pass it
        custom.thresholds = np.full(1, own, np.float32)
    custom.first_thresholds = np.array([CV.lowered(t, CV.LOWER) for t in custom.thresholds], np.float32)
    custom.first_thresholds = np.minimum(custom.first_thresholds, 0.3)
    return Detector(KeywordModel(dev.bundle), custom=custom, keywords=[])


def test_a_candidate_under_its_own_threshold_is_judged_on_its_audio(taught):
    pcm = _stream(taught["clips"])
    no = Judge(False)
    det = _detector(taught["state"], no, own=0.9999)
    assert detect_pcm(det, pcm) == []                     # nothing passes: the models said no
    assert no.snippets and det.rejected >= len(no.snippets)
    # each snippet runs from 2 s before the keyword end (or the stream's start) to 0.3 s after it
    assert all(abs(n - (end + CV.AFTER_S) * 16000) <= 1 and end <= CV.BEFORE_S for n, end in no.snippets)
    assert max(end for _, end in no.snippets) == pytest.approx(CV.BEFORE_S)
    yes = Judge(True)
    ev = detect_pcm(_detector(taught["state"], yes, own=0.9999), pcm)
    assert [e["keyword"] for e in ev] == [NAME] * len(taught["clips"])   # one event per clip
    assert len(yes.snippets) == len(ev)


def test_float_audio_reaches_the_models_as_the_same_samples(taught):
    """The front end takes float audio in [-1, 1] as well as int16; the snippets the models judge are
    that audio as int16 (until 2026-12-07 a float stream's copy was clipped to zeros)."""
    pcm = _stream(taught["clips"])
    judges = []
    for audio in (pcm, pcm.astype(np.float32) / 32768.0):
        judges.append(Judge(False))
        detect_pcm(_detector(taught["state"], judges[-1], own=0.9999), audio)
    ints, floats = judges
    assert ints.snippets == floats.snippets and len(ints.audio) >= len(taught["clips"])
    for a, b in zip(ints.audio, floats.audio):
        assert b.dtype == np.int16 and np.abs(a.astype(np.int32) - b).max() <= 1 and np.abs(b).max() > 1000


def test_the_keywords_own_stages_still_pass_it_without_the_models(taught):
    pcm = _stream(taught["clips"])
    no = Judge(False)
    ev = detect_pcm(_detector(taught["state"], no), pcm)
    own = detect_pcm(Detector(_km(taught["state"]), custom=DeviceState.open(
        taught["state"], Device(taught["state"]).bundle).custom(verify=True), keywords=[]), pcm)
    assert len(own) >= 4 and len(ev) >= len(own) - 1     # the enrolled voice: heard by its own stages


def _km(state):
    from edge.kws import KeywordModel

    return KeywordModel(Device(state).bundle)


def test_real_models_judge_the_enrolled_clips(taught):
    events = list(Device(taught["state"]).detect(_stream(taught["clips"]), replay=False))
    assert len(events) >= 4 and {e["keyword"] for e in events} == {NAME}


def test_the_stream_judges_its_candidates_on_one_tape(taught):
    """Opened 2 logits lower, the keyword's candidates come close together: each whole snippet is
    judged on the Detector's tape (edge/phrase_tape.py), the overlapping ones going on from it; a
    detector reset starts a new tape."""
    det, _ = Device(taught["state"]).detector(replay=False)
    (voices,) = det._voices
    k = det.names.index(NAME)
    det.thresholds[k] = CV.lowered(det._own[k], 2.0)
    det._own[k] = 0.9999           # its own stages out of reach: every candidate goes to the models
    pcm = _stream(taught["clips"], gap_s=0.6)
    detect_pcm(det, pcm)
    tape = det._tape
    assert voices.judged >= 2 and tape.continued >= 1
    assert tape.fresh + tape.continued == voices.judged
    det.reset()
    assert det._tape is not tape and det._tape.fresh == det._tape.continued == 0
    # a detector taking the stream over (an agent's model switch) goes on with its tape
    det.push(pcm[:16000 * 3])
    new, _ = Device(taught["state"]).detector(replay=False)
    new.continue_from(det)
    assert new._tape is det._tape


def test_a_missing_model_file_is_one_sentence(taught, tmp_path):
    st = tmp_path / "st"
    shutil.copytree(taught["state"], st)
    (st / _entry(st)["voices"]["models"][1]).unlink()
    with pytest.raises(EdgelearnError) as ei:
        Device(st).detector(replay=False)
    assert "unreadable" in ei.value.problem and "export voices" in ei.value.fix


@pytest.mark.parametrize("bad, said", [
    ({"version": 9}, "voices version 9"),
    ({"models": ["../x.tflite"]}, "not a list of files under voices/"),
    ({"cutoff": 1.5}, "'cutoff' is 1.5"),
    ({"lower": "1"}, "'lower' is '1'"),
    ({"single": 2}, "'single' is 2"),
    ({"quiet_db": None}, "'quiet_db' is None"),
])
def test_a_damaged_voices_field_names_itself(taught, bad, said):
    e = _entry(taught["state"])
    e["voices"] = {**e["voices"], **bad}
    with pytest.raises(ValueError, match=said.replace("(", r"\(")):
        check_keywords([e])


def test_export_voices_refuses_an_unknown_keyword_in_one_sentence(taught, capsys):
    from edge.cli import main

    assert main(["export", "voices", "--state", str(taught["state"]), "--keyword", "hey nobody"]) != 0
    err = capsys.readouterr().err
    assert "no keyword 'hey nobody' is enrolled" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_voices_head_shares_the_rate_with_every_persons_head_and_replaces_an_old_one():
    """A keyword two people enrolled (`device enroll --add`) taught voices twice: three heads, each at
    a third of each level's bank rate, one of them the voices head."""
    from edge.keywords import FAR_TARGET, SENSITIVITIES, CustomKeywords
    from host.custom_voices import with_voices_head

    rng = np.random.default_rng(0)
    bank = rng.normal(size=(2000, 8)).astype(np.float32)

    def head():
        return [float(x) for x in rng.normal(size=8)], float(rng.normal())

    (w, b), (w2, b2) = head(), head()
    levels = {"low": {"threshold": 0.9}, "high": {"threshold": 0.6}}
    entry = {"name": "hey you", "w": w, "b": b, "threshold": 0.8, "sensitivities": levels,
             "speaker_heads": [{"w": w2, "b": b2, "threshold": 0.8, "sensitivities": {"low": 0.9, "high": 0.6}}]}
    once = with_voices_head(entry, *head(), bank)
    twice = with_voices_head(once, *head(), bank)
    assert [bool(h.get("voices")) for h in twice["speaker_heads"]] == [False, True]
    assert check_keywords([twice]) == [twice]

    def passed(w, b, t):
        return float(np.mean(CustomKeywords([{"name": "x", "w": w, "b": b, "threshold": 0.5}]).scores(bank)[:, 0] >= t))

    rows = [(twice["w"], twice["b"], twice["threshold"], {k: v["threshold"] for k, v in twice["sensitivities"].items()})]
    rows += [(h["w"], h["b"], h["threshold"], h["sensitivities"]) for h in twice["speaker_heads"]]
    step = 1 / len(bank)  # a quantile's resolution: one bank row
    for w_, b_, t, lv in rows:   # each head at a third of the rate (or 0.5, enrolment's floor)
        assert passed(w_, b_, t) <= FAR_TARGET / 3 + step or t == 0.5
        for level, thr in lv.items():
            assert passed(w_, b_, thr) <= SENSITIVITIES[level][0] / 3 + step or thr == 0.5
    assert twice["bank_false_accept_rate"] <= FAR_TARGET + 3 * step


# -- enrolled again: the path is kept (edge.custom_voices.carried) -----------------------------------

def _copy(taught, tmp_path):
    st = tmp_path / "st"
    shutil.copytree(taught["state"], st)
    return st


def test_enrolling_again_keeps_the_other_voices(taught, tmp_path):
    st = _copy(taught, tmp_path)
    rep = Device(st).enroll(NAME, taught["clips"], replace=True)
    assert rep["other_voices"] is True
    assert _entry(st) == _entry(taught["state"])   # the same clips: the same entry, its voices included
    assert rep["threshold"] == round(_entry(st)["threshold"], 4)


def test_another_person_added_keeps_the_voices_head_beside_theirs(taught, tmp_path):
    from voices_helpers import NAME, entry as _entry, teach_buzz_word

    st = _copy(taught, tmp_path)
    taught_heads = _entry(st)["speaker_heads"]
    rep = Device(st).enroll(NAME, make_keyword_clips(tmp_path / "other", seed=7), add=True)
    e = _entry(st)
    assert rep["other_voices"] is True and rep["speakers"] == 2 and e["voices"] == _entry(taught["state"])["voices"]
    assert [h.get("voices", False) for h in e["speaker_heads"]] == [False, True]   # the new person's, then voices
    v = e["speaker_heads"][1]
    assert (v["w"], v["b"]) == (taught_heads[0]["w"], taught_heads[0]["b"])
    assert v["threshold"] >= taught_heads[0]["threshold"]   # three heads share the bank rate now, not two
    assert check_keywords([e]) == [e]
    det, _ = Device(st).detector(replay=False)
    assert isinstance(det._voices[0], CV.Voices)


def test_enrolling_again_without_its_models_drops_the_path_and_says_why(taught, tmp_path):
    st = _copy(taught, tmp_path)
    (st / _entry(st)["voices"]["models"][1]).unlink()
    rep = Device(st).enroll(NAME, taught["clips"], replace=True)
    assert rep["other_voices"].startswith("dropped: its phrase model ") and "is gone" in rep["other_voices"]
    assert "edgelearn export voices" in rep["other_voices"]
    assert _entry(st) == taught["before"]   # the plain enrolment, no voices head
    assert Device(st).status()["other_voices"] == {}


def test_a_rebuilt_keywords_file_keeps_the_other_voices(taught, tmp_path, capsys):
    st = _copy(taught, tmp_path)
    want = _entry(st)
    (st / "keywords.json").write_bytes(b'{"model_id": "kws')   # a torn write
    assert Device(st).enrolled().keywords == [want]
    assert "other voices lost" not in capsys.readouterr().err


def test_a_rebuild_without_the_models_says_the_voices_are_lost(taught, tmp_path, capsys):
    st = _copy(taught, tmp_path)
    shutil.rmtree(st / CV.DIR)
    (st / "keywords.json").write_bytes(b"\0" * 64)
    assert Device(st).enrolled().keywords == [taught["before"]]
    err = capsys.readouterr().err
    assert f"other voices lost (run `edgelearn export voices` again): {NAME} (its phrase model" in err


def test_a_new_negative_bank_keeps_the_voices_and_a_new_encoder_drops_them(taught, tmp_path, capsys):
    from test_device_carry import new_version

    st = _copy(taught, tmp_path)
    head = CV.voices_head_of(_entry(st))
    v2 = new_version(tmp_path, 2, change_negatives=True)
    res = Device(st).carry_to(v2)
    assert res["rederived"] == [NAME] and res["voices_dropped"] == []
    e = _entry(st)
    assert CV.voices_head_of(e)["w"] == head["w"] and e["voices"] == _entry(taught["state"])["voices"]
    assert check_keywords([e]) == [e]
    new = new_version(tmp_path, 3, change_negatives=False, change_encoder=True)
    res = Device(st, v2).carry_to(new)
    assert res["rederived"] == [NAME] and res["voices_dropped"] == [NAME]
    assert "voices" not in _entry(st) and "speaker_heads" not in _entry(st)
    assert f"{NAME} no longer hear other voices" in capsys.readouterr().err
