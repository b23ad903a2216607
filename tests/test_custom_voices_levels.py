"""What each sensitivity level does for a keyword taught other voices (edge/custom_voices.py): at low
its phrase models judge only the candidates its own first stage opens, at the recipe's cutoff; at
high, in a quiet snippet, either model alone may pass a candidate."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from edge import custom_voices as CV
from edge.device import Device
from edge.keywords import DeviceState
from voices_helpers import NAME, entry as _entry, teach_buzz_word


@pytest.fixture(scope="module")
def taught(tmp_path_factory):
    return teach_buzz_word(tmp_path_factory.mktemp("voices"))


def test_sensitivity_low_opens_a_taught_keyword_only_at_its_own_threshold(taught, tmp_path):
    """The user's lever for fewer false accepts: at ``low`` the phrase models judge only the candidates
    the keyword's own first stage opens; medium and high open ``lower`` logit under it."""
    st = tmp_path / "st"
    shutil.copytree(taught["state"], st)
    dev = Device(st)
    state = DeviceState.open(st, dev.bundle)
    state.keywords = [{**e, "voices": {**e["voices"], "lower": 1.0}} for e in state.keywords]
    state.save()
    for level in ("low", "medium", "high"):
        dev.sensitivity(NAME, level)
        det, _ = Device(st).detector(replay=False)
        k = det.names.index(NAME)
        want = det._own[k] if level == "low" else CV.lowered(det._own[k], 1.0)
        assert det.thresholds[k] == pytest.approx(want, abs=1e-6), level
        assert (det.thresholds[k] < det._own[k]) == (level != "low")


def test_sensitivity_low_keeps_the_recipes_cutoff_under_an_entry_taught_at_a_lower_one(taught):
    """At ``low`` the phrase models pass a candidate only at ``CV.CUTOFF`` or more, whatever cutoff the
    entry was taught with (``CV.CUTOFF_REAL`` is lower); medium and high use the entry's, and an
    entry's cutoff above ``CV.CUTOFF`` holds at every level. The mean at 0.96 passes at medium only."""
    e = _entry(taught["state"])
    taught_at = {**e["voices"], "cutoff": CV.CUTOFF_REAL}
    assert CV.CUTOFF_REAL < 0.96 < CV.CUTOFF
    for level, want in (("low", CV.CUTOFF), ("medium", CV.CUTOFF_REAL), ("high", CV.CUTOFF_REAL)):
        v = CV.Voices(taught_at, taught["state"], NAME, level)
        assert v.cutoff == want, level
        assert v.says_at(_said_over(20), 2.0, _Peaks((0.96, [0.96, 0.96])), 0) == (level != "low"), level
    strict = CV.Voices({**e["voices"], "cutoff": 0.99}, taught["state"], NAME, "low")
    assert strict.cutoff == 0.99


class _Peaks:
    """A stand-in tape: every snippet's (mean peak, each model's peak) is ``peaks``."""

    def __init__(self, peaks):
        self.peaks = peaks

    def peak(self, model, pcm, at, keyword_end_s, after_s, each=False, bound=None):
        return self.peaks if each else self.peaks[0]


def _said_over(noise_db: float | None) -> np.ndarray:
    """2.3 s: a second of a vowel-like tone over a quiet room's floor, or under noise ``noise_db`` below it."""
    rng = np.random.default_rng(5)
    t = np.arange(int(2.3 * 16000)) / 16000
    x = np.where((t > 0.9) & (t < 1.9), 3000 * np.sin(2 * np.pi * 220 * t) * np.sin(2 * np.pi * 3 * t), 0.0)
    x = x + rng.normal(0, 3, len(t))
    if noise_db is not None:
        x = x + rng.normal(0, 3000 / np.sqrt(2) * 10 ** (-noise_db / 20), len(t))
    return np.clip(x, -32768, 32767).astype(np.int16)


def test_at_sensitivity_high_a_quiet_snippet_lets_one_sure_model_decide_and_noise_does_not(taught):
    """At sensitivity high, one of two models alone at ``single`` (two of three) passes a candidate
    when its snippet is quiet (loudness range at least ``quiet_db``), not under noise 20 dB below the
    speech; not at medium (the default) or low; the mean at the cutoff passes it anywhere."""
    quiet, noisy = _said_over(None), _said_over(20)
    assert CV.loudness_range(quiet) >= CV.QUIET_DB > 30 > CV.loudness_range(noisy) > 10
    e = _entry(taught["state"])
    end = 2.0
    medium = CV.Voices(e["voices"], taught["state"], NAME)
    assert medium.single is None and not medium.says_at(quiet, end, _Peaks((0.5, [1.0, 0.0])), 0)
    v = CV.Voices(e["voices"], taught["state"], NAME, "high")
    assert (v.single, v.quiet_db) == (CV.SINGLE, CV.QUIET_DB)   # the entry names neither: the runtime's
    one_sure = _Peaks((0.5, [1.0, 0.0]))
    assert v.says_at(quiet, end, one_sure, 0) and v.alone == 1
    assert not v.says_at(noisy, end, one_sure, 0) and v.alone == 1
    assert not v.says_at(quiet, end, _Peaks((0.6, [0.98, 0.22])), 0)            # under single
    assert v.says_at(noisy, end, _Peaks((0.97, [0.97, 0.97])), 0) and v.alone == 1   # the mean, anywhere
    low = CV.Voices(e["voices"], taught["state"], NAME, "low")
    assert low.single is None and not low.says_at(quiet, end, one_sure, 0)
    own = CV.Voices({**e["voices"], "single": 0.9, "quiet_db": 80.0}, taught["state"], NAME)   # at medium
    assert own.single == 0.9 and not own.says_at(quiet, end, one_sure, 0)   # its quiet_db: not quiet enough
    # three models (export voices since session 51): two of them must be sure alone, one is not enough
    m = e["voices"]["models"]
    three = CV.Voices({**e["voices"], "models": [m[0], m[1], m[0]]}, taught["state"], NAME, "high")
    assert (v.sure, three.sure) == (1, 2)
    assert not three.says_at(quiet, end, _Peaks((0.34, [1.0, 0.02, 0.0])), 0) and three.alone == 0
    assert three.says_at(quiet, end, _Peaks((0.67, [1.0, 0.0, 0.99])), 0) and three.alone == 1
    assert not three.says_at(noisy, end, _Peaks((0.67, [1.0, 0.0, 0.99])), 0)
    # a device builds each keyword's voices at its sensitivity
    st = DeviceState.open(taught["state"], Device(taught["state"]).bundle)
    for level, single in (("low", None), ("medium", None), ("high", CV.SINGLE)):
        st.keywords = [{**k, "sensitivity": level} for k in st.keywords]
        assert st.custom(verify=True).voices[0].single == single
