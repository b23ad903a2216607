"""Each keyword taught other voices watched on its own (edge/detect_voices.py): another keyword's
candidate does not hide it, and one utterance still gives one event."""

from __future__ import annotations

import numpy as np

from edge.detect import Detector, detect_pcm
from test_detect import Scripted

N_RUNS = 70


class Judge:
    """A keyword's phrase models, stood in: answers ``answer``, records the stream sample of each snippet."""

    before_s, after_s = 2.0, 0.3

    def __init__(self, answer: bool):
        self.answer, self.asked = answer, []

    def says_at(self, pcm, keyword_end_s, tape=None, at=None):
        assert tape is not None and len(pcm) > 0
        self.asked.append(at)
        return self.answer


class TwoKeywords:
    """Custom keywords "a" and "b", both taught other voices: first-stage scores ``scripts`` (2, runs)
    at the Scripted model's run index, own thresholds ``own``, opened at ``first``; no verifier."""

    names = ["a", "b"]

    def __init__(self, scripts, judges, own=(0.9, 0.9), first=(0.3, 0.3)):
        self.scripts, self.voices = np.asarray(scripts, np.float32), judges
        self.thresholds = np.array(own, np.float32)
        self.first_thresholds = np.array(first, np.float32)

    def scores(self, emb):
        return self.scripts[:, emb[:, 0].astype(int)].T

    def verifies(self, k):
        return False

    def searches(self, k):
        return False


def _scripts(a_at=None, b_at=None, height=(0.6, 0.5), b_runs=4):
    s = np.full((2, N_RUNS), 0.05, np.float32)
    for row, at, h, n in ((0, a_at, height[0], 4), (1, b_at, height[1], b_runs)):
        if at is not None:
            s[row, at:at + n] = h
    return s


def _run(scripts, judges, pcm_runs=N_RUNS, **kw):
    rng = np.random.default_rng(0)
    pcm = (rng.standard_normal((48 + 4 * (pcm_runs - 1)) * 320 + 480) * 3000).astype(np.int16)
    pcm[::3000] = 20000
    det = Detector(Scripted(np.zeros(N_RUNS)), custom=TwoKeywords(scripts, judges, **kw), keywords=[])
    return detect_pcm(det, pcm), det


def test_another_keywords_candidate_does_not_hide_a_watched_keyword():
    """"b" crosses its lowered threshold one run before "a" does, on the same speech, and stays over
    it: in one slot "b"'s candidate held it until "a"'s burst was over (the models never heard "a");
    each watched on its own, both are judged and "a" is the event."""
    a, b = Judge(True), Judge(False)
    ev, det = _run(_scripts(a_at=21, b_at=20, b_runs=10), [a, b])
    assert [e["keyword"] for e in ev] == ["a"]
    assert len(a.asked) == 1 and len(b.asked) == 1 and det.rejected == 1


def test_one_utterance_two_watched_keywords_one_event():
    """Both keywords' models pass the same utterance: the first judged is the event; the other, inside
    its refractory period, is dropped unjudged. A later utterance is heard again."""
    a, b = Judge(True), Judge(True)
    ev, _ = _run(_scripts(a_at=20, b_at=20), [a, b])
    assert len(ev) == 1 and len(a.asked) + len(b.asked) == 1
    later = _scripts(a_at=20, b_at=20)
    later[1, 50:54] = 0.5
    ev, _ = _run(later, [Judge(True), Judge(True)])
    assert len(ev) == 2 and ev[1]["time_s"] - ev[0]["time_s"] >= 1.0


def test_the_slot_passing_a_keyword_by_its_own_stages_leaves_its_watch_nothing_to_judge():
    """"a" crosses its own threshold (0.5 here): the slot's event comes first, and its watch's candidate
    of the same utterance is dropped unjudged: one event."""
    a = Judge(True)
    ev, _ = _run(_scripts(a_at=20), [a, Judge(False)], own=(0.5, 0.9))
    assert [e["keyword"] for e in ev] == ["a"] and a.asked == []


def test_a_watch_held_at_the_streams_end_is_judged_on_the_audio_there_is():
    """The stream ends right after "b"'s burst, before the snippet's 0.3 s after it have come: flush
    judges it on what there is."""
    b = Judge(True)
    ev, _ = _run(_scripts(b_at=N_RUNS - 5), [Judge(False), b], pcm_runs=N_RUNS - 1)
    assert [e["keyword"] for e in ev] == ["b"] and len(b.asked) == 1


def test_a_watchs_event_takes_over_the_slots_candidate_of_the_same_utterance_only():
    """A watch's event at keyword end t drops the slot's open candidate from within the refractory
    period around t (counted as rejected) and the slot's later event of the same keyword there; a
    candidate or event a refractory period away stands."""
    det = Detector(Scripted(np.zeros(N_RUNS)), custom=TwoKeywords(_scripts(), [Judge(True), Judge(False)]),
                   keywords=[])
    det.audio, det.samples = np.ones(16000 * 4, np.int16), 16000 * 4
    det._watch[0][1] = (0.6, 2.0, None)          # "a" held, its keyword end at 2.0 s, its audio all here
    det.candidate = (0.95, 1, 2.4, 3)             # the slot's candidate of "b" on the same utterance
    (ev,) = det._watch_due()
    assert ev["keyword"] == "a" and det.candidate is None and det.rejected == 1
    assert det._event(0.95, 0, 2.5, None) is None and det.rejected == 2        # "a" again, by the slot
    assert det._event(0.95, 0, 3.2, None)["keyword"] == "a"                    # a second later: stands
    det.candidate = (0.95, 1, 5.0, 3)
    det._take_over(3.5)
    assert det.candidate is not None
