"""The Detector's held candidates: a candidate waiting for the audio its second stage judges.

A base keyword's candidate under a recogniser or the phrase models (``asr``: ``edge.confirm``,
``edge.phrase_stage``) waits in ``pending`` until its snippet's audio has come (``_pending_end``);
``_confirm`` cuts the snippet from the Detector's audio (``_snippet``, which the watches of keywords
taught other voices cut theirs with too: ``edge.detect_voices``) and judges it; a base
event the stage passed may be held for the enrolled keywords' chance (``_accepted``, ``_release``,
``_quiet_after``, ``_custom_first``). A mixin of ``edge.detect.Detector`` (its own module to keep
that one about the streaming first stage); it reads the Detector's fields.
"""

from __future__ import annotations

from edge import features as F

# a passed command held for the enrolled keywords' chance (``Detector._wait``) comes out once nothing
# has been said for QUIET_S past its keyword end (the phrase stage's own wait: a command said alone
# then comes out as without enrolled keywords), the loudness rule allowing QUIET_SLACK_S of its tail
# (session 44; scripts/enrolled_hold_dev.py)
QUIET_S, QUIET_SLACK_S = 0.3, 0.1


class HeldCandidates:
    """The held-candidate half of ``edge.detect.Detector`` (which sets every field used here)."""

    def _quiet_after(self, t: float) -> bool:
        """Has nothing been said since the held command's keyword end ``t``, for ``QUIET_S``? No frame
        after it as loud as the middle of the last second's loudness range (``_keyword_end``'s rule):
        the command was said alone, so no enrolled phrase goes on from it and the rest of the wait
        would only delay it. Speech going on (an enrolled "lights on" after the "left" it starts like),
        or noise as loud as speech, keeps the whole wait."""
        end_s = ((self.n_frames - 1) * F.HOP_LENGTH + F.FRAME_LENGTH) / F.SAMPLE_RATE
        return end_s >= t + QUIET_S and self._keyword_end(self._window(), end_s) <= t + QUIET_SLACK_S

    def _release(self):
        """The held base-keyword event (the stage passed it; no enrolled keyword took it over)."""
        score, k, t, peak = self.pending
        self.pending, self._accepted = None, False
        return self._event(score, k, t, peak)

    def _snippet(self, t: float, before: float, k: int):
        """(the audio kept from ``before`` s ahead of keyword end ``t`` to its ``_pending_end``, the
        keyword end in it in s, the stream sample it starts at)."""
        start = self.samples - len(self.audio)  # absolute index of audio[0]
        a = max(0, int(round((t - before) * F.SAMPLE_RATE)) - start)
        b = max(a, min(len(self.audio), self._pending_end(t, k) - start))
        return self.audio[a:b], (t * F.SAMPLE_RATE - start - a) / F.SAMPLE_RATE, start + a

    def _confirm(self, final: bool = False):
        """Decide the pending base candidate on its audio so far, with the recogniser (or the phrase
        models): the event, None when rejected, or None while a passed one is held for ``_wait`` (not
        ``final``)."""
        score, k, t, peak = self.pending
        self.pending = None
        pcm, end, _ = self._snippet(t, self._before, k)
        says_at = getattr(self.asr, "says_at", None)  # a stage that needs the keyword end in the snippet
        # the candidate judged now (``edge.phrase_calibrate.Recorder`` reads it)
        self.judging = {"keyword": self.names[k], "time_s": round(float(t), 3), "score": round(float(score), 4)}
        ok = (says_at(self.names[k], pcm, end) if says_at is not None else self.asr.says(self.names[k], pcm))
        if not ok:
            return self._reject()
        self.pending = (score, k, t, peak)
        if self._wait > self._after and not final:
            self._accepted = True
            return None
        return self._release()

    def _pending_end(self, t: float, k: int | None = None) -> int:
        """The sample the recogniser's (or keyword ``k``'s phrase models') audio for a keyword ending
        at ``t`` s runs to."""
        voices = None if k is None else self._voices_of(k)
        return int(round((t + (self._after if voices is None else voices.after_s)) * F.SAMPLE_RATE))

    def _voices_of(self, k: int):
        """Keyword ``k``'s other-voices path (``edge.custom_voices.Voices``), or None."""
        nb = len(self.base_idx)
        return self._voices[k - nb] if k >= nb else None

    def _custom_first(self, over, end_s: float) -> bool:
        """With a second stage on the base commands (their first stage lowered, e.g. to 0.2), does an
        enrolled keyword crossing its own threshold take over a base candidate that is open, waits
        for the stage, or was passed by it and is held (``_wait``)? It does: the user's own phrase ("lights on") is not lost to a
        command it starts like ("left"), which the lowered first stage opens first and the stage,
        judging sound, may pass (tests/test_keywords_rebuild.py's enrolled "lights on" was, 2026-12-06)."""
        nb = len(self.base_idx)
        if self.asr is None or len(over) == nb or end_s < self.quiet_until:
            return False
        held = (self.candidate is not None and self.candidate[1] < nb) or \
            (self.pending is not None and self.pending[1] < nb)
        return held and float(over[nb:].max()) >= 0

    def _reject(self):
        self.rejected += 1
        return None

    def _hold(self, score, k, t):
        """A candidate waits for the audio its second stage judges (``_confirm``)."""
        self.pending = (score, k, t, self._peak_window)
        return None
