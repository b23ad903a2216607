"""The phrase stage across a model switch (``Detector.continue_from``, what the agent does on a new
model) and at a stream's end: a held candidate moves and is judged on its whole snippet, the clock
carries over, a stream cut just after a command is judged at its keyword end. Split from
tests/test_phrase_stage.py, whose fixtures and helpers these share."""

from __future__ import annotations

import numpy as np
import pytest
from test_phrase_stage import SR, Recording, _said, _stream, bundle, km, renders, stage_ok  # noqa: F401 (fixtures)

from edge.detect import Detector, detect_pcm
from edge.kws import DEFAULT_BUNDLE

pytestmark = pytest.mark.skipif(not (DEFAULT_BUNDLE / "manifest.json").exists(),
                                reason="models/kws-dscnn-s not built yet (make model)")


# -- 7. continue_from -------------------------------------------------------------------------------------

def _until_held(km, bundle, pcm):
    """(a detector with a held candidate, the samples pushed, the events so far)."""
    det, events = Detector(km, threshold=0.3, asr=Recording(bundle)), []
    for i in range(0, len(pcm), 1600):
        events += det.push(pcm[i:i + 1600])
        if det.pending is not None:
            return det, i + 1600, events
    raise AssertionError("no candidate was held")


@pytest.mark.parametrize("accept", [True, False])
def test_a_held_candidate_moves_to_the_new_detector_and_its_stage_decides_it(bundle, km, renders, accept):
    """``continue_from`` (the agent's switch to a new model) while a command waits for the phrase stage:
    the new detector takes the candidate over and its own stage judges it on the whole 2.5 s snippet;
    a stage that accepts gives the event the switch-free run gives, one that rejects drops it."""
    texts = ["yes", "stop", "left"]
    pcm, spans = _stream(texts, "en-us+m1")
    ref = detect_pcm(Detector(km, threshold=0.3, asr=Recording(bundle)), pcm)
    old, n, before = _until_held(km, bundle, pcm)
    held = old.pending
    word, t = old.names[held[1]], round(held[2], 3)  # as the event reports it
    judged = list(old.asr.judged)  # candidates whose snippet was whole within their own chunk
    new_stage = Recording(bundle)
    if not accept:
        new_stage.cutoffs[word] = 1.01  # unreachable: this stage rejects the command
    new = Detector(km, threshold=0.3, asr=new_stage)
    assert new.continue_from(old) == []  # not decided at the switch (its snippet is not complete)
    assert old.pending is None and new.pending is not None and new.names[new.pending[1]] == word
    assert old.asr.judged == judged and new_stage.judged == []
    after = [e for i in range(n, len(pcm), 1600) for e in new.push(pcm[i:i + 1600])] + new.flush()
    first = new_stage.judged[0]
    assert first[0] == word and abs(first[1] - (min(t, new_stage.before_s) + new_stage.after_s) * SR) <= 1
    got = before + after
    if accept:
        assert first[3] and got == ref and new.rejected == 0
    else:
        # (the same utterance may open another candidate of the word: no refractory period after a rejection)
        assert not first[3] and new.rejected >= 1 and word not in [w for w, *_, ok in new_stage.judged if ok]
        assert got == [e for e in ref if e["time_s"] != t]
    assert all(k == s for k, s in _said(got, texts, spans))


@pytest.mark.parametrize("every", [1, 3])
def test_switching_models_every_few_chunks_keeps_whole_snippets(bundle, km, renders, every):
    """The agent switching detectors often (as test_confirm's recogniser test): held candidates move,
    every snippet the stage judges is whole, and every event names the command said there."""
    texts = ["yes", "stop", "left", "go", "down"]
    pcm, spans = _stream(texts, "en-us+m1")
    stage, got, held, rejected = Recording(bundle), [], 0, 0
    det = Detector(km, threshold=0.3, asr=stage)
    for c, i in enumerate(range(0, len(pcm), 1600)):
        got += det.push(pcm[i:i + 1600])
        if c % every == 0:
            new = Detector(km, threshold=0.3, asr=stage)
            got += new.continue_from(det)
            held += new.pending is not None
            rejected += det.rejected
            det = new
    got += det.flush()
    rejected += det.rejected
    assert held > 0 and len(got) >= 4
    assert all(k == s for k, s in _said(got, texts, spans)), _said(got, texts, spans)
    assert stage.decoded == len(stage.judged) == len(got) + rejected
    full = int(round((stage.before_s + stage.after_s) * SR))
    first_end = spans[0][1]
    for w, n, _, _ in stage.judged:  # whole, but for a keyword ending less than before_s into the stream
        assert abs(n - full) <= 1 or n < full and first_end < stage.before_s + 0.2, (w, n)


def test_a_stream_that_ends_just_after_a_command_is_judged_at_its_keyword_end(bundle, km, renders):
    """A stream cut 0.05 s after a command: the snippet is short; the stage is told where the keyword
    ends in it (``says_at``) instead of taking ``after_s`` before the snippet's end, and what the stream
    did not bring is silence, so the command found with 0.5 s of tail is found with 0.05 s too (at the
    same peak; before the fix it was rejected at 0.81)."""
    from host.data.synth import Voice, render

    [clip] = render(Voice("espeak", "en-us+m1"), [("go", 1.0, 1.0)])
    floor = np.random.default_rng(3).standard_normal(int(3.05 * SR) + len(clip)) * 3
    peaks = {}
    for tail in (0.5, 0.05):
        x = floor[:int(2.5 * SR) + len(clip) + int(tail * SR)].copy()
        x[int(2.5 * SR):int(2.5 * SR) + len(clip)] += clip
        stage = Recording(bundle)
        det = Detector(km, threshold=0.3, asr=stage)
        pcm = np.clip(x, -32768, 32767).astype(np.int16)
        events = det.push(pcm) + det.flush()
        assert [e["keyword"] for e in events] == ["go"], (tail, events, stage.judged)
        peaks[tail] = [p for w, _, p, ok in stage.judged if ok]
    assert peaks[0.05] == peaks[0.5], peaks


def test_a_stage_added_by_continue_from_keeps_the_streams_clock(bundle, km, renders):
    """From a detector without a second stage to one with it (``continue_from``): the new one counts
    samples from where the stream is, so the snippets of the commands after the switch are whole
    (before the fix its clock restarted at 0 and every snippet was silence or empty)."""
    texts = ["yes", "stop", "left"]
    pcm, spans = _stream(texts, "en-us+f2")
    first = Detector(km, threshold=0.3)
    switch = int(spans[0][0] * SR) - SR // 2          # before the first command
    events = first.push(pcm[:switch])
    stage = Recording(bundle)
    det = Detector(km, threshold=0.3, asr=stage)
    events += det.continue_from(first)
    assert det.samples == switch
    for i in range(switch, len(pcm), 1600):
        events += det.push(pcm[i:i + 1600])
    events += det.flush()
    assert [e["keyword"] for e in events] == texts, (events, stage.judged)
    assert all(n > 0.5 * SR for _, n, _, _ in stage.judged), stage.judged
