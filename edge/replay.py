"""The replay buffer on a Linux board: ``edge.portable.replay`` plus atomic, batched persistence.

Adds go to memory; the file ``<state>/replay.bin`` is rewritten (temp file +
fsync + os.replace) only every ``flush_every`` adds or on ``flush()``, so an SD
card or flash sees one write per batch, and a power cut loses at most the last
unflushed batch, never the file.

    >>> rs = ReplayStore("state", dim=64, max_bytes=64 * 1024)
    >>> rs.add(embedding, label)        # flushed every 32 adds
    >>> rs.flush()
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edge.errors import EdgelearnError
from edge.portable.replay import ReplayBuffer, ReplayError
from edge.store import atomic_write


class ReplayStore:
    def __init__(self, state_dir, dim: int = 64, max_bytes: int = 64 * 1024, flush_every: int = 32):
        self.path = Path(state_dir) / "replay.bin"
        self.flush_every = flush_every
        if self.path.exists():
            try:
                self.buffer = ReplayBuffer.from_bytes(self.path.read_bytes())
            except ReplayError as e:
                raise EdgelearnError(f"{self.path}: {e}",
                                     fix="delete the file to start an empty replay buffer") from None
            if self.buffer.dim != dim:
                raise EdgelearnError(f"{self.path} holds {self.buffer.dim}-d vectors, the model gives {dim}",
                                     fix="delete the file; it was made for another encoder")
        else:
            self.buffer = ReplayBuffer(dim, max_bytes)

    def add(self, vec, label: int) -> None:
        self.buffer.add([float(v) for v in np.asarray(vec, np.float32)], int(label))
        if self.buffer.changes >= self.flush_every:
            self.flush()

    def add_many(self, x: np.ndarray, y: np.ndarray) -> None:
        for v, lab in zip(x, y):
            self.add(v, lab)

    def flush(self) -> None:
        if self.buffer.changes == 0 and self.path.exists():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, self.buffer.to_bytes())
        self.buffer.mark_saved()
