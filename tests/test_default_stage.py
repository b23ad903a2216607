"""The phrase second stage as the default operating point (edge/device_detect.py ``default_stage``,
``asr="auto"``; since 2026-12-06, session 43): where it runs and where it does not, a missing front
end, and an enrolled keyword beside the lowered first stage (edge/detect.py ``_custom_first``,
``_wait``). The stage itself: tests/test_phrase_stage.py; its CLI, Wyoming and agent wiring:
tests/test_phrase_stage_wiring.py."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from test_phrase_stage import bundle  # noqa: F401 (fixture)
from test_phrase_stage_wiring import bare_bundle  # noqa: F401 (fixture)

import edge
from edge import phrase_stage
from edge.kws import DEFAULT_BUNDLE
from edge.detect import QUIET_S
from edge.phrase_stage import PhraseConfirm

SR = 16000

pytestmark = [pytest.mark.skipif(not (DEFAULT_BUNDLE / "manifest.json").exists(),
                                 reason="models/kws-dscnn-s not built yet (make model)"),
              pytest.mark.skipif(not phrase_stage.available(), reason="pymicro-features is not installed")]


def _thresholds(det) -> dict:
    return {w: round(float(t), 4) for w, t in zip(det.names, det.thresholds)}


def test_given_no_option_the_shipped_bundle_runs_both_stages_and_an_operating_point_runs_one(bundle, tmp_path):
    from edge.detect import bundle_thresholds

    dev = edge.Device(tmp_path / "st", bundle)
    det, _ = dev.detector(replay=False)
    assert isinstance(det.asr, PhraseConfirm)
    first = phrase_stage.config(bundle)["first_stage"]
    assert set(_thresholds(det).values()) == {first}
    own = bundle_thresholds(bundle.manifest)
    plain, _ = dev.detector(replay=False, asr=False)  # --no-phrase: the bundle's own thresholds, no stage
    assert plain.asr is None and _thresholds(plain) == {w: round(t, 4) for w, t in own.items()}
    given, _ = dev.detector(replay=False, threshold=0.7)  # an operating point of the first stage's own
    assert given.asr is None and set(_thresholds(given).values()) == {0.7}
    forced, _ = dev.detector(replay=False, threshold=0.7, asr="phrase")  # --phrase --threshold: both
    assert isinstance(forced.asr, PhraseConfirm) and set(_thresholds(forced).values()) == {0.7}


def test_a_bundle_without_phrase_models_runs_its_first_stage_alone_without_a_word(bare_bundle, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        det, _ = edge.Device(tmp_path / "st", bare_bundle).detector(replay=False)
    assert det.asr is None and min(det.thresholds) > 0.3  # the bundle's own operating point


def test_without_the_front_end_the_default_says_so_once_and_runs_the_first_stage(bundle, tmp_path, monkeypatch):
    from edge import device_detect

    monkeypatch.setattr(phrase_stage, "available", lambda: False)
    monkeypatch.setattr(device_detect, "_said_no_frontend", [])
    dev = edge.Device(tmp_path / "st", bundle)
    with pytest.warns(UserWarning, match="pymicro-features is not installed"):
        det, _ = dev.detector(replay=False)
    assert det.asr is None and min(det.thresholds) > 0.3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once
        assert dev.detector(replay=False)[0].asr is None


def test_only_the_bundles_own_encoder_gets_the_default_stage(bundle):
    """An adapted tail or a federated head moves the first stage's scores the cutoffs were chosen
    behind (tests/test_device_readapt.py: an adapted context keeps the version's thresholds)."""
    from edge.device_detect import _own_encoder
    from edge.kws import KeywordModel

    km = KeywordModel(bundle)

    class Tail(KeywordModel):
        pass

    assert _own_encoder(km, None)
    assert not _own_encoder(km, object()) and not _own_encoder(Tail.__new__(Tail), None)


@pytest.fixture(scope="module")
def lights_on(tmp_path_factory):
    """A state with "lights on" enrolled from 5 renders of Flite rms, and a stream of 2 held-out
    renders: the lowered first stage (0.3 then) opens "left" on "lights" before the keyword crosses its
    threshold, and "left"'s phrase model passes it (2026-12-06)."""
    from host.data import synth

    voice = synth.Voice("flite", "rms")
    rates = ((0.9, 1.0), (1.0, 0.95), (1.1, 1.05), (0.95, 1.1), (1.05, 0.9), (1.0, 1.0), (0.97, 1.03))
    clips = synth.render(voice, [("lights on", r, p) for r, p in rates])
    parts = [np.zeros(20000, np.float32)]
    for c in clips[5:]:
        parts += [c.astype(np.float32), np.zeros(40000, np.float32)]
    x = np.concatenate(parts)
    x += np.random.default_rng(3).standard_normal(x.size).astype(np.float32) * 50
    st = tmp_path_factory.mktemp("lights") / "st"
    edge.Device(st).enroll("lights on", clips[:5])
    return st, x.astype(np.int16)


def _events(det, pcm):
    out = []
    for i in range(0, len(pcm), 1600):
        out += det.push(pcm[i:i + 1600])
    return out + det.flush()


def test_an_enrolled_keyword_takes_over_a_command_it_starts_like(lights_on):
    st, pcm = lights_on
    det, _ = edge.Device(st).detector(replay=False)
    assert isinstance(det.asr, PhraseConfirm) and det._wait == det.refractory > det._after
    assert [e["keyword"] for e in _events(det, pcm)] == ["lights on", "lights on"]
    assert [e["keyword"] for e in _events(edge.Device(st).detector(replay=False, asr=False)[0], pcm)] == \
        ["lights on", "lights on"]
    # decided as soon as its snippet is whole, the command wins: what the wait is for
    hasty, _ = edge.Device(st).detector(replay=False)
    hasty._wait = hasty._after
    assert "left" in [e["keyword"] for e in _events(hasty, pcm)]


def test_without_enrolled_keywords_a_command_waits_only_for_its_snippet(bundle, tmp_path):
    det, _ = edge.Device(tmp_path / "st", bundle).detector(replay=False)
    assert det._wait == det._after == phrase_stage.config(bundle)["after_s"]


def test_with_no_base_keyword_watched_there_is_no_stage(bundle, tmp_path):
    det, _ = edge.Device(tmp_path / "st", bundle).detector(replay=False, keywords=[])
    assert det.asr is None



class _NotYes:
    """A stage that rejects "yes" and passes every other command, keeping what it judged."""

    def __init__(self):
        self.judged = []

    def says_at(self, word, pcm, keyword_end_s):
        self.judged.append(word)
        return word != "yes"


def _held_run(st, pcm, after=None):
    det, _ = edge.Device(st).detector(replay=False)
    det.asr = _NotYes()
    if after is not None:
        det._after = after
    out = []
    for i in range(0, len(pcm), 1600):
        out += [(e, det.samples) for e in det.push(pcm[i:i + 1600])]
    return det, out + [(e, det.samples) for e in det.flush()]


def test_with_a_keyword_enrolled_a_passed_command_waits_its_refractory_period_and_a_rejected_one_nothing(
        lights_on):
    """"yes" then "stop" 0.2 s later on a device with "lights on" enrolled: "yes" is judged (and
    rejected) as soon as its snippet is whole, which frees the detector for "stop"; "stop", passed,
    comes out a refractory period past its keyword end (the enrolled keyword's chance to take it
    over) when speech goes on after it, and as soon as it was judged when nothing is said after it
    (session 44: a command said alone starts no enrolled phrase). Judged only at the end of that
    period, as first built, "yes" held the detector past "stop"."""
    from test_phrase_stage import _stream

    st, _ = lights_on
    pcm, _ = _stream(["yes", "stop"], "en-us+m1", gap=0.2)
    pcm = np.concatenate([pcm, np.zeros(2 * SR, np.int16)])  # the stream goes on past the wait
    det, out = _held_run(st, pcm)
    assert "yes" in det.asr.judged and det.rejected >= 1
    assert [e["keyword"] for e, _ in out] == ["stop"]
    [(e, n)] = out
    # nothing said after it: out within the chunk after the first stage's peak window and the stage's wait
    assert (e["time_s"] + max(QUIET_S, det._after)) * SR <= n < (e["time_s"] + det.refractory - 0.3) * SR, n
    talk, _ = _stream(["yes", "stop", "coffee", "tomorrow"], "en-us+m1", gap=0.15)
    talk = np.concatenate([talk, np.zeros(2 * SR, np.int16)])
    det, out = _held_run(st, talk)
    [(e, n)] = [(e, n) for e, n in out if e["keyword"] == "stop"]
    assert 0 <= n - (e["time_s"] + det.refractory) * SR < 1700  # speech went on: out with the first chunk past it
    late, out = _held_run(st, pcm, after=det._wait)
    assert "stop" not in [e["keyword"] for e, _ in out], "the test does not tell the two apart"
