"""The frozen prefix of the conv tail: what no trained tensor changes, computed once per example.

``STAGES`` are the points a trainer's forward can start from: ``"x"`` the backbone
output (nothing skipped), ``"y1"`` dw4's ReLU output, ``"z2"`` pw4's output before its
bias. ``ConvTail.frozen_stage`` picks one for a set of trained tensors and
``ConvTail.prefix`` computes it; ``Prefix`` holds the result.
"""

from __future__ import annotations

import numpy as np

from edge.errors import EdgelearnError

STAGES = ("x", "y1", "z2")


class Prefix:
    """The frozen prefix of the tail for n examples at ``stage``: (n, P, C) int16, one float32 scale each.

    Symmetric per-example quantisation to int16: half the float32 map, twice the int8
    backbone output. int8 was tried and rejected: its rounding flips ReLUs just above zero,
    which moved LoRA's gradients by up to 10 % on a small map. float16 keeps the step as
    well but numpy converts it to float32 ~15x slower than int16 (150 vs 10 us per batch
    here), which was most of a bias-only step. Indexing and ``concat`` keep the stage.
    """

    def __init__(self, q: np.ndarray, scale: np.ndarray, stage: str):
        self.q, self.scale, self.stage = q, scale, stage

    @classmethod
    def of(cls, v: np.ndarray, stage: str) -> "Prefix":
        v = np.asarray(v, np.float32)
        peak = np.abs(v).reshape(len(v), -1).max(axis=1) if v.size else np.zeros(len(v), np.float32)
        if not np.isfinite(peak).all():
            raise EdgelearnError(f"the tail's {stage!r} prefix is not finite",
                                 fix="check the bundle's tail.npz and the backbone output")
        scale = np.where(peak > 0, peak / 32767.0, 1.0).astype(np.float32)
        q = np.rint(v / scale.reshape((-1,) + (1,) * (v.ndim - 1)))
        return cls(q.astype(np.int16), scale, stage)

    @classmethod
    def concat(cls, parts) -> "Prefix":
        stages = {p.stage for p in parts}
        if len(stages) != 1:
            raise EdgelearnError(f"prefixes of different stages {sorted(stages)}", fix="prepare them with one trainer")
        return cls(np.concatenate([p.q for p in parts]), np.concatenate([p.scale for p in parts]), stages.pop())

    def __len__(self) -> int:
        return len(self.q)

    def __getitem__(self, idx) -> "Prefix":
        return Prefix(self.q[idx], self.scale[idx], self.stage)

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.scale.nbytes

    def to_float(self) -> np.ndarray:
        out = self.q.astype(np.float32)
        out *= self.scale.reshape((-1,) + (1,) * (out.ndim - 1))
        return out
