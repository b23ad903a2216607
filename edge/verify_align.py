"""The verifier's alignment: a subsequence DTW of unit-vector templates against window sequences.

A template's distance to a window is the mean cosine distance along the best alignment of every
template step to one window step, the window steps advancing by 0, 1 or 2 (and, from verifier
version 2, never by 0 twice in a row), free start and end in the window (``sdtw``; ``sdtw_batch``
runs every template of a keyword at once, element for element the same numbers). ``Prepared``
holds a keyword's templates as unit vectors, once. ``edge.verify.Verifier`` makes the unit
vectors and calls these; every name stays importable from ``edge.verify``.

    >>> d = sdtw(tpl, seqs)                    # (m, d) template, (N, n, d) sequences -> (N,)
    >>> d = sdtw_batch([tpl, tpl2], seqs)      # (2, N)
"""

from __future__ import annotations

import numpy as np


def sdtw(tpl: np.ndarray, seqs: np.ndarray, limit_speedup: bool = True) -> np.ndarray:
    """Mean cosine distance of unit ``tpl`` (m, d) aligned to each unit sequence in ``seqs``
    (N, n, d): every template step to one window step, window steps advancing by 0, 1 or 2,
    free start and end in the window; with ``limit_speedup`` never by 0 twice in a row (version 1
    entries were calibrated without that limit, which let a template collapse onto a few steps)."""
    cost = 1.0 - np.einsum("md,knd->kmn", tpl, seqs)
    moved = cost[:, 0].copy()             # paths whose last template step advanced the window
    stayed = np.full_like(moved, np.inf)  # paths whose last template step stayed on its window step
    for i in range(1, len(tpl)):
        # a step may stay only after a step that advanced: two template steps per window step at
        # most, so the phrase may be at most twice as fast as the template
        prev = np.minimum(moved, stayed)
        best = np.full_like(moved, np.inf)
        best[:, 1:] = prev[:, :-1]
        np.minimum(best[:, 2:], prev[:, :-2], out=best[:, 2:])
        stayed = cost[:, i] + (moved if limit_speedup else prev)
        moved = cost[:, i] + best
    return np.minimum(moved, stayed).min(axis=1) / len(tpl)


class Prepared:
    """One keyword's templates as unit vectors for its entry's ``version`` (``Verifier.prepare``):
    ``units`` one (m, dim) float32 array each, ``stacked`` all of them end to end."""

    def __init__(self, units: list[np.ndarray], version: int):
        self.units, self.version = units, version
        self.stacked = np.concatenate(units) if units else None


def sdtw_batch(tpls: list[np.ndarray], seqs: np.ndarray, limit_speedup: bool = True,
               stacked: np.ndarray | None = None) -> np.ndarray:
    """``sdtw`` of each unit template in ``tpls`` against ``seqs`` (N, n, d) at once: (len(tpls), N).

    The same arithmetic as ``sdtw``, element for element: the step costs come from one einsum over
    the templates end to end (each cost is the same sum over d), and the recursion runs on all
    templates side by side up to the longest one, each template's distance taken at its own last
    step (the rows past it are never read). ``stacked``: ``np.concatenate(tpls)``, when the caller
    keeps it."""
    lens = [len(t) for t in tpls]
    if not lens:
        raise ValueError("sdtw_batch needs at least one template")
    seqs = np.asarray(seqs)
    cat = np.concatenate(tpls) if stacked is None else stacked
    cost_all = 1.0 - np.einsum("md,knd->kmn", cat, seqs)            # (N, sum m, n)
    big = max(lens)
    n_seq, n = cost_all.shape[0], cost_all.shape[2]
    cost = np.ones((big, len(lens), n_seq, n), cost_all.dtype)      # step, template, window, window step
    start = 0
    for j, m in enumerate(lens):
        cost[:m, j] = cost_all[:, start:start + m].transpose(1, 0, 2)
        start += m
    out = np.empty((len(lens), n_seq), cost.dtype)
    last = {}
    for j, m in enumerate(lens):
        last.setdefault(m - 1, []).append(j)
    moved = cost[0].copy()
    stayed = np.full_like(moved, np.inf)
    prev, best = np.empty_like(moved), np.full_like(moved, np.inf)
    for j in last.get(0, ()):
        out[j] = np.minimum(moved[j], stayed[j]).min(axis=1) / lens[j]
    for i in range(1, big):
        np.minimum(moved, stayed, out=prev)
        best[..., 1:] = prev[..., :-1]                  # best[..., 0] stays inf
        np.minimum(best[..., 2:], prev[..., :-2], out=best[..., 2:])
        np.add(cost[i], moved if limit_speedup else prev, out=stayed)
        np.add(cost[i], best, out=moved)
        for j in last.get(i, ()):
            out[j] = np.minimum(moved[j], stayed[j]).min(axis=1) / lens[j]
    return out
