"""The Detector's trigger replayed on precomputed scores (``edge.detect`` re-exports both names).

``trigger`` gives every keyword's events of one stream at once, ``count_events`` one keyword's
count with an optional second stage: both step for step as ``edge.detect.Detector`` runs, for
scoring one stream at many operating points without running the encoder again
(``edge.operating``, the aggregator's gate, the benchmarks; tests/test_detect.py holds them equal).
Moved out of edge/detect.py in session 43 (2026-12-06) to keep that file about the streaming Detector.
"""

from __future__ import annotations

import numpy as np


def trigger(scores, ends, thresholds, names, smooth: int = 2, peak_hops: int = 5,
            refractory_s: float = 1.0) -> list[dict]:
    """The Detector's events from its precomputed first-stage scores, every keyword at once.

    ``Detector._step`` run for run on ``edge.operating.stream_scores``'s (T, K) scores and (T, 2)
    (window end, keyword end) times: smoothing over ``smooth`` runs; outside the refractory period
    the keyword furthest over its threshold (``thresholds``: (K,)) opens a candidate, which follows
    its peak for ``peak_hops`` runs or until its score falls under its threshold; the event is the
    peak's, at its keyword end, and silences every keyword for ``refractory_s`` from there. Base
    keywords only (no second stage). For scoring one stream at many operating points."""
    sc = np.asarray(scores, np.float32)
    thr = np.broadcast_to(np.asarray(thresholds, np.float32), (sc.shape[1],))
    # the mean of the last min(j + 1, smooth) runs, in float32 as the Detector's history is
    sm = np.empty_like(sc)
    for j in range(min(smooth - 1, len(sc))):
        sm[j] = sc[:j + 1].mean(axis=0)
    if len(sc) >= smooth:
        sm[smooth - 1:] = np.stack([sc[i:len(sc) - smooth + 1 + i] for i in range(smooth)]).mean(axis=0)
    over = sm - thr
    events, quiet, cand = [], -np.inf, None
    for j in range(len(sm)):
        if cand is None:
            k = int(np.argmax(over[j]))
            if over[j, k] >= 0 and ends[j, 0] >= quiet:
                cand = [float(sm[j, k]), k, float(ends[j, 1]), peak_hops]
            continue
        score, ck, t, left = cand
        if sm[j, ck] > score:
            cand = [float(sm[j, ck]), ck, float(ends[j, 1]), left - 1]
        else:
            cand[3] = left - 1
        if cand[3] <= 0 or sm[j, ck] < thr[ck]:
            events.append({"keyword": names[ck], "time_s": round(cand[2], 3), "score": round(cand[0], 4)})
            quiet, cand = cand[2] + refractory_s, None
    if cand is not None:  # the stream ended inside a candidate: Detector.flush reports it
        events.append({"keyword": names[cand[1]], "time_s": round(cand[2], 3), "score": round(cand[0], 4)})
    return events


def count_events(scores, thr, ends, smooth=2, peak_hops=5, refractory_s=1.0, times=None, peaks=None,
                 verify=None, search=False, candidates=None):
    """The Detector's trigger, step for step, on one keyword's precomputed score series.

    For evaluating many keyword models on one long stream without rerunning the encoder.
    ``ends``: (T, 2) window end and keyword-end times per run. Smoothing over ``smooth`` runs, a candidate opens at the threshold
    outside the refractory period, follows its peak for ``peak_hops`` runs or until the score falls
    below the threshold, and the event starts ``refractory_s`` from its keyword end. Only runs at or
    above the threshold can open a candidate, so the loop visits those and the candidates' windows.
    ``verify(run) -> bool``: the second stage on a run's window, asked for the peak run when the
    candidate closes; with ``search`` (``CustomKeywords.searches``) for each run as it arrives
    instead, and the first that passes is the event (the peak so far). ``candidates``: a list that
    gets every candidate's runs, the peak's first (to score a second stage offline: with ``verify``
    rejecting all there is no refractory period)."""
    sm = np.convolve(scores, np.ones(smooth) / smooth)[: len(scores)]
    sm[: smooth - 1] = np.cumsum(scores[: smooth - 1]) / np.arange(1, smooth)
    events, quiet, nxt, n = 0, -1.0, 0, len(sm)
    for j in np.nonzero(sm >= thr)[0]:
        if j < nxt or ends[j, 0] < quiet:
            continue
        early = search and verify is not None  # each run checked as it arrives; the first to pass is the event
        score, t, left, i, pk = sm[j], ends[j, 1], peak_hops, j, j
        passed = early and verify(j)
        while not passed and i + 1 < n:
            i += 1
            left -= 1
            if sm[i] > score:
                score, t, pk = sm[i], ends[i, 1], i
            if early and verify(i):
                passed = True
            elif left <= 0 or sm[i] < thr:
                break
        if candidates is not None:
            candidates.append([int(pk)] + [r for r in range(j, i + 1) if r != pk])
        if verify is not None and not (passed if early else verify(pk)):
            nxt = i + 1  # rejected by the second stage: no event and no refractory period
            continue
        events += 1
        if peaks is not None:
            peaks.append(int(pk))
        if times is not None:
            times.append(round(float(t), 3))  # the event's time_s, as the Detector reports it
        quiet, nxt = t + refractory_s, i + 1
    return events
