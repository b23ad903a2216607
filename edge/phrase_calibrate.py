"""The phrase second stage's cutoffs for a false-accept rate on negative audio: shared by the
toolchain, which chooses the shipped ones on development data (``host/phrase_stage.py``), and by
``edgelearn device calibrate``, which chooses them on the place's own everyday audio so that
``--sensitivity R`` keeps both stages (before session 44 a sensitivity ran the first stage alone, at
half the default's recall on voices never trained on).

How: the Detector runs with the stage's first-stage threshold and a ``Recorder`` as its second
stage, which judges nothing: it records each candidate's phrase peak and rejects it, so the Detector
opens every candidate it would open at that threshold (its own snippets, its own waits) in one pass
over the audio, however long. For a cutoff, a candidate passes when its peak reaches it, and the
passes one second apart are the events (an accepted event's refractory period; the Detector's runs
to a window's end, so it can still report a word ending within that second, which this drops); per
command, the lowest cutoff on ``GRID`` whose events on the negatives stay within its share of the target.

    >>> rec = Recorder(PhraseConfirm(bundle))
    >>> det = Detector(km, threshold=rec.first_stage, asr=rec); detect over the negatives
    >>> cutoffs([(rec.events, None)], hours, commands, rec.first_stage, 0.5)
"""

from __future__ import annotations

import numpy as np

PIECE = 1600  # samples pushed at a time (0.1 s, ``edge.detect.detect_pcm``'s)
GRID = tuple(sorted(set(np.round(np.arange(0.5, 1.0, 0.005), 3)) | {0.996, 0.998, 1.0}))


class Recorder:
    """A second stage for ``edge.detect.Detector`` that records and rejects: ``events`` gets one
    {"keyword", "time_s", "score", "phrase"} per candidate (``phrase``: ``stage``'s peak, None for a
    keyword without a phrase model). ``stage``: anything with ``peak(word, pcm, keyword_end_s)``,
    ``first_stage``, ``before_s`` and ``after_s`` (``edge.phrase_stage.PhraseConfirm``)."""

    def __init__(self, stage):
        self.stage, self.events, self.det = stage, [], None
        self.first_stage, self.before_s, self.after_s = stage.first_stage, stage.before_s, stage.after_s

    def says_at(self, word: str, pcm, keyword_end_s: float) -> bool:
        ev = dict(self.det.judging)  # the candidate the Detector asks about (keyword, time, score)
        ev["phrase"] = self.stage.peak(word, pcm, keyword_end_s)
        self.events.append(ev)
        return False


class Collector:
    """Candidates of streams read once, chunk by chunk: ``tee(chunks)`` passes a stream's chunks on
    (to whatever else reads it, e.g. ``edge.operating.stream_scores``) while a fresh
    ``det_for(recorder)`` (a Detector at the stage's first-stage threshold with ``asr`` the
    recorder) hears them; once the stream is read its candidates are appended to ``streams``."""

    def __init__(self, det_for, stage):
        self.det_for, self.stage, self.streams = det_for, stage, []

    def tee(self, chunks):
        rec = Recorder(self.stage)
        rec.det = det = self.det_for(rec)
        rest = np.zeros(0, np.int16)
        for c in chunks:
            x = np.concatenate([rest, np.asarray(c, np.int16)])
            n = len(x) // PIECE * PIECE
            for i in range(0, n, PIECE):  # in a microphone's blocks, whatever the reader's chunks (a minute
                det.push(x[i:i + PIECE])  # at once would decide a waiting candidate before the frames after it)
            rest = x[n:]
            yield c
        det.push(rest)
        det.flush()
        self.streams.append(rec.events)


def record(det_for, stage, streams) -> list[list[dict]]:
    """Every candidate of each stream (``streams``: iterables of int16 chunks), as ``Collector``."""
    col = Collector(det_for, stage)
    for chunks in streams:
        for _ in col.tee(chunks):
            pass
    return col.streams


def refractory(events: list[dict], seconds: float = 1.0) -> list[dict]:
    """One event per utterance, as the Detector's refractory period after an accepted event gives:
    ``events`` in the order the Detector judged them (a later candidate's keyword end may lie a frame
    before an earlier one's; the first judged is the one detection reports)."""
    kept = []
    for e in events:
        if not kept or e["time_s"] - kept[-1]["time_s"] >= seconds:
            kept.append(e)
    return kept


def accepted(evs, first: float, cutoffs: dict) -> list[dict]:
    """The events of candidates ``evs`` with the first stage at ``first`` and these cutoffs (a
    keyword not in ``cutoffs`` passes only without a phrase model)."""
    return refractory([e for e in evs if e["score"] >= first and (e["phrase"] is None or
                       e["phrase"] >= cutoffs.get(e["keyword"], 1.0))], 1.0)


def cutoffs(negatives, hours: float, cmds, first: float, target: float, grid=GRID) -> tuple[dict, dict]:
    """({command: cutoff}, {command: false accepts per hour at it, None where even the top of
    ``grid`` exceeds its share}) on ``negatives``: [(candidates, is_false(event) or None)]."""
    cut, rate = {}, {}
    for c in cmds:
        cut[c], rate[c] = 1.0, None
        for x in grid:
            n = sum(1 for evs, false in negatives for e in accepted(evs, first, {c: x})
                    if e["keyword"] == c and (false is None or false(e)))
            if n / hours <= target / len(cmds):
                cut[c], rate[c] = float(x), round(n / hours, 3)
                break
    return cut, rate


def device_points(stage, streams, hours: float, targets, firsts=None) -> list[dict]:
    """``device calibrate``'s phrase-stage half of each target's point: {"first_stage": {command:
    threshold}, "cutoffs", "fa_h", "held_at_default"}, from ``streams``' candidates
    (``Collector.streams``). Each command's cutoff is the lowest within its share of the target
    behind the stage's first-stage threshold; where even the top cutoff lets too many through (a
    word the command's models hear as the command itself, "yesterday" for "yes"), the first stage's
    threshold is raised along ``firsts`` (``edge.operating.GRID``) until one does. Where the audio is
    too short to show a target (a single false accept already over a command's share) the
    calibration cannot tell a cutoff from a lower one, and a command whose cutoff would fall under
    the bundle's own keeps the bundle's (as the first stage's thresholds are held,
    ``edge.operating.held_at_default``)."""
    from edge.operating import GRID as FIRSTS

    cmds, negs = list(stage.cutoffs), [(evs, None) for evs in streams]
    out = []
    for t in targets:
        share = t / len(cmds)
        cut, rate = cutoffs(negs, hours, cmds, stage.first_stage, t)
        first = dict.fromkeys(cmds, stage.first_stage)
        for c in (c for c in cmds if rate[c] is None):
            for f in (f for f in (FIRSTS if firsts is None else firsts) if f > stage.first_stage):
                x, r = cutoffs(negs, hours, [c], f, share)
                if r[c] is not None:
                    cut[c], rate[c], first[c] = x[c], r[c], f
                    break
        held = []
        if hours * share < 1:
            held = sorted(c for c in cmds if cut[c] < stage.cutoffs[c])
            for c in held:
                cut[c] = stage.cutoffs[c]
                n = sum(1 for evs in streams for e in accepted(evs, first[c], {c: cut[c]}) if e["keyword"] == c)
                rate[c] = round(n / hours, 3)
        out.append({"first_stage": first, "cutoffs": cut, "fa_h": rate, "held_at_default": held})
    return out
