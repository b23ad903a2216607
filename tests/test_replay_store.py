"""edge.replay: numpy access identical to the portable buffer, batched atomic persistence, and a
SIGKILL at random moments never corrupting the replay file or the adapted-parameter store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edge.adapt.store import AdaptStore
from edge.errors import EdgelearnError
from edge.portable.replay import ReplayBuffer
from edge.replay import ReplayStore

ROOT = Path(__file__).resolve().parents[1]


class FakeBundle:
    model_id, version = "m", 1


def vecs(n, dim, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, dim)) * rng.uniform(0.01, 5, (n, 1))).astype(np.float32), rng.integers(0, 5, n)


def test_numpy_add_gives_the_portable_bytes_and_samples(tmp_path):
    x, y = vecs(40, 24)
    rs = ReplayStore(tmp_path, dim=24, max_bytes=18 + 12 * 34, flush_every=1000)
    ref = ReplayBuffer(24, 18 + 12 * 34)
    x[3, 5] = 0.0
    x[7] = 0.0  # an all-zero vector takes the scale-1 path
    for v, lab in zip(x, y):  # 40 adds into 12 slots: eviction runs too
        rs.add(v, int(lab))
        ref.add([float(a) for a in v], int(lab))
    assert rs.buffer.to_bytes() == ref.to_bytes()
    slots = list(ref.sample(20))
    got, labels = rs.arrays(slots)
    import array

    out = array.array("f", bytes(4 * 24))
    for i, s in enumerate(slots):
        assert labels[i] == ref.get(s, out)
        np.testing.assert_array_equal(got[i], np.frombuffer(out, np.float32))
    rx, ry = rs.sample_arrays(8)
    assert rx.shape == (8, 24) and set(ry) <= set(y)


def test_writes_are_batched_and_atomic(tmp_path):
    x, y = vecs(9, 16)
    rs = ReplayStore(tmp_path, dim=16, max_bytes=4096, flush_every=4)
    for v, lab in zip(x[:3], y[:3]):
        rs.add(v, int(lab))
    assert not rs.path.exists()  # three adds: nothing written yet
    rs.add(x[3], int(y[3]))
    first = rs.path.read_bytes()
    assert ReplayStore(tmp_path, dim=16).count == 4
    for v, lab in zip(x[4:7], y[4:7]):
        rs.add(v, int(lab))
    assert rs.path.read_bytes() == first  # the batch is still open: the file is the last flush
    rs.add(x[7], int(y[7]))
    assert ReplayStore(tmp_path, dim=16).count == 8
    rs.add(x[8], int(y[8]))
    rs.flush()
    again = ReplayStore(tmp_path, dim=16)
    assert again.count == 9 and again.buffer.to_bytes() == rs.buffer.to_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "replay.bin"]  # no temp files left behind (.lock: the state lock)


def test_bad_input_is_refused_and_changes_nothing(tmp_path):
    rs = ReplayStore(tmp_path, dim=8, max_bytes=1024, flush_every=1)
    rs.add(np.ones(8), 1)
    before = rs.buffer.to_bytes()
    for bad, lab, msg in ((np.ones(7), 1, "7 values"), (np.full(8, np.nan), 1, "NaN"),
                          (np.ones(8), 70000, "out of range")):
        with pytest.raises(EdgelearnError, match=msg):
            rs.add(bad, lab)
    assert rs.buffer.to_bytes() == before and rs.buffer.changes == 0
    with pytest.raises(EdgelearnError, match="holds 8-d vectors"):
        ReplayStore(tmp_path, dim=64)
    rs.path.write_bytes(rs.path.read_bytes()[:-5])
    with pytest.raises(EdgelearnError, match="delete the file"):
        ReplayStore(tmp_path, dim=8)
    with pytest.raises(EdgelearnError, match="replay byte budget"):
        ReplayStore(tmp_path / "new", dim=8000, max_bytes=4000)


WRITER = r"""
import sys, numpy as np
sys.path.insert(0, %(root)r)
from edge.replay import ReplayStore
from edge.adapt.store import AdaptStore
class B: model_id, version = "m", 1
state = %(state)r
rs = ReplayStore(state, dim=2000, max_bytes=200000, flush_every=3)
st = AdaptStore(state, B)
i = rs.buffer.next_seq
while True:
    rs.add(np.full(2000, (i %% 50) + 1, np.float32), i %% 7)   # value tells the label: (i %% 50) + 1
    if i %% 3 == 2:
        v = len(st.meta["contexts"].get("ctx", {}) or {}) and st.meta["contexts"]["ctx"]["current"] or 0
        st.save("ctx", {"pw4_b": np.full(64, float(v + 1), np.float32),
                        "cls_w": np.full((64, 37), float(v + 1), np.float32)}, {"i": i})
        print(i, flush=True)
    i += 1
"""


def test_sigkill_never_corrupts_replay_or_adapted_parameters(tmp_path):
    state = tmp_path / "state"
    rng = np.random.default_rng(0)
    last_version = 0
    for round_ in range(6):
        p = subprocess.Popen([sys.executable, "-c", WRITER % {"root": str(ROOT), "state": str(state)}],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(0.8 + rng.uniform(0, 0.6))  # interpreter start-up, then mid-stream
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        assert p.returncode == -signal.SIGKILL, p.stderr.read()
        rs = ReplayStore(state, dim=2000, max_bytes=200000)  # CRC checked: never a torn file
        for slot in range(rs.buffer.capacity):
            lab = rs.buffer.label_at(slot)
            if lab >= 0:
                x, labels = rs.arrays([slot])
                assert len(set(x[0].tolist())) == 1  # a whole vector, never half of two
        st = AdaptStore(state, FakeBundle)
        delta = st.load("ctx")
        if delta:
            v = st.meta["contexts"]["ctx"]["current"]
            assert v >= last_version
            last_version = v
            # both tensors of one version, written together: never a mix of versions
            assert set(np.unique(delta["pw4_b"])) == set(np.unique(delta["cls_w"])) == {float(v)}
    assert last_version > 0 and rs.count > 0
