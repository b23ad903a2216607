"""The firmware on the MicroPython unix port with an ESP32 heap: memory bounds and steady state.

The board filesystem is a directory with the firmware compiled to .mpy (as
deployed), the MCU bundle, config and key. The script enrols a keyword from
5 clips, detects, adapts and encodes one update, sampling ``gc.mem_alloc()``
after a collection at every step; it runs twice: with a 100 KB heap (ESP32
without PSRAM), reporting the numbers, and with a 64 KB heap, which proves the
whole sequence never needs more than 64 KB live at once. Then it streams audio
in live mode and checks the heap after each hop is the same one detection
period later (no growth per frame).
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
peak = [0]
marks = []
def mark(what):
    gc.collect()
    a = gc.mem_alloc()
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
steady = []
with open(FS + 'b0.pcm', 'rb') as f:
    pcm = f.read()
for rep in range(3):
    for a in range(0, len(pcm), 640):
        h(L.AUDIO, pcm[a:a + 640])
        gc.collect()
        steady.append(gc.mem_alloc())
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
    res = run(micropython, fs, "100k")
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
    print({"peak": peak, **marks})
    # the whole sequence (live objects and transient garbage) also runs in a 64 KB heap
    res64 = run(micropython, fs, "64k")
    assert "PEAK" in res64


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
    out = micropython(code, path=[tmp_path / "fs"], cwd=tmp_path / "fs")
    assert out.startswith("ERR no bundle in bundle") and "edgelearn flash" in out
