"""scripts/phone_stage.py's two alignment scores against brute force over every segmentation."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from phone_stage import phone_mean_best, segmental_best  # noqa: E402


def _paths(T, n, dmin, dmax):
    """Every (start, durations) of n contiguous segments of dmin..dmax frames inside T frames."""
    for durs in itertools.product(range(dmin, dmax + 1), repeat=n):
        for start in range(0, T - sum(durs) + 1):
            yield start, durs


def _brute(v, dmin, dmax, per_phone):
    T, n = v.shape
    best = -np.inf
    for start, durs in _paths(T, n, dmin, dmax):
        t, parts = start, []
        for j, d in enumerate(durs):
            parts.append(v[t:t + d, j])
            t += d
        score = np.mean([p.mean() for p in parts]) if per_phone else np.concatenate(parts).mean()
        best = max(best, score)
    return best


def test_scores_equal_brute_force():
    rng = np.random.default_rng(0)
    for trial in range(6):
        v = np.log(rng.uniform(0.02, 1.0, (12, 3)))
        v[rng.integers(0, 12), rng.integers(0, 3)] = 0.0
        assert np.isclose(segmental_best(v, dmin=1, dmax=4, iters=30), _brute(v, 1, 4, False), atol=1e-6)
        assert np.isclose(phone_mean_best(v, dmin=2, dmax=4), _brute(v, 2, 4, True), atol=1e-9)


def test_phone_order_matters():
    v = np.full((20, 3), -3.0)
    v[4:7, 0] = v[7:10, 1] = v[10:13, 2] = 0.0    # the phones said in order
    assert np.isclose(phone_mean_best(v), 0.0) and np.isclose(segmental_best(v), 0.0)
    w = v[:, ::-1].copy()                          # the same sounds, the word's phones reversed
    assert phone_mean_best(w) < -1.0 and segmental_best(w) < -1.0


def test_candidates_are_the_detectors_trigger_with_every_run():
    from phone_stage import candidates

    s = np.zeros((60, 1), np.float32)
    s[10:14, 0] = [0.5, 0.9, 0.8, 0.6]   # one word: smoothed over 2 runs, the peak at run 12
    s[40:42, 0] = [0.7, 0.7]
    ends = np.stack([np.arange(60) * 0.08] * 2, axis=1)
    got = candidates(s, ends, 0.5, 0)
    assert [pk for pk, _ in got] == [12, 41]
    assert sorted(got[0][1]) == list(range(11, 15)) and got[0][1][0] == 12  # every run, the peak's first
