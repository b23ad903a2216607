"""The firmware on the MicroPython unix port with an ESP32 heap: memory bounds and steady state.

The board filesystem is a directory with the firmware compiled to .mpy (as
deployed), the MCU bundle, config and key. The script first imports every
module and records the heap the *code* takes: on an ESP32 build the modules
are frozen into flash (a board build's freeze manifest) and cost no heap, but the
unix port loads .mpy into the heap, and its 64-bit objects make that ~90 KB,
which alone fills a 100 KB heap. So the working set is measured above that
baseline: the script enrols a keyword from 5 clips, detects, adapts and
encodes one update, sampling ``gc.mem_alloc()`` after a collection at every
step (≤ 64 KB), then runs again in a heap of code + 120 KB (the margin over
64 KB is the fragmentation that loading .mpy into the same heap causes). Then it streams audio in live mode and checks the heap after
each hop is the same one detection period later (no growth per frame).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hil.board_fs import DEFAULT_BUNDLE, board_files, install_local, phrase_clips

pytestmark = pytest.mark.skipif(not (DEFAULT_BUNDLE / "manifest.json").exists(), reason="MCU bundle not built")
KEY = bytes(range(32))

SCRIPT = r"""
import gc
gc.collect()
base = gc.mem_alloc()
from firmware import link as L
from firmware.board import FakeBoard
from firmware.app import App
import edge.portable.wire, edge.portable.chunks, edge.portable.wire_topk
gc.collect()
code = gc.mem_alloc() - base
print('CODE', code)
base = gc.mem_alloc()
peak = [0]
marks = []
def mark(what):
    gc.collect()
    a = gc.mem_alloc() - base
    peak[0] = max(peak[0], a)
    marks.append((what, a))
    return a
app = App(FakeBoard(root=FS))
mark('boot')
seq = [0]
def h(kind, payload):
    seq[0] += 1
    out = app.handle(kind, seq[0], payload)
    if out[0][0] != L.ACK:
        raise RuntimeError(bytes(out[0][1][2:]).decode())
    return out
def clip(name, hop=2048):
    h(L.CMD, b'clip')
    with open(FS + name, 'rb') as f:
        while True:
            b = f.read(hop)
            if not b:
                break
            h(L.AUDIO, b)
h(L.CMD, b'enrol kw')
for i in range(5):
    clip('a%d.pcm' % i)
    h(L.CMD, b'shot')
    mark('shot%d' % i)
h(L.CMD, b'enrolled')
mark('enrolled')
clip('a5.pcm')
h(L.CMD, b'detect')
mark('detect')
h(L.CMD, b'feedback 0')
mark('adapt')
out = h(L.CMD, b'update 1 1')
mark('update')
print('CHUNKS', len(out) - 1)
h(L.CMD, b'live on')
steady = [0] * 150   # preallocated: a growing list would show up as growth
k = 0
for rep in range(3):
    with open(FS + 'b0.pcm', 'rb') as f:
        while True:
            b = f.read(640)
            if not b:
                break
            h(L.AUDIO, b)
            b = None
            gc.collect()
            steady[k] = gc.mem_alloc() - base
            k += 1
print('MARKS', marks)
print('PEAK', peak[0], 'BASE', base)
print('STEADY', steady)
"""


@pytest.fixture(scope="module")
def fs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mpboard")
    files = board_files(tmp / "work", DEFAULT_BUNDLE, "esp32-test", KEY, bundle_dest="bundle")
    install_local(files, tmp / "fs")
    clips = list(phrase_clips(6)[0].values())
    for i, c in enumerate(clips[0]):
        (tmp / "fs" / f"a{i}.pcm").write_bytes(c.astype("<i2").tobytes())
    (tmp / "fs" / "b0.pcm").write_bytes(clips[1][0].astype("<i2").tobytes())
    return tmp / "fs"


def run(micropython, fs, heap):
    out = micropython(f"FS = {str(fs) + '/'!r}\n" + SCRIPT, heap=heap, path=[fs], cwd=fs, timeout=300)
    res = {}
    for line in out.splitlines():
        key, _, rest = line.partition(" ")
        res[key] = rest
    return res


def test_enrol_detect_update_fit_in_64k_and_no_growth_per_frame(micropython, fs):
    res = run(micropython, fs, "256k")
    code = int(res["CODE"])
    marks = dict(eval(res["MARKS"]))   # list of (step, bytes) printed by MicroPython
    peak = int(res["PEAK"].split()[0])
    assert peak <= 64 * 1024, marks
    assert int(res["CHUNKS"]) >= 1
    steady = [int(v) for v in json.loads(res["STEADY"])]
    period = 24          # live detection runs every 24 hops; one AUDIO frame of 640 bytes is one hop
    hops = len(steady) // 3
    assert hops == 50
    # after the first pass (ring filling, first detections), the heap after each hop
    # equals the heap at the same point one detection period later
    later = steady[hops:]
    same = [later[i] == later[i + period] for i in range(len(later) - period)]
    assert all(same), [later[i + period] - later[i] for i in range(len(later) - period) if not same[i]]
    print({"code": code, "peak": peak, **marks})
    # The whole sequence, transient garbage included, also runs in code + 120 KB. The
    # margin over the 64 KB live peak is fragmentation: loading ~100 KB of .mpy into
    # the same heap leaves it in pieces, so the 5 KB weight arrays need a larger heap
    # (measured: code + 112 KB runs, code + 96 KB does not). Frozen modules avoid this.
    res_tight = run(micropython, fs, "%dk" % ((code + 2048) // 1024 + 120))
    assert "PEAK" in res_tight


def test_missing_bundle_is_reported_not_a_crash(micropython, tmp_path):
    files = board_files(tmp_path / "work", DEFAULT_BUNDLE, "esp32-test", KEY, bundle_dest="bundle")
    install_local([f for f in files if not f[1].startswith("bundle")], tmp_path / "fs")
    code = f"""
from firmware.app import App, AppError
from firmware.board import FakeBoard
try:
    App(FakeBoard(root={str(tmp_path / 'fs') + '/'!r}))
except AppError as e:
    print('ERR', e.problem, '|', e.fix)
"""
    out = micropython(code, heap="256k", path=[tmp_path / "fs"], cwd=tmp_path / "fs")
    assert out.startswith("ERR no bundle in bundle") and "edgelearn flash" in out
