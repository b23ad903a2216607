"""The receiver's half of ``edge.portable.chunks``: check chunks and put frames back together.

Also reachable as ``edge.portable.chunks.parse_chunk`` / ``.Reassembler``
(that module loads this one on first use); see it for the chunk layout.

    from edge.portable.chunks import Reassembler
    r = Reassembler()
    done = r.add(chunk)          # the frame once, when the last chunk lands
"""

import struct

from edge.portable.chunks import chunk_layout
from edge.portable.compat import IS_MICROPYTHON, const, crc32
from edge.portable.wire_errors import ChunkError, OversizedFrame

# the chunk layout (edge.portable.chunks has the same values as private constants)
CHUNK_MAGIC = b"ELCK"
CHUNK_VERSION = const(1)
CHUNK_FMT = "<4sBBHHHIII"
CHUNK_HEADER_LEN = const(24)
CHUNK_CRC_LEN = const(4)
CHUNK_OVERHEAD = const(28)
MAX_CHUNKS = const(4096)
MAX_CHUNK_PAYLOAD = const(65535)


def _max_frame_len(n):
    # the wire codec's limit, looked up when no other is given
    if n is None:
        from edge.portable.wire import MAX_FRAME_LEN
        return MAX_FRAME_LEN
    return n


def parse_chunk(chunk, max_frame_len=None):
    """``(frame_id, index, count, frame_len, offset, payload)`` of a valid chunk, else ``ChunkError``."""
    max_frame_len = _max_frame_len(max_frame_len)
    n = len(chunk)
    if n < CHUNK_OVERHEAD + 1:
        raise ChunkError("chunk is %d bytes, shorter than the %d-byte minimum" % (n, CHUNK_OVERHEAD + 1),
                         fix="resend the chunk")
    magic, ver, flags, index, count, plen, frame_id, frame_len, off = struct.unpack_from(
        CHUNK_FMT, chunk, 0)
    if magic != CHUNK_MAGIC:
        raise ChunkError("chunk starts with %r, not %r" % (bytes(magic), CHUNK_MAGIC))
    if n != CHUNK_OVERHEAD + plen:
        raise ChunkError("chunk is %d bytes but its header says %d" % (n, CHUNK_OVERHEAD + plen),
                         fix="resend the chunk")
    if crc32(memoryview(chunk)[:CHUNK_HEADER_LEN + plen]) != struct.unpack_from(
            "<I", chunk, CHUNK_HEADER_LEN + plen)[0]:
        raise ChunkError("chunk %d of frame 0x%08x fails its CRC-32" % (index, frame_id),
                         fix="resend the chunk")
    if ver != CHUNK_VERSION or flags != 0:
        raise ChunkError("chunk has version %d flags 0x%02x; this receiver reads version %d flags 0"
                         % (ver, flags, CHUNK_VERSION))
    if frame_len > max_frame_len:
        raise OversizedFrame("chunked frame claims %d bytes, above the %d-byte limit"
                             % (frame_len, max_frame_len), fix="send a smaller update")
    if not (1 <= count <= MAX_CHUNKS and count <= frame_len and index < count):
        raise ChunkError("chunk %d of %d for a %d-byte frame is impossible" % (index, count, frame_len))
    stride = chunk_layout(frame_len, count)
    if (count - 1) * stride >= frame_len or off != index * stride or \
            plen != min(stride, frame_len - off):
        raise ChunkError("chunk %d of %d carries bytes [%d, %d) but the layout of a %d-byte frame "
                         "puts it at [%d, %d)" % (index, count, off, off + plen, frame_len,
                                                  index * stride, min(frame_len, (index + 1) * stride)))
    return frame_id, index, count, frame_len, off, memoryview(chunk)[CHUNK_HEADER_LEN:CHUNK_HEADER_LEN + plen]


class Reassembler:
    """Collects chunks; ``add(chunk)`` returns the whole frame once, when its last missing chunk arrives."""

    def __init__(self, max_frame_len=None, max_pending=4, max_bytes=None, remember=64):
        max_frame_len = _max_frame_len(max_frame_len)
        self.max_frame_len = max_frame_len
        self.max_pending = max_pending
        self.max_bytes = 2 * max_frame_len if max_bytes is None else max_bytes
        self.remember = remember
        self.pending = {}   # frame_id -> [frame_len, count, buf, got, missing, last_touch]
        self.completed = []  # recently completed frame ids, oldest first
        self._clock = 0

    @property
    def pending_bytes(self):
        return sum(len(p[2]) for p in self.pending.values())

    def add(self, chunk):
        frame_id, index, count, frame_len, off, payload = parse_chunk(chunk, self.max_frame_len)
        if frame_id in self.completed:
            return None  # a resend of a frame already delivered
        self._clock += 1
        p = self.pending.get(frame_id)
        if p is not None and (p[0] != frame_len or p[1] != count):
            raise ChunkError("chunk says frame 0x%08x is %d bytes in %d chunks; earlier chunks said "
                             "%d bytes in %d" % (frame_id, frame_len, count, p[0], p[1]),
                             fix="give every frame its own frame id")
        if p is not None and p[3][index]:
            if p[2][off:off + len(payload)] != payload:
                raise ChunkError("chunk %d of frame 0x%08x differs from the copy already received"
                                 % (index, frame_id), fix="give every frame its own frame id")
            p[5] = self._clock
            return None
        if p is None:
            if frame_len > self.max_bytes:
                raise OversizedFrame("frame of %d bytes exceeds the reassembler's %d-byte budget"
                                     % (frame_len, self.max_bytes))
            self._make_room(frame_len)
            p = [frame_len, count, bytearray(frame_len), bytearray(count), count, self._clock]
            self.pending[frame_id] = p
        p[2][off:off + len(payload)] = payload
        p[3][index] = 1
        p[4] -= 1
        p[5] = self._clock
        if p[4]:
            return None
        del self.pending[frame_id]
        self.completed.append(frame_id)
        if len(self.completed) > self.remember:
            self.completed.pop(0)
        return p[2] if IS_MICROPYTHON else bytes(p[2])

    def _make_room(self, frame_len):
        while self.pending and (len(self.pending) >= self.max_pending
                                or self.pending_bytes + frame_len > self.max_bytes):
            oldest = None
            for fid in self.pending:
                if oldest is None or self.pending[fid][5] < self.pending[oldest][5]:
                    oldest = fid
            del self.pending[oldest]
