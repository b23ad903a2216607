"""The portable replay buffer: bounded bytes, class balance, eviction, serialisation, MicroPython."""

from __future__ import annotations

import array
from pathlib import Path

import pytest

from edge.portable.replay import HEADER_BYTES, SLOT_OVERHEAD, ReplayBuffer, ReplayError

ROOT = Path(__file__).resolve().parents[1]


def vec(i, dim=8):
    return [((i * 31 + j * 7) % 19 - 9) / 4.0 for j in range(dim)]


def test_capacity_is_bounded_by_bytes():
    rb = ReplayBuffer(dim=64, max_bytes=4096)
    assert rb.capacity == (4096 - HEADER_BYTES) // (64 + SLOT_OVERHEAD)
    assert rb.nbytes <= 4096
    for i in range(500):
        rb.add(vec(i, 64), i % 3)
    assert rb.count == rb.capacity and len(rb.to_bytes()) == rb.nbytes <= 4096


def test_quantisation_error_is_within_half_a_step():
    rb = ReplayBuffer(dim=8, max_bytes=1000)
    v = [0.3, -1.7, 2.54, 0.0, -0.01, 1.0, 2.0, -2.54]
    slot = rb.add(v, 5)
    out = array.array("f", [0.0] * 8)
    assert rb.get(slot, out) == 5
    step = 2.54 / 127
    assert max(abs(a - b) for a, b in zip(out, v)) <= step / 2 + 1e-6


def test_eviction_keeps_classes_balanced():
    rb = ReplayBuffer(dim=8, max_bytes=HEADER_BYTES + 10 * (8 + SLOT_OVERHEAD))
    for i in range(10):
        rb.add(vec(i), 0)            # class 0 fills the buffer
    for i in range(5):
        rb.add(vec(100 + i), 1)      # class 1 evicts the oldest of class 0
    assert rb.class_counts() == {0: 5, 1: 5}
    survivors = sorted(rb.get(s, array.array("f", [0.0] * 8)) for s in range(rb.capacity))
    assert survivors == [0] * 5 + [1] * 5
    rb.add(vec(200), 2)
    assert rb.class_counts()[2] == 1 and sum(rb.class_counts().values()) == 10


def test_oldest_of_largest_class_is_evicted():
    rb = ReplayBuffer(dim=8, max_bytes=HEADER_BYTES + 4 * (8 + SLOT_OVERHEAD))
    slots = [rb.add(vec(i), 0) for i in range(4)]
    assert rb.add(vec(9), 0) == slots[0]
    assert rb.add(vec(10), 0) == slots[1]


def test_sampling_is_class_balanced():
    rb = ReplayBuffer(dim=8, max_bytes=100_000)
    for i in range(90):
        rb.add(vec(i), 0)
    for i in range(10):
        rb.add(vec(i), 1)
    drawn = [rb.label_at(s) for s in rb.sample(2000)]
    share = drawn.count(1) / len(drawn)
    assert 0.4 < share < 0.6  # 10 % of the items, half of the draws


def test_roundtrip_and_corruption_are_detected():
    rb = ReplayBuffer(dim=8, max_bytes=2000)
    for i in range(30):
        rb.add(vec(i), i % 4)
    data = rb.to_bytes()
    back = ReplayBuffer.from_bytes(data)
    assert back.to_bytes() == data and back.count == rb.count and back.class_counts() == rb.class_counts()
    bad = bytearray(data)
    bad[-1] ^= 1
    with pytest.raises(ReplayError, match="CRC"):
        ReplayBuffer.from_bytes(bytes(bad))
    with pytest.raises(ReplayError, match="body bytes"):
        ReplayBuffer.from_bytes(data[:-5])
    with pytest.raises(ReplayError, match="magic"):
        ReplayBuffer.from_bytes(b"XXXX" + data[4:])


def test_bad_input_is_rejected_without_change():
    rb = ReplayBuffer(dim=8, max_bytes=2000)
    rb.add(vec(1), 0)
    before = rb.to_bytes()
    for args in ((vec(1, 7), 0), (vec(1), -1), ([float("nan")] * 8, 0)):
        with pytest.raises(ReplayError):
            rb.add(*args)
    assert rb.to_bytes() == before
    with pytest.raises(ReplayError, match="holds no slot"):
        ReplayBuffer(dim=64, max_bytes=50)


def test_remove_label_and_changes_counter():
    rb = ReplayBuffer(dim=8, max_bytes=2000)
    for i in range(6):
        rb.add(vec(i), i % 2)
    assert rb.changes == 6
    rb.mark_saved()
    assert rb.remove_label(1) == 3 and rb.count == 3 and rb.changes == 3


SCENARIO = """
from edge.portable.replay import ReplayBuffer
import gc
gc.collect()
before = gc.mem_alloc()
rb = ReplayBuffer(64, 16384)
for i in range(400):
    rb.add([((i * 31 + j * 7) % 19 - 9) / 4.0 for j in range(64)], i % 5)
s = rb.sample(32)
print(rb.capacity, rb.count, sorted(rb.class_counts().items()))
print(list(s))
print(rb.header().hex())
gc.collect()
print('heap', gc.mem_alloc() - before)
"""


@pytest.mark.micropython
def test_micropython_gives_identical_bytes_and_samples(micropython):
    out = micropython(SCENARIO, heap="100k", path=[ROOT]).splitlines()
    rb = ReplayBuffer(64, 16384)
    for i in range(400):
        rb.add([((i * 31 + j * 7) % 19 - 9) / 4.0 for j in range(64)], i % 5)
    s = rb.sample(32)
    assert out[0] == f"{rb.capacity} {rb.count} {sorted(rb.class_counts().items())}"
    assert out[1] == str(list(s))
    assert out[2] == rb.header().hex()  # carries the body's CRC-32
    # the 16 KiB buffer itself plus small objects; no hidden growth with use
    assert int(out[3].split()[1]) < 16384 + 3000
