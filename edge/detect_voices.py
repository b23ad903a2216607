"""Each keyword taught other voices watched on its own: its phrase models' candidates, beside the slot.

The Detector has one candidate slot: a keyword's candidate, once open, holds it until it is decided,
and another keyword crossing its threshold meanwhile is not seen. A keyword taught other voices
(``edge.custom_voices``) opens its candidates ``lower`` logit under its own threshold (3 since
session 49), where its score crosses on much of any speech; in one slot with the others, a
keyword's candidate took the turn of another said at the same time, and a keyword set to another
sensitivity than the rest lost its turn to theirs. Development data (scripts/custom_cascade_dev.py,
four phrases, the other voices clean / under 20-5 dB noise): 75.0 / 59.0 % heard in one slot, 77.1 /
64.2 % with each keyword in a detector of its own, 75.0 / 66.7 % watched (0.22 / 0.33 / 0.44 false
accepts per hour per phrase; docs/edge-runtime.md, "Opened 3 logit lower, and each keyword taught
other voices watched on its own").

So each such keyword has a watch of its own (``_watch``: its candidate, then its held candidate),
opened where its smoothed score crosses its lowered threshold (``Detector.thresholds``) and the
refractory period is over, peaked as the slot's candidates are (``peak_window_s``), held until its
snippet's audio has come, then judged by its phrase models on the stream's tape. The slot sees the
keyword at its own threshold (``Detector._own``) and passes it by its own stages (the first-stage
heads and the verifier) as before; a candidate there its own stages reject is rejected, the watch
having judged its audio. One utterance gives one event: a watch's candidate whose keyword end falls
inside the refractory period of an event already out is dropped unjudged; a watch's event takes
over the slot's open or held candidate from within its refractory period (the user's phrase,
as ``_custom_first``), and the slot's later event of the same keyword inside it is dropped.

A mixin of ``edge.detect.Detector`` (its own module to keep that one about the slot); it reads the
Detector's fields.
"""

from __future__ import annotations

import numpy as np


class VoicesWatch:
    """The watches of ``edge.detect.Detector`` (which sets ``_watched`` and every field used here)."""

    def _watch_reset(self) -> None:
        # keyword index -> [candidate (score, keyword end, steps left, peak window) or None,
        #                   held (score, keyword end, peak window) or None, keyword end of its last event]
        self._watch = {int(k): [None, None, -1e9] for k in np.flatnonzero(self._watched)}

    def _slot_thresholds(self) -> np.ndarray:
        """Where the slot opens a candidate: a watched keyword at its own threshold."""
        return np.where(self._watched, self._own, self.thresholds) if self._watch else self.thresholds

    def _watch_step(self, sm, win, cur, end_s: float) -> None:
        """Each watch's candidate on this invocation's smoothed scores ``sm``."""
        for k, w in self._watch.items():
            c = w[0]
            if c is not None:
                score, t, left, peak = c
                if sm[k] > score:
                    score, t, peak = float(sm[k]), self._keyword_end(win, end_s), cur
                left -= 1
                if left <= 0 or sm[k] < self.thresholds[k]:
                    w[0], w[1] = None, (score, t, peak)
                else:
                    w[0] = (score, t, left, peak)
            elif w[1] is None and sm[k] >= self.thresholds[k] and end_s >= self.quiet_until:
                w[0] = (float(sm[k]), self._keyword_end(win, end_s), self.peak_hops, cur)

    def _watch_due(self, final: bool = False) -> list[dict]:
        """The held watch candidates whose audio has come (``final``: every one, and every open one,
        on the audio there is), each judged by its keyword's phrase models: their events."""
        if final:
            for w in self._watch.values():
                if w[0] is not None:
                    score, t, _, peak = w[0]
                    w[0], w[1] = None, (score, t, peak)
        # called once per front-end frame: most frames nothing is held
        due = [(w[1][1], k) for k, w in self._watch.items() if w[1] is not None]
        if not due:
            return []
        events = []
        for _, k in sorted(due):   # the earliest keyword end first
            w = self._watch[k]
            if not final and self.samples < self._pending_end(w[1][1], k):
                continue
            score, t, peak = w[1]
            w[1] = None
            if t < self.quiet_until:       # an event out already covers this utterance
                continue
            voices = self._voices_of(k)
            pcm, end, at = self._snippet(t, voices.before_s, k)
            if not voices.says_at(pcm, end, self._tape, at):   # on the stream's tape (edge.phrase_tape)
                self.rejected += 1
                continue
            self._take_over(t)
            events.append(self._event(score, k, t, peak))
            w[2] = t
        return events

    def _take_over(self, t: float) -> None:
        """A watch's event at keyword end ``t`` takes over the slot's candidate (open or held) from
        within the refractory period around it."""
        if self.candidate is not None and abs(self.candidate[2] - t) < self.refractory:
            self.candidate = None
            self.rejected += 1
        if self.pending is not None and abs(self.pending[2] - t) < self.refractory:
            self.pending, self._accepted = None, False
            self.rejected += 1

    def _watched_again(self, k: int, t: float) -> bool:
        """Is the slot's event of keyword ``k`` at ``t`` the utterance its watch's event already was?"""
        w = self._watch.get(k)
        return w is not None and abs(t - w[2]) < self.refractory
