"""Board transport: mpremote's serial transport (raw REPL, raw-paste) with the few things HIL needs.

``BoardTransport`` enters the raw REPL *without* a soft reset when the rig
says so (the unix port exits on Ctrl-D), copies files with mpremote's
``fs_writefile`` (so a transfer cut short leaves a short file, which the
firmware's digest check then rejects), runs code, and hands the same pyserial
port to ``host.gateway.BoardLink`` once the firmware loop is started.

    t = BoardTransport("/dev/ttyUSB0")
    t.deploy(files)                                  # [(local, board path), ...]
    t.exec("import gc; print(gc.mem_free())")
    link = t.start_firmware()                        # BoardLink on the same port
"""

from __future__ import annotations

from pathlib import Path

from edge.errors import EdgelearnError


class TransportError(EdgelearnError):
    """The board did not enter the raw REPL or a command on it failed."""


class BoardTransport:
    def __init__(self, port: str, baudrate: int = 115200, soft_reset: bool = False, in_rom: tuple[str, ...] = ()):
        from mpremote.transport_serial import SerialTransport

        try:
            self.t = SerialTransport(port, baudrate=baudrate)
        except Exception as e:  # mpremote raises its own TransportError or serial's
            raise TransportError(f"cannot open {port}: {e}", fix="check the port name and permissions") from None
        self.port = port
        self.soft_reset = soft_reset
        self.in_rom = in_rom     # board paths the board holds in flash (frozen / ROMFS): deploy skips them
        self._raw = False

    def raw(self) -> None:
        if not self._raw:
            try:
                self.t.enter_raw_repl(soft_reset=self.soft_reset)
            except Exception as e:
                raise TransportError(f"the board on {self.port} did not enter the raw REPL ({e})",
                                     fix="stop whatever runs on it (Ctrl-C) or reset it") from None
            self._raw = True

    def exec(self, code: str, timeout: float = 60) -> str:
        self.raw()
        try:
            out = self.t.exec_raw(code, timeout=timeout)
        except Exception as e:
            raise TransportError(f"running code on the board failed: {e}", fix="see the board's error") from None
        data, err = out
        if err:
            raise TransportError(f"the board raised: {err.decode(errors='replace').strip()}",
                                 fix="see the traceback")
        return data.decode(errors="replace")

    def mkdirs(self, path: str) -> None:
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            p = "/".join(parts[:i])
            self.exec(f"import os\ntry:\n os.mkdir({p!r})\nexcept OSError:\n pass")

    def put(self, local: Path, remote: str, chunk: int = 1024) -> None:
        self.raw()
        if "/" in remote:
            self.mkdirs(remote.rsplit("/", 1)[0])
        self.t.fs_writefile(remote, Path(local).read_bytes(), chunk_size=chunk)

    def deploy(self, files, progress=None) -> int:
        total = 0
        files = [f for f in files if not f[1].startswith(self.in_rom)] if self.in_rom else list(files)
        for i, (local, remote) in enumerate(files):
            self.put(local, remote)
            total += Path(local).stat().st_size
            if progress:
                progress(i + 1, len(files), remote)
        return total

    def start_firmware(self, timeout: float = 30.0):
        """Run ``firmware.main.run()`` and return a ``BoardLink`` on the same port, after its boot event."""
        from host.gateway import BoardLink

        self.raw()
        self.t.exec_raw_no_follow("from firmware import main\nmain.run()\n")
        link = BoardLink(self.t.serial, timeout=timeout)
        link._drain(quiet=0.5)
        return link

    def stop_firmware(self, link) -> str:
        """Send ``quit`` and collect what the raw REPL prints when run() returns."""
        import time

        reply = link.command("quit", drain=False)
        tail = link.leftover()
        deadline = time.time() + 10
        while not tail.endswith(b"\x04>") and time.time() < deadline:
            tail += self.t.serial.read(max(1, self.t.serial.in_waiting))
        if not tail.endswith(b"\x04>"):
            raise TransportError("the firmware loop did not return to the raw REPL after quit",
                                 fix="reset the board")
        return reply

    def close(self) -> None:
        try:
            self.t.close()
        except Exception:
            pass
