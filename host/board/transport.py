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

``deploy`` leaves the board as it was when its filesystem refuses a write: it
asks the board first what it holds at those paths and how much space is free
(``os.statvfs``) and refuses in one ``BoardFsError`` sentence if the files
cannot fit; a file the board already has is written to ``name.tmp`` and renamed
over it only after every write succeeded; a read-only (EROFS) or full (ENOSPC)
filesystem met on the way removes what the deploy wrote and the directories it
made before the sentence is raised.
"""

from __future__ import annotations

import errno
import re
from pathlib import Path

from edge.errors import EdgelearnError


class TransportError(EdgelearnError):
    """The board did not enter the raw REPL or a command on it failed."""


class BoardFsError(TransportError):
    """The board's filesystem refused the deploy: it is read-only, or too full for the files."""


def _host_errno(board_errno: int) -> int:
    """A MicroPython errno number (py/mperrno.h) as this host's errno (what mpremote converts to)."""
    from mpremote.mp_errno import MP_ERRNO_TABLE
    return MP_ERRNO_TABLE.get(board_errno, board_errno)


def _errno_in(text: str) -> int | None:
    """The host errno of the OSError a board's traceback ends with ("OSError: [Errno 28] ENOSPC", "OSError: 30")."""
    m = re.search(r"OSError: \[Errno (\d+)\]", text) or re.search(r"OSError: \(?(\d+)", text)
    return _host_errno(int(m.group(1))) if m else None


def _parents(paths) -> list[str]:
    """The directories ``paths`` (board paths) live in, each once, parents before children."""
    out: list[str] = []
    for p in paths:
        parts = p.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in out:
                out.append(d)
    return out


# MicroPython that deploy runs on the board. Every name it uses is one the board has interned anyway
# (the os module's, mpremote's ``f`` and ``w``, which it leaves at None): a name new to the board stays
# in its heap for good, and the firmware's 100 KB leave a margin of 2-5 KB (docs/firmware.md; one
# helper function here made the gateway relay test run out of heap).
_STAT = """
import os
for f in %r:
    try:
        w = os.stat(f)
        print(-2 if w[0] & 0x4000 else w[6])
    except OSError:
        print(-1)
f = w = None
"""
_SPACE = """
import os
try:
    w = os.statvfs(os.getcwd())
    print(w[1] or w[0], w[4] if w[2] else -1)
except Exception:
    print(0, -1)
w = None
"""
_MKDIRS = """
import os
for f in %r:
    os.mkdir(f)
    print(f)
f = None
"""
_UNDO = """
import os
try:
    f.close()
except Exception:
    pass
for f in %r:
    try:
        os.remove(f)
    except OSError:
        pass
for f in %r:
    try:
        os.rmdir(f)
    except OSError:
        pass
f = w = None
"""
_COMMIT = """
import os
for f, w in %r:
    try:
        os.rename(f, w)
    except OSError:
        os.remove(w)
        os.rename(f, w)
f = w = None
"""


class _FsFailure(Exception):
    """A write or mkdir the board refused: the host ``errno`` (None if unknown), the board path, the board's
    words, and the directories made before it (``_mkdirs``)."""

    def __init__(self, err: int | None, path: str, detail: str, made: list[str] | None = None):
        super().__init__(err, path, detail)
        self.errno, self.path, self.detail, self.made = err, path, detail, made or []


def _free_fix(old_bundle: bool) -> str:
    what = ("remove bundle.old/, the bundle before the running one: mpremote connect PORT rm -r :bundle.old"
            if old_bundle else "remove files you put there: mpremote connect PORT ls, then rm :NAME")
    return f"free space on the board ({what}) and flash again"


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

    def _board(self, code: str, timeout: float = 60) -> tuple[str, str]:
        """Run ``code`` on the board: (what it printed, the traceback it raised or "")."""
        self.raw()
        try:
            out, err = self.t.exec_raw(code, timeout=timeout)
        except Exception as e:
            raise TransportError(f"running code on the board failed: {e}", fix="see the board's error") from None
        return out.decode(errors="replace"), err.decode(errors="replace").strip()

    def _numbers(self, code: str) -> list[int]:
        """The integers ``code`` prints on the board."""
        out, err = self._board(code)
        if err:
            raise TransportError(f"the board raised: {err}", fix="see the traceback")
        return [int(x) for x in out.split()]

    def stat(self, paths: list[str]) -> dict[str, int]:
        """{board path: its size in bytes, -2 for a directory, -1 where there is nothing}."""
        paths = list(paths)
        return dict(zip(paths, self._numbers(_STAT % (paths,)))) if paths else {}

    def free_space(self) -> tuple[int, int] | None:
        """(bytes free, block size) of the board's filesystem (``os.statvfs`` of its working directory), None
        where the port has no statvfs or the filesystem counts no blocks."""
        block, avail = self._numbers(_SPACE)
        return (avail * (block or 1), block or 1) if avail >= 0 else None

    def _mkdirs(self, dirs: list[str]) -> list[str]:
        """Make ``dirs`` (parents first); returns them. A refused one raises _FsFailure with those made so far."""
        if not dirs:
            return []
        out, err = self._board(_MKDIRS % (list(dirs),))
        made = [ln.strip() for ln in out.splitlines() if ln.strip()]
        if err:
            raise _FsFailure(_errno_in(err), dirs[len(made)] + "/", err.splitlines()[-1], made)
        return made

    def mkdirs(self, path: str) -> None:
        """Make ``path`` and its parents where the board has none (a read-only or full board: BoardFsError)."""
        dirs = _parents([path.strip("/") + "/-"])   # "path/-": path itself and its parents
        have = self.stat(dirs)
        try:
            self._mkdirs([d for d in dirs if have[d] == -1])
        except _FsFailure as e:
            raise self._refused(e, undone=False) from None

    def _write(self, remote: str, data: bytes, chunk: int) -> None:
        """mpremote's ``fs_writefile``; a write the board refuses raises _FsFailure."""
        from mpremote.transport import TransportExecError

        self.raw()
        try:
            self.t.fs_writefile(remote, data, chunk_size=chunk)
        except OSError as e:        # mpremote maps the board's OSError to the host's errno
            raise _FsFailure(e.errno, remote, e.strerror or str(e)) from None
        except TransportExecError as e:   # one it does not map
            text = e.error_output.strip()
            raise _FsFailure(_errno_in(text), remote, text.splitlines()[-1] if text else "") from None

    def put(self, local: Path, remote: str, chunk: int = 1024) -> None:
        """Copy one file as it is, in place (a copy cut short stays short: the firmware's digest check rejects it)."""
        if "/" in remote:
            self.mkdirs(remote.rsplit("/", 1)[0])
        try:
            self._write(remote, Path(local).read_bytes(), chunk)
        except _FsFailure as e:
            raise self._refused(e, undone=False) from None

    def _refused(self, e: _FsFailure, need: int | None = None, old_bundle: bool = False,
                 undone: bool = True) -> TransportError:
        """The one sentence for a write the board refused; ``undone``: the deploy took back what it wrote."""
        kept = ", so nothing was flashed and the board holds what it held before" if undone else ""
        if e.errno == errno.EROFS:
            return BoardFsError(f"the board's filesystem is read-only (the board on {self.port} refused to write "
                                f"{e.path}){kept}", fix="mount it read-write (vfs.mount(..., readonly=False) in "
                                                        "its boot.py) and flash again")
        if e.errno == errno.ENOSPC:
            space = self.free_space()
            counts = [f"it reports {space[0]} bytes free"] if space else []
            counts += [f"the files to flash need {need}"] if need else []
            return BoardFsError(f"the board's filesystem is full (the board on {self.port} ran out of space writing "
                                f"{e.path}{'; ' + ', '.join(counts) if counts else ''}){kept}",
                                fix=_free_fix(old_bundle))
        return TransportError(f"the board on {self.port} could not write {e.path} ({e.detail}){kept}",
                              fix="see the board's error")

    def deploy(self, files, progress=None, chunk: int = 1024) -> int:
        """Copy ``files`` ([(local, board path), ...]) in order; returns the bytes copied.

        Nothing on the board is lost when its filesystem refuses. Too little
        free space (``os.statvfs``; every file rounded up to whole blocks) is a
        ``BoardFsError`` before anything is written. A path the board already
        has is written to ``path.tmp``, and the .tmp files are renamed over the
        old ones only once every write succeeded. A write the board refuses
        (read-only, full, or another OSError) removes what this deploy wrote
        and the directories it made, then raises one sentence.
        """
        files = [f for f in files if not f[1].startswith(self.in_rom)] if self.in_rom else list(files)
        blobs = [(Path(local).read_bytes(), remote) for local, remote in files]  # the host's files: read first
        dirs = _parents(remote for _, remote in blobs)
        have = self.stat([r for _, r in blobs] + dirs + ["bundle.old"])
        old_bundle = have["bundle.old"] != -1
        space = self.free_space()
        block = space[1] if space else 1
        need = sum(-(-len(b) // block) * block for b, _ in blobs)
        if space is not None and space[0] < need:
            raise BoardFsError(f"the board's filesystem is full ({space[0]} bytes free, the files to flash need "
                               f"{need}), so nothing was written and the board on {self.port} holds what it "
                               "held before", fix=_free_fix(old_bundle))
        made: list[str] = []
        written: list[str] = []
        renames: list[tuple[str, str]] = []
        try:
            made = self._mkdirs([d for d in dirs if have[d] == -1])
            for i, (blob, remote) in enumerate(blobs):
                dest = remote + ".tmp" if have[remote] != -1 else remote
                written.append(dest)            # before the write: a partial file goes too
                self._write(dest, blob, chunk)
                if dest != remote:
                    renames.append((dest, remote))
                if progress:
                    progress(i + 1, len(blobs), remote)
        except _FsFailure as e:
            self._board(_UNDO % (written, sorted(made or e.made, key=lambda d: -d.count("/"))))
            raise self._refused(e, need, old_bundle) from None
        if renames:
            out, err = self._board(_COMMIT % (renames,))
            if err:
                raise TransportError(f"the board on {self.port} could not rename the files it was sent over its "
                                     f"own ({err.splitlines()[-1]})", fix="flash again")
        return sum(len(b) for b, _ in blobs)

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
