"""Which local examples each adaptation step sees.

``Batches(y, batch)`` with no options is the loop's plain order: one permutation of the
local examples, walked ``batch`` at a time (what ``edge.adapt.run.train`` always did).

A speaker adaptation set is lopsided: 3 clips per command and hundreds of ambient windows
(``_unknown_``) cut from the place's own audio (``edge.adapt.ambient``). Walked in order,
the commands are a few percent of the steps; without the negatives, the tail forgets
``_unknown_`` and fires on everyday speech (issue 17: 900-1,400 false accepts per hour).

- ``negative_share``: that fraction of every batch is drawn from the ``negatives`` labels
  (the bundle's ``_unknown_`` / ``_silence_`` ids; evenly between those present), the rest
  from the other labels;
- ``balance``: the non-negative part is class-balanced (every command as often as any other,
  whatever its clip count); without a share, every label present (negatives included) is.

Draws are a function of ``(seed, step)`` only, so a paused run resumes on the same batches.

    >>> b = Batches(y, 16, negatives=(35, 36), negative_share=0.5, balance=True)
    >>> idx = b(0)        # 8 command clips (balanced) + 8 negatives
"""

from __future__ import annotations

import numpy as np

from edge.errors import EdgelearnError


class Batches:
    def __init__(self, y, batch: int, seed: int = 0, balance: bool = False, negatives=(),
                 negative_share: float | None = None):
        y = np.asarray(y, np.int64)
        if len(y) == 0 or batch < 1:
            raise EdgelearnError(f"{len(y)} examples in batches of {batch}", fix="pass labelled clips")
        if negative_share is not None and not 0.0 <= negative_share <= 1.0:
            raise EdgelearnError(f"negative share {negative_share} is outside 0..1", fix="pass a fraction")
        self.y, self.batch, self.seed = y, int(batch), int(seed)
        self.balance = bool(balance)
        self.negatives = tuple(int(k) for k in negatives)
        self.share = None if negative_share is None else float(negative_share)
        self.order = np.random.default_rng(seed).permutation(len(y))
        neg = np.isin(y, self.negatives)
        self.neg_groups = [np.nonzero(y == k)[0] for k in self.negatives if (y == k).any()]
        pos = np.nonzero(~neg)[0]
        self.pos = pos
        self.pos_groups = [np.nonzero(y == k)[0] for k in np.unique(y[pos])]
        self.all_groups = [np.nonzero(y == k)[0] for k in np.unique(y)]
        if self.share is not None and self.share > 0 and not self.neg_groups:
            self.share = None  # nothing to draw negatives from: the plain (or balanced) walk
        if self.share is not None and len(pos) == 0:
            self.share = None

    @property
    def plain(self) -> bool:
        return not self.balance and self.share is None

    def describe(self) -> dict:
        """What a checkpoint records (a run resumes only with the same sampling)."""
        if self.plain:
            return {}
        return {"balance": self.balance, "negatives": list(self.negatives), "negative_share": self.share}

    def __call__(self, step: int) -> np.ndarray:
        if self.plain:
            return self.order[(step * self.batch + np.arange(self.batch)) % len(self.y)]
        rng = np.random.default_rng([self.seed, int(step)])
        if self.share is None:
            return _balanced(rng, self.all_groups, self.batch)
        n_neg = int(round(self.batch * self.share))
        neg = _balanced(rng, self.neg_groups, n_neg)
        n_pos = self.batch - n_neg
        pos = _balanced(rng, self.pos_groups, n_pos) if self.balance else \
            self.pos[rng.integers(0, len(self.pos), n_pos)]
        return np.concatenate([pos, neg]).astype(np.int64)


def _balanced(rng, groups, n: int) -> np.ndarray:
    """``n`` indices, the groups taking turns in a random order, a random member of each."""
    if n <= 0 or not groups:
        return np.zeros(0, np.int64)
    turns = np.concatenate([rng.permutation(len(groups)) for _ in range(-(-n // len(groups)))])[:n]
    return np.array([groups[g][rng.integers(0, len(groups[g]))] for g in turns], np.int64)
