"""A replay buffer of int8-quantised embeddings with labels, bounded in bytes.

It keeps a sample of what the device has heard (tail inputs: the encoder's
64-d embeddings) so that every adaptation update mixes old classes in and the
head does not forget them. The same file runs on a Raspberry Pi (``edge.replay``
adds atomic persistence) and on an ESP32 (the firmware writes ``header()`` and
``body`` itself), so it imports only ``struct``, ``array`` and ``compat``.

Storage is one preallocated ``bytearray`` of ``capacity`` slots; nothing grows
after construction. Slot layout (little-endian), ``SLOT_OVERHEAD + dim`` bytes::

    label  u16   class id (0xFFFF = empty slot)
    seq    u32   insertion counter (oldest = smallest)
    scale  f32   symmetric int8 scale: value = q * scale
    q      dim x int8

When full, ``add`` overwrites the oldest slot of the most represented class, so
the buffer drifts towards class balance instead of towards whatever was said
most recently. ``sample`` draws class-balanced: a class uniformly among those
present, then a slot of that class uniformly (xorshift32, seeded, identical on
both interpreters).

Serialised form (``to_bytes`` / ``from_bytes``, or ``header()`` + ``body`` to
avoid a copy on a board)::

    magic b"ERB1" | u16 dim | u32 capacity | u32 next_seq | u32 crc32(body) | body

API (stable; the ESP32 firmware uses it):

    ReplayBuffer(dim, max_bytes, store=None)   capacity = (max_bytes - HEADER_BYTES) // slot_bytes;
                                               store: a preallocated bytearray to keep the slots in
    .capacity .count .dim .slot_bytes .nbytes  sizes; nbytes = serialised size
    .changes                                   adds since mark_saved() (batch flash writes)
    add(vec, label) -> slot                    vec: any float sequence of length dim
    get(slot, out=None) -> label               dequantises into out (array('f', dim))
    label_at(slot) -> label or -1
    class_counts() -> {label: count}
    sample(n, out=None) -> array('H') slots    class-balanced
    remove_label(label) -> removed count       e.g. when a keyword is deleted
    header() -> bytes; body -> bytearray; to_bytes(); ReplayBuffer.from_bytes(data)
    ReplayBuffer.read_from(f, store=None)      from an open file, body read in place (no copy of it)
    count_in_file(f) -> count                  CRC-checked, read one slot at a time
    mark_saved()

    >>> rb = ReplayBuffer(dim=64, max_bytes=8192)
    >>> rb.add(embedding, label=3)
    >>> for slot in rb.sample(16): label = rb.get(slot, out=vec)
"""

import array
import struct

from edge.portable.compat import const, crc32

MAGIC = b"ERB1"
HEADER_FMT = "<4sHIII"
HEADER_BYTES = const(18)
SLOT_OVERHEAD = const(10)
EMPTY = const(0xFFFF)
_SLOT_FMT = "<HIf"


class ReplayError(ValueError):
    """Bad arguments or a corrupt serialised buffer."""


class ReplayBuffer:
    def __init__(self, dim, max_bytes, seed=0x9E3779B9, store=None):
        if dim < 1 or dim > 65535:
            raise ReplayError("replay dim must be 1..65535, got %d" % dim)
        self.dim = dim
        self.slot_bytes = SLOT_OVERHEAD + dim
        cap = (max_bytes - HEADER_BYTES) // self.slot_bytes
        if cap < 1:
            raise ReplayError("max_bytes=%d holds no slot of %d bytes; allow at least %d"
                              % (max_bytes, self.slot_bytes, HEADER_BYTES + self.slot_bytes))
        self.capacity = cap
        if store is None:
            self.body = bytearray(cap * self.slot_bytes)
        elif len(store) < cap * self.slot_bytes:
            raise ReplayError("store of %d bytes is smaller than the %d-byte body" % (len(store), cap * self.slot_bytes))
        else:   # a board reuses one long-lived buffer: no 4 KB block to find in a fragmented heap
            self.body = memoryview(store)[:cap * self.slot_bytes]
        for i in range(cap):
            struct.pack_into(_SLOT_FMT, self.body, i * self.slot_bytes, EMPTY, 0, 0.0)
        self.count = 0
        self.next_seq = 0
        self.changes = 0
        self._rng = (seed & 0xFFFFFFFF) or 1

    @property
    def nbytes(self):
        return HEADER_BYTES + len(self.body)

    def _rand(self):
        # xorshift32: tiny, and the same stream on CPython and MicroPython
        x = self._rng
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        self._rng = x
        return x

    def label_at(self, slot):
        lab = struct.unpack_from("<H", self.body, slot * self.slot_bytes)[0]
        return -1 if lab == EMPTY else lab

    def class_counts(self):
        counts = {}
        for i in range(self.capacity):
            lab = self.label_at(i)
            if lab >= 0:
                counts[lab] = counts.get(lab, 0) + 1
        return counts

    def _victim(self, label):
        """The slot to overwrite: an empty one, else the oldest of the largest class."""
        if self.count < self.capacity:
            for i in range(self.capacity):
                if self.label_at(i) < 0:
                    return i
        counts = self.class_counts()
        big = max(counts.values())
        # never evict the newcomer's own last examples in favour of a tie elsewhere
        target = label if counts.get(label, 0) == big else -1
        if target < 0:
            for lab in counts:
                if counts[lab] == big and (target < 0 or lab < target):
                    target = lab
        best, best_seq = -1, 0
        for i in range(self.capacity):
            lab, seq = struct.unpack_from("<HI", self.body, i * self.slot_bytes)
            if lab == target and (best < 0 or seq < best_seq):
                best, best_seq = i, seq
        return best

    def add(self, vec, label):
        if label < 0 or label >= EMPTY:
            raise ReplayError("label must be 0..65534, got %d" % label)
        if len(vec) != self.dim:
            raise ReplayError("vector has %d values, the buffer holds %d" % (len(vec), self.dim))
        peak = 0.0
        for v in vec:
            if v != v:
                raise ReplayError("vector contains NaN")
            a = v if v >= 0 else -v
            if a > peak:
                peak = a
        if peak == float("inf"):
            raise ReplayError("vector contains inf")
        scale = peak / 127.0 if peak > 0 else 1.0
        slot = self._victim(label)
        if self.label_at(slot) < 0:
            self.count += 1
        off = slot * self.slot_bytes
        struct.pack_into(_SLOT_FMT, self.body, off, label, self.next_seq, scale)
        off += SLOT_OVERHEAD
        inv = 1.0 / scale
        body = self.body
        for i in range(self.dim):
            q = vec[i] * inv
            q = int(q + 0.5) if q >= 0 else -int(-q + 0.5)
            body[off + i] = (127 if q > 127 else (-127 if q < -127 else q)) & 0xFF
        self.next_seq = (self.next_seq + 1) & 0xFFFFFFFF
        self.changes += 1
        return slot

    def get(self, slot, out=None):
        """Dequantise slot into ``out`` (array('f', dim)); returns its label (-1 if empty)."""
        off = slot * self.slot_bytes
        lab, _, scale = struct.unpack_from(_SLOT_FMT, self.body, off)
        if out is None:
            out = array.array("f", bytes(4 * self.dim))
        off += SLOT_OVERHEAD
        body = self.body
        for i in range(self.dim):
            b = body[off + i]
            out[i] = (b - 256 if b > 127 else b) * scale
        return -1 if lab == EMPTY else lab

    def sample(self, n, out=None):
        """``n`` slot indices drawn class-balanced (with replacement); empty buffer -> none."""
        if out is None:
            out = array.array("H", bytes(2 * n))
        if self.count == 0:
            return out[:0]
        counts = self.class_counts()
        labels = sorted(counts)
        for k in range(n):
            lab = labels[self._rand() % len(labels)]
            nth = self._rand() % counts[lab]
            for i in range(self.capacity):
                if self.label_at(i) == lab:
                    if nth == 0:
                        out[k] = i
                        break
                    nth -= 1
        return out

    def remove_label(self, label):
        removed = 0
        for i in range(self.capacity):
            if self.label_at(i) == label:
                struct.pack_into(_SLOT_FMT, self.body, i * self.slot_bytes, EMPTY, 0, 0.0)
                removed += 1
        self.count -= removed
        self.changes += removed
        return removed

    def mark_saved(self):
        self.changes = 0

    def header(self):
        return struct.pack(HEADER_FMT, MAGIC, self.dim, self.capacity, self.next_seq, crc32(self.body))

    def to_bytes(self):
        return self.header() + bytes(self.body)

    @classmethod
    def read_from(cls, f, store=None):
        """The buffer serialised in the open binary file ``f``, its body read straight into place.

        A board's path: ``from_bytes(f.read())`` holds the file's bytes and the
        body at once (twice the buffer); this holds the body only.
        """
        dim, cap, next_seq, crc = _read_header(f)
        rb = cls(dim, HEADER_BYTES + cap * (SLOT_OVERHEAD + dim), store=store)
        n = f.readinto(rb.body)
        if n != len(rb.body) or f.read(1):
            raise ReplayError("replay file body is not the %d bytes its header says" % len(rb.body))
        if crc32(rb.body) != crc:
            raise ReplayError("replay data fails its CRC (truncated or corrupted)")
        rb.next_seq = next_seq
        rb._count()
        return rb

    def _count(self):
        self.count = 0
        for i in range(self.capacity):
            if self.label_at(i) >= 0:
                self.count += 1

    @classmethod
    def from_bytes(cls, data):
        if len(data) < HEADER_BYTES:
            raise ReplayError("replay data is %d bytes, shorter than its %d-byte header"
                              % (len(data), HEADER_BYTES))
        magic, dim, cap, next_seq, crc = struct.unpack_from(HEADER_FMT, data, 0)
        if magic != MAGIC:
            raise ReplayError("not a replay buffer (magic %r)" % (magic,))
        rb = cls(dim, HEADER_BYTES + cap * (SLOT_OVERHEAD + dim))
        body = memoryview(data)[HEADER_BYTES:]
        if len(body) != len(rb.body):
            raise ReplayError("replay data has %d body bytes, its header says %d"
                              % (len(body), len(rb.body)))
        if crc32(body) != crc:
            raise ReplayError("replay data fails its CRC (truncated or corrupted)")
        rb.body[:] = body
        rb.next_seq = next_seq
        rb._count()
        return rb


def _read_header(f):
    head = f.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES:
        raise ReplayError("replay data is %d bytes, shorter than its %d-byte header" % (len(head), HEADER_BYTES))
    magic, dim, cap, next_seq, crc = struct.unpack(HEADER_FMT, head)
    if magic != MAGIC:
        raise ReplayError("not a replay buffer (magic %r)" % (magic,))
    return dim, cap, next_seq, crc


def count_in_file(f):
    """How many slots of the buffer serialised in file ``f`` hold an entry; ReplayError if it is damaged.

    Reads one slot at a time into a small buffer (no 4 KB body on the heap)
    and checks the CRC over the whole body as it goes.
    """
    dim, cap, _, crc = _read_header(f)
    slot = bytearray(SLOT_OVERHEAD + dim)
    c = 0
    count = 0
    for _ in range(cap):
        if f.readinto(slot) != len(slot):
            raise ReplayError("replay file is truncated")
        c = crc32(slot, c)
        if slot[0] != 0xFF or slot[1] != 0xFF:
            count += 1
    if c != crc or f.read(1):
        raise ReplayError("replay data fails its CRC (truncated or corrupted)")
    return count
