"""Split frames into chunks a lossy link can resend in any order, and put them back together.

A chunk is a 24-byte header (magic ``ELCK``, version, index, count, payload
length, frame id, frame length, offset), a slice of the frame, and a CRC-32
of everything before it. The slicing is a pure function of (frame length,
chunk count), so the receiver checks every offset and length. Resending a
chunk is harmless: an identical duplicate is ignored, a different one with the
same (frame id, index) is an error, and chunks of a recently completed frame
are ignored. The ``Reassembler`` allocates a frame's buffer only after bounding
its length, holds at most ``max_pending`` partial frames (evicting the least
recently touched one; its sender will resend) and never more than
``max_bytes`` in total.

The receiver's half (``parse_chunk``, ``Reassembler``) is
``edge.portable.chunks_rx``, loaded the first time it is asked for from this
module: a board only sends, and every name a module holds is interned on it
for good (docs/firmware.md, "Memory").

    from edge.portable.chunks import split_chunks, Reassembler
    r = Reassembler()
    for c in split_chunks(frame, 240):      # e.g. over a serial link, shuffled, repeated
        done = r.add(c)                      # the frame once, when the last chunk lands
"""

import struct

from edge.portable.compat import IS_MICROPYTHON, const, crc32
from edge.portable.wire_errors import ChunkError

# the layout's constants, private (folded, no names interned on a board);
# edge.portable.chunks_rx has them under public names (tests/test_firmware.py checks both agree)
_CHUNK_MAGIC = b"ELCK"
_CHUNK_VERSION = const(1)
_CHUNK_FMT = "<4sBBHHHIII"
_CHUNK_HEADER_LEN = const(24)
_CHUNK_OVERHEAD = const(28)
_MAX_CHUNKS = const(4096)
_MAX_CHUNK_PAYLOAD = const(65535)


def chunk_layout(frame_len, count):
    """``stride``: every chunk but the last carries ``stride`` bytes at offset ``index * stride``."""
    return (frame_len + count - 1) // count


def chunk_count(frame_len, max_chunk):
    """How many chunks of at most ``max_chunk`` bytes (overhead included) a frame needs."""
    payload = max_chunk - _CHUNK_OVERHEAD
    if payload < 1:
        raise ChunkError("max_chunk=%d leaves no room for data (overhead is %d bytes)"
                         % (max_chunk, _CHUNK_OVERHEAD), fix="use max_chunk >= %d" % (_CHUNK_OVERHEAD + 1))
    payload = min(payload, _MAX_CHUNK_PAYLOAD)
    count = max(1, (frame_len + payload - 1) // payload)
    if count > _MAX_CHUNKS:
        raise ChunkError("a %d-byte frame needs %d chunks of %d bytes, at most %d are allowed"
                         % (frame_len, count, max_chunk, _MAX_CHUNKS), fix="use larger chunks")
    return count


def make_chunk(frame, index, count, frame_id):
    """Chunk ``index`` of ``count`` of ``frame`` (bytes on CPython, bytearray on MicroPython)."""
    n = len(frame)
    stride = chunk_layout(n, count)
    off = index * stride
    plen = min(stride, n - off)
    out = bytearray(_CHUNK_OVERHEAD + plen)
    struct.pack_into(_CHUNK_FMT, out, 0, _CHUNK_MAGIC, _CHUNK_VERSION, 0, index, count, plen,
                     frame_id, n, off)
    out[_CHUNK_HEADER_LEN:_CHUNK_HEADER_LEN + plen] = frame[off:off + plen]
    struct.pack_into("<I", out, _CHUNK_HEADER_LEN + plen,
                     crc32(memoryview(out)[:_CHUNK_HEADER_LEN + plen]))
    return out if IS_MICROPYTHON else bytes(out)


def iter_chunks(frame, max_chunk, frame_id=None):
    """Yield the chunks one at a time (a board holds one chunk, not all of them)."""
    if not 1 <= len(frame) <= 0xFFFFFFFF:
        raise ChunkError("cannot chunk a frame of %d bytes" % len(frame))
    count = chunk_count(len(frame), max_chunk)
    if frame_id is None:
        frame_id = crc32(frame)  # the same frame always gets the same id, so resends merge
    for i in range(count):
        yield make_chunk(frame, i, count, frame_id)


def split_chunks(frame, max_chunk, frame_id=None):
    """All chunks of ``frame``, each at most ``max_chunk`` bytes, as a list."""
    return list(iter_chunks(frame, max_chunk, frame_id))


def __getattr__(name):
    # the receiver's half, on first use (see the module docstring)
    from edge.portable import chunks_rx
    return getattr(chunks_rx, name)
