"""Replay for the conv tail: tail inputs mixed into a batch, and a buffer prepared once per run.

``mix_replay`` appends class-balanced, dequantised replay slots to a batch;
``ReplayPool`` does the same from slots prepared once per training run for one
``ConvTrainer`` (its frozen prefix, the teacher's posteriors), which is what
``edge.adapt.run.train`` uses. Both read a ``ReplayStore`` or a portable ``ReplayBuffer``.
"""

from __future__ import annotations

import numpy as np

from edge.adapt.prefix import Prefix
from edge.replay import sample_slots, slot_arrays


def mix_replay(x, y, replay, n: int, to_float=None):
    """Append ``n`` class-balanced replay examples (dequantised tail inputs) to a batch."""
    if replay is None or replay.count == 0 or n <= 0:
        return x, y
    rx, ry = slot_arrays(replay, sample_slots(replay, n))
    x = to_float(x) if to_float is not None else np.asarray(x, np.float32)
    return np.concatenate([x, rx.reshape((n,) + x.shape[1:])]), np.concatenate([np.asarray(y), ry])


class ReplayPool:
    """A replay buffer's examples, prepared once per training run instead of every step.

    Sampling is the buffer's own (class-balanced, the same sequence as ``mix_replay``).
    Per occupied slot it holds the teacher's posteriors (the base tail never changes
    during a run) and, when the trainer's forward starts past the backbone output, the
    trainer's ``Prefix`` (int16: twice the slot's int8 bytes). At stage ``"x"`` the
    slots are dequantised when sampled, as ``mix_replay`` does.
    """

    def __init__(self, replay, trainer, shape, teacher=None, chunk: int = 64):
        self.replay, self.trainer, self.shape = replay, trainer, tuple(shape)
        buf = getattr(replay, "buffer", replay)
        slots = np.array([s for s in range(buf.capacity) if buf.label_at(s) >= 0], np.int64)
        self.row = np.full(buf.capacity, -1, np.int64)
        self.row[slots] = np.arange(len(slots))
        self.y = np.empty(len(slots), np.int64)  # read by sample() only when self.x holds prefixes
        self.x = None if trainer.stage == "x" else []
        soft = []
        for a in range(0, len(slots) if teacher is not None or self.x is not None else 0, chunk):
            rx, self.y[a:a + chunk] = slot_arrays(replay, slots[a:a + chunk])
            rx = rx.reshape((len(rx),) + self.shape)
            if teacher is not None:
                soft.append(np.asarray(teacher(rx), np.float32))
            if self.x is not None:
                self.x.append(trainer.prepare(rx))
        self.soft = np.concatenate(soft) if soft else None
        if self.x is not None:
            self.x = Prefix.concat(self.x)

    def sample(self, n: int):
        """``n`` class-balanced replay examples: (inputs for ``step``, labels, teacher posteriors or None)."""
        slots = np.array(sample_slots(self.replay, n), np.int64)
        rows = self.row[slots]
        if self.x is None:
            rx, ry = slot_arrays(self.replay, slots)
            rx = rx.reshape((len(rx),) + self.shape)
        else:
            rx, ry = self.x[rows], self.y[rows]
        return rx, ry, (self.soft[rows] if self.soft is not None else None)

    def mix(self, x, y, n: int):
        """A batch with ``n`` replay examples appended; the replay rows' teacher posteriors (or None)."""
        rx, ry, soft = self.sample(n)
        if isinstance(rx, Prefix):
            bx = Prefix.concat([x, rx])
        else:
            bx = np.concatenate([self.trainer.tail.to_float(x), rx])
        return bx, np.concatenate([np.asarray(y, np.int64), ry]), soft
