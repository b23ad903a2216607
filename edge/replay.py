"""The replay buffer on a Linux board: ``edge.portable.replay`` plus numpy access and atomic, batched persistence.

Adds go to memory; the file ``<state>/<name>`` is rewritten (temp file + fsync +
os.replace) only every ``flush_every`` adds or on ``flush()``, so an SD card or
flash sees one write per batch, and a power cut loses at most the last unflushed
batch, never the file. The byte layout is the portable buffer's (the ESP32 reads
the same file); ``add`` and ``sample_arrays`` do the per-value work in numpy,
because tail inputs are 8000 values and the portable loops are written for 64-d
vectors on a microcontroller. ``add`` gives byte-identical slots.

Several processes may feed one file (two ``device detect``, the agent, ``device adapt``): each
keeps what it added since it last loaded or wrote the file (``_pending``) and writes by a merge under
the state lock (``edge.atomic.state_lock``): the file is read again, this process's adds (and label
removals) are made on it in their order, as the portable ``add`` makes them (eviction included), and
the result is written and becomes this process's buffer. So no process's examples are lost to
another's write (the file used to be whichever wrote last).

Two buffers live side by side: ``replay.bin`` (64-d embeddings, the enrolment
head's inputs) and ``replay_tail.bin`` (the conv tail's inputs: backbone outputs).

    >>> rs = ReplayStore("state", dim=8000, max_bytes=1 << 20, name=TAIL_REPLAY)
    >>> rs.add(features, label)         # flushed every 32 adds
    >>> x, y = rs.sample_arrays(16)     # class-balanced, dequantised
    >>> rs.flush()
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np

from edge.atomic import atomic_write, no_space, set_aside, state_lock
from edge.errors import EdgelearnError
from edge.portable.replay import _SLOT_FMT, HEADER_BYTES, HEADER_FMT, MAGIC, SLOT_OVERHEAD, ReplayBuffer, ReplayError

EMBEDDING_REPLAY = "replay.bin"
TAIL_REPLAY = "replay_tail.bin"


def sample_slots(replay, n: int) -> list[int]:
    """``n`` class-balanced slots from a ``ReplayStore`` or a portable ``ReplayBuffer`` (its sampler)."""
    return list(getattr(replay, "buffer", replay).sample(n))


def slot_arrays(replay, slots) -> tuple[np.ndarray, np.ndarray]:
    """Dequantised vectors (n, dim) float32 and labels of replay slots, from either kind of buffer."""
    if hasattr(replay, "arrays"):
        return replay.arrays(slots)
    import array

    buf = array.array("f", bytes(4 * replay.dim))
    rx, ry = np.empty((len(slots), replay.dim), np.float32), np.empty(len(slots), np.int64)
    for i, slot in enumerate(slots):
        ry[i] = replay.get(int(slot), buf)
        rx[i] = np.frombuffer(buf, np.float32)
    return rx, ry


def load_replay(path, dim: int | None = None) -> ReplayBuffer | None:
    """The replay buffer in ``path`` (None if there is none), or one EdgelearnError naming the file.

    The header is checked against the file's size before anything is allocated, so a garbled
    capacity or dimension cannot ask for gigabytes. ``dim``: the vector size the caller needs."""
    path = Path(path)
    fix = "delete the file to start an empty replay buffer (it only holds examples to rehearse)"
    try:
        if not path.exists():
            return None
        data = path.read_bytes()
    except OSError as e:
        raise EdgelearnError(f"replay file {path} is unreadable ({e.strerror or e})", fix=fix) from None
    try:
        if len(data) < HEADER_BYTES:
            raise ReplayError(f"{len(data)} bytes, shorter than the {HEADER_BYTES}-byte header (truncated)")
        magic, hdim, cap, _, _ = struct.unpack_from(HEADER_FMT, data, 0)
        if magic != MAGIC:
            raise ReplayError(f"not a replay buffer (magic {magic!r})")
        if hdim < 1 or len(data) != HEADER_BYTES + cap * (SLOT_OVERHEAD + hdim):
            raise ReplayError(f"{len(data)} bytes do not hold the {cap} slots of {hdim} values its header "
                              "says (truncated or corrupted)")
        rb = ReplayBuffer.from_bytes(data)
    except (ReplayError, ValueError, struct.error) as e:
        raise EdgelearnError(f"replay file {path} is damaged: {e}", fix=fix) from None
    if dim is not None and rb.dim != dim:
        raise EdgelearnError(f"replay file {path} holds {rb.dim}-d vectors, the model gives {dim}",
                             fix="delete the file; it was made for another encoder")
    return rb


def open_for_adding(state_dir, dim: int, max_bytes: int, name: str) -> "ReplayStore":
    """The replay store of a command that only adds to it (``detect``, the agent, ``wyoming``): a
    damaged file, or one made for another encoder, is kept beside as ``NAME.damaged`` with one
    warning and the buffer starts empty (it only holds examples to rehearse), so the wake word
    is not stopped by it; a command that trains on the buffer still refuses it in one sentence."""
    try:
        return ReplayStore(state_dir, dim=dim, max_bytes=max_bytes, name=name)
    except EdgelearnError as e:
        path = Path(state_dir) / name
        if not path.is_file():
            raise
        detail = e.problem.split(" is damaged: ", 1)[-1]  # load_replay's sentence names the file already
        set_aside(path, f"{detail}; an empty buffer starts")
        return ReplayStore(state_dir, dim=dim, max_bytes=max_bytes, name=name)


class ReplayStore:
    def __init__(self, state_dir, dim: int = 64, max_bytes: int = 64 * 1024, flush_every: int = 32,
                 name: str = EMBEDDING_REPLAY):
        self.path = Path(state_dir) / name
        self.flush_every = flush_every
        # this process's changes since it loaded or wrote the file, in order: (label, scale, int8 bytes)
        # for an add, (label,) for a removal; a write makes them on the file as it is then
        self._pending: list[tuple] = []
        self._staged = None  # the merged buffer ``staged`` gave, until ``mark_saved``
        self._unsaved = False  # the last write found the disk full (said once)
        loaded = load_replay(self.path, dim)
        if loaded is not None:
            self.buffer = loaded
        else:
            try:
                self.buffer = ReplayBuffer(dim, max_bytes)
            except ReplayError as e:
                raise EdgelearnError(str(e), fix="raise the replay byte budget") from None

    @property
    def count(self) -> int:
        return self.buffer.count

    @property
    def dim(self) -> int:
        return self.buffer.dim

    def _body(self) -> np.ndarray:
        b = self.buffer
        return np.frombuffer(b.body, np.uint8).reshape(b.capacity, b.slot_bytes)

    def add(self, vec, label: int) -> int:
        """Quantise and store one vector (same bytes as the portable ``add``); flushes every batch."""
        b = self.buffer
        v = np.asarray(vec, np.float32).astype(np.float64).ravel()
        if v.size != b.dim:
            raise EdgelearnError(f"replay vector has {v.size} values, the buffer holds {b.dim}",
                                 fix="store the same kind of tensor the buffer was made for")
        if not 0 <= int(label) < 0xFFFF:
            raise EdgelearnError(f"replay label {label} is out of range", fix="use the bundle's label ids")
        if not np.isfinite(v).all():
            raise EdgelearnError("replay vector contains NaN or inf", fix="check the model's output")
        peak = float(np.abs(v).max())
        scale = peak / 127.0 if peak > 0 else 1.0
        q = v * (1.0 / scale)
        q = np.where(q >= 0, np.floor(q + 0.5), -np.floor(-q + 0.5))  # the portable rounding
        q = np.clip(q, -127, 127).astype(np.int8).tobytes()
        slot = _put(b, int(label), scale, q)
        self._pending.append((int(label), scale, q))
        if b.changes >= self.flush_every:
            self.flush()
        return slot

    def remove_label(self, label: int) -> int:
        """Empty every slot of ``label`` (e.g. a keyword deleted); written with the next flush."""
        self._pending.append((int(label),))
        return self.buffer.remove_label(int(label))

    def add_many(self, x: np.ndarray, y: np.ndarray) -> None:
        for v, lab in zip(x, y):
            self.add(v, lab)

    def arrays(self, slots) -> tuple[np.ndarray, np.ndarray]:
        """Dequantised vectors (n, dim) float32 and labels of the given slots."""
        body = self._body()[np.asarray(slots, np.int64)]
        labels = body[:, :2].copy().view("<u2")[:, 0].astype(np.int64)
        scales = body[:, 6:10].copy().view("<f4")[:, 0]
        return body[:, SLOT_OVERHEAD:].view(np.int8).astype(np.float32) * scales[:, None], labels

    def sample_arrays(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` class-balanced examples (the portable sampler), dequantised."""
        return self.arrays(list(self.buffer.sample(n)))

    def flush(self) -> None:
        """Write this process's adds since the last write into the file as it is now (under the
        state lock, atomically); the merge becomes this buffer."""
        if self.buffer.changes == 0 and self.path.exists():
            return
        with state_lock(self.path.parent):
            merged = self._merged()
            try:
                atomic_write(self.path, merged.to_bytes())
            except OSError as e:  # a full disk: the examples wait in memory for the next write
                if not no_space(e):
                    raise
                if not self._unsaved:
                    print(f"replay examples kept in memory: cannot save {self.path} (no space left on the "
                          "disk); detection goes on", file=sys.stderr, flush=True)
                self._unsaved = True
                return
            self._unsaved = False
            self._adopt(merged)

    def _merged(self) -> ReplayBuffer:
        """The file as it is now (an empty buffer of this one's size if there is none) with this
        process's pending changes made on it. Call under the state lock."""
        b = self.buffer
        out = load_replay(self.path, b.dim) or ReplayBuffer(b.dim, b.nbytes)
        for op in self._pending:
            if len(op) == 1:
                out.remove_label(op[0])
            else:
                _put(out, *op)
        return out

    def _adopt(self, merged: ReplayBuffer) -> None:
        merged._rng = self.buffer._rng  # the sampler's stream goes on as it was
        merged.mark_saved()
        self.buffer, self._pending, self._staged = merged, [], None

    def staged(self) -> bytes:
        """The file image for a caller that commits it together with other files
        (``AdaptStore.save(stage=...)``): the file as it is now with this process's adds made on it
        (read under the state lock); call ``mark_saved()`` once it is in place."""
        with state_lock(self.path.parent):
            self._staged = self._merged()
        return self._staged.to_bytes()

    def mark_saved(self) -> None:
        if self._staged is not None:
            self._adopt(self._staged)
        else:
            self.buffer.mark_saved()
            self._pending = []


def _put(b: ReplayBuffer, label: int, scale: float, q: bytes) -> int:
    """Store one quantised vector in ``b`` (the portable ``add``'s slot choice and bytes)."""
    slot = b._victim(label)
    if b.label_at(slot) < 0:
        b.count += 1
    off = slot * b.slot_bytes
    struct.pack_into(_SLOT_FMT, b.body, off, label, b.next_seq, scale)
    b.body[off + SLOT_OVERHEAD:off + b.slot_bytes] = q
    b.next_seq = (b.next_seq + 1) & 0xFFFFFFFF
    b.changes += 1
    return slot
