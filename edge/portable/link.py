"""The serial link between a board and the gateway: framed, CRC-checked, resend-safe.

One frame::

    a5 5a | type u8 | seq u16 | len u16 | payload (len <= 2048) | crc32 u32 (over type..payload)

The sender numbers its frames; a receiver that sees the same ``seq`` again
(a resend after a lost ACK) answers with the same reply and does not apply
the frame twice. A corrupted frame fails its CRC and the decoder resyncs on
the next ``a5 5a`` *inside* the rejected bytes, so a truncated frame costs
only itself. Both the firmware (MicroPython) and ``host/gateway.py``
(CPython) use this module; the decoder's buffer is preallocated.

    from edge.portable.link import encode, Decoder, CMD
    wire = encode(CMD, 7, b"status")
    dec = Decoder()
    dec.feed(wire)
    kind, seq, payload = dec.next()          # (1, 7, b"status")
"""

import struct

try:
    from binascii import crc32 as _crc32

    def crc32(data):
        return _crc32(data) & 0xFFFFFFFF
except ImportError:  # pragma: no cover - every MicroPython port we target has binascii
    from edge.portable.compat import crc32

SYNC = b"\xa5\x5a"
HEADER = "<2sBHH"
HEADER_LEN = 7
MAX_PAYLOAD = 2048
# host -> board
CMD = 1
AUDIO = 2
# board -> host
ACK = 16
NAK = 17
EVENT = 18
UPDATE = 19
TYPES = (CMD, AUDIO, ACK, NAK, EVENT, UPDATE)


class LinkError(ValueError):
    """A frame failed a check; ``problem`` says which."""

    def __init__(self, problem):
        super().__init__(problem)
        self.problem = problem


def encode(kind, seq, payload=b""):
    if len(payload) > MAX_PAYLOAD:
        raise LinkError("payload of %d bytes exceeds the link's %d" % (len(payload), MAX_PAYLOAD))
    head = struct.pack(HEADER, SYNC, kind, seq & 0xFFFF, len(payload))
    crc = crc32(head[2:] + bytes(payload))
    return head + bytes(payload) + struct.pack("<I", crc)


def encode_into(buf, kind, seq, payload):
    """Write a frame into ``buf`` (bytearray); returns its length. The board's allocation-free path."""
    n = len(payload)
    if n > MAX_PAYLOAD or HEADER_LEN + n + 4 > len(buf):
        raise LinkError("payload of %d bytes does not fit the link buffer" % n)
    struct.pack_into(HEADER, buf, 0, SYNC, kind, seq & 0xFFFF, n)
    buf[HEADER_LEN:HEADER_LEN + n] = payload
    mv = memoryview(buf)
    struct.pack_into("<I", buf, HEADER_LEN + n, crc32(mv[2:HEADER_LEN + n]))
    return HEADER_LEN + n + 4


class Decoder:
    """Accumulates bytes and returns whole, checked frames; skips garbage and bad frames."""

    def __init__(self, capacity=2 * (MAX_PAYLOAD + HEADER_LEN + 4)):
        self.buf = bytearray(capacity)
        self.mv = memoryview(self.buf)
        self.n = 0
        self.used = 0        # bytes of the frame last returned as a view, dropped on the next call
        self.errors = 0
        self.last_error = None

    def need(self):
        """How many more bytes complete the frame being assembled (at least 1)."""
        if self.n < HEADER_LEN:
            return HEADER_LEN - self.n
        length = struct.unpack_from("<H", self.buf, 5)[0]
        if length > MAX_PAYLOAD:
            return 1
        return max(1, HEADER_LEN + length + 4 - self.n)

    def _release(self):
        if self.used:
            k, self.used = self.used, 0
            self._drop(k)

    def feed(self, data):
        self._release()
        k = len(data)
        if self.n + k > len(self.buf):  # overflow: keep the newest bytes, a frame never exceeds half
            self._drop(self.n + k - len(self.buf) if k < len(self.buf) else self.n)
            if k > len(self.buf):
                data = data[k - len(self.buf):]
                k = len(data)
        self.buf[self.n:self.n + k] = data
        self.n += k

    def space(self):
        """A memoryview of the free space, for ``readinto``; call ``filled(k)`` afterwards."""
        self._release()
        return self.mv[self.n:]

    def filled(self, k):
        self.n += k

    def _drop(self, k):
        if k >= self.n:
            self.n = 0
            return
        self.buf[0:self.n - k] = self.mv[k:self.n]
        self.n -= k

    def _resync(self, start):
        # the next sync at or after ``start``; everything before it is garbage
        i = self.buf.find(SYNC, start, self.n) if hasattr(self.buf, "find") else -1
        if i < 0:
            i = start
            while i < self.n - 1 and not (self.buf[i] == 0xA5 and self.buf[i + 1] == 0x5A):
                i += 1
            if i >= self.n - 1:
                i = self.n - 1 if self.n and self.buf[self.n - 1] == 0xA5 else self.n
        self._drop(i)

    def next(self, copy=True):
        """``(kind, seq, payload)`` or None; a bad frame raises LinkError once and is skipped.

        ``copy=False`` returns the payload as a memoryview into the buffer, valid
        until the next ``next``/``feed``/``space`` call (the board's path: no 2 KB
        copy per audio frame).
        """
        self._release()
        if self.n and (self.n < 2 or self.buf[0] != 0xA5 or self.buf[1] != 0x5A):
            self._resync(0)
        if self.n < HEADER_LEN:
            return None
        _, kind, seq, length = struct.unpack_from(HEADER, self.buf, 0)
        if length > MAX_PAYLOAD or kind not in TYPES:
            self._resync(1)
            return self._bad("bad header (type %d, length %d)" % (kind, length))
        end = HEADER_LEN + length
        if self.n < end + 4:
            return None
        crc = struct.unpack_from("<I", self.buf, end)[0]
        if crc32(self.mv[2:end]) != crc:
            self._resync(1)
            return self._bad("CRC mismatch on a %d-byte frame (seq %d)" % (length, seq))
        if not copy:
            self.used = end + 4
            return kind, seq, self.mv[HEADER_LEN:end]
        payload = bytes(self.mv[HEADER_LEN:end])
        self._drop(end + 4)
        return kind, seq, payload

    def _bad(self, problem):
        self.errors += 1
        self.last_error = problem
        raise LinkError(problem)
