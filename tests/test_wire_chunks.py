"""Chunking: any order, any number of resends, one frame out; corrupt or conflicting chunks rejected."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge.portable.chunks import (CHUNK_OVERHEAD, Reassembler, chunk_count, parse_chunk,
                                  split_chunks)
from edge.portable.compat import crc32, crc32_portable
from edge.portable.wire_errors import ChunkError, OversizedFrame, WireError


def _state(r):
    return ({k: (v[0], v[1], bytes(v[2]), bytes(v[3]), v[4]) for k, v in r.pending.items()},
            list(r.completed))


@settings(max_examples=80, deadline=None)
@given(st.binary(min_size=1, max_size=3000), st.integers(CHUNK_OVERHEAD + 1, 400), st.randoms())
def test_shuffled_repeated_chunks_yield_the_frame_exactly_once(frame, max_chunk, rnd):
    chunks = split_chunks(frame, max_chunk)
    assert all(len(c) <= max_chunk for c in chunks)
    assert len(chunks) == chunk_count(len(frame), max_chunk)
    sends = chunks * 2 + rnd.sample(chunks, min(3, len(chunks)))
    rnd.shuffle(sends)
    r = Reassembler()
    out = [f for f in (r.add(c) for c in sends) if f is not None]
    assert out == [frame]
    assert r.pending == {} and r.add(chunks[0]) is None  # late resend after completion


@given(st.binary(max_size=300), st.integers(0, 2**32 - 1))
def test_portable_crc32_matches_binascii(data, start):
    assert crc32_portable(data, start) == crc32(data, start)


def test_corrupt_truncated_and_impossible_chunks_are_rejected_without_state_change():
    frame = bytes(random.Random(1).getrandbits(8) for _ in range(1000))
    chunks = split_chunks(frame, 128)
    r = Reassembler()
    r.add(chunks[0])
    before = _state(r)
    bad = bytearray(chunks[1])
    bad[30] ^= 0x40
    with pytest.raises(ChunkError, match="CRC-32"):
        r.add(bytes(bad))
    with pytest.raises(ChunkError, match="header says"):
        r.add(chunks[1][:-1])
    with pytest.raises(ChunkError, match="not b'ELCK'"):
        r.add(b"XXXX" + chunks[1][4:])
    # a well-formed, CRC-valid chunk that claims a different layout
    hdr = bytearray(chunks[1][:24])
    struct.pack_into("<I", hdr, 20, 5)  # wrong offset for chunk 1
    body = bytes(hdr) + chunks[1][24:-4]
    with pytest.raises(ChunkError, match="layout"):
        r.add(body + struct.pack("<I", crc32(body)))
    # same frame id, different bytes at an index already received
    other = split_chunks(bytes(1000), 128, frame_id=parse_chunk(chunks[0])[0])
    with pytest.raises(ChunkError, match="differs"):
        r.add(other[0])
    assert _state(r) == before
    for c in chunks[1:]:
        done = r.add(c)
    assert done == frame


def test_memory_is_bounded_before_allocation_and_by_eviction():
    r = Reassembler(max_frame_len=4096, max_pending=2)
    big = split_chunks(bytes(5000), 1000)
    with pytest.raises(OversizedFrame, match="5000 bytes, above the 4096-byte limit"):
        r.add(big[0])
    assert r.pending == {}
    frames = [bytes([i]) * 3000 for i in range(3)]
    firsts = [split_chunks(f, 600)[0] for f in frames]
    for c in firsts:
        r.add(c)
    assert len(r.pending) == 2 and r.pending_bytes <= 2 * 4096
    # the oldest partial frame was evicted; a full resend still completes it
    assert [f for f in (r.add(c) for c in split_chunks(frames[0], 600)) if f] == [frames[0]]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_parse_chunk_raises_only_wire_errors(data):
    try:
        parse_chunk(data)
    except WireError:
        pass


def test_chunk_size_too_small_is_a_clear_error():
    with pytest.raises(ChunkError, match="no room for data"):
        split_chunks(b"abc", CHUNK_OVERHEAD)
