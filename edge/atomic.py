"""Crash-safe file writes, shared by every piece of device state (and the bundle store).

``atomic_write(path, data)`` leaves either the old file or the new one, never a mix: the
bytes go to a temp file beside ``path`` (created 0600, so nothing is ever readable by others
even for a moment), which is fsynced, renamed over ``path`` and the directory fsynced.
The temp file is named ``.<name>.<pid>.<random>.tmp``; a crash (kill -9, power cut) can leave
one behind, and ``sweep_temp(dir)`` removes those whose writer is gone (its pid is not running,
or the file is over an hour old), never a live writer's.

``append_line(path, line, max_bytes)`` is the log appender: one ``write`` per record, fdatasync,
mode 0600, a torn last line (a crash in the middle of an append) never glued to the next record,
and the file rotated to ``<name>.1`` before it would pass ``max_bytes`` (so a log is bounded by
two files).

``replace(src, dst)`` and ``remove(path)`` are the other durable steps of a commit (a rename of
a staged file into place, a deletion), with the directory fsynced.

``locked(directory, name)`` is the one writer lock: an exclusive ``flock`` on ``directory/name``
(0600, created empty), dropped by the kernel however the holder dies, re-entrant within a process
(a holder may take it again; threads of one process take turns). A read-modify-write of shared
state holds it around the re-read and the write only, never around a long computation
(``edge.keywords.state_lock``, the adapt store's commits).

The same writer in the other shapes a caller needs (each one temp file, 0600 while it is written,
fsynced, renamed, the directory fsynced; the temp removed if the writer raises):

* ``atomic_file(path)``: a binary file object to stream into (``np.savez(f, ...)``, a zip, a WAV);
* ``atomic_path(path)``: a temp *name* for a tool that wants one (an ONNX exporter), with
  ``path``'s suffix so a tool that picks the format by suffix still can;
* ``npz_bytes(arrays)``: an ``.npz`` as bytes, for ``atomic_write`` or a request body;
* ``write_new(path, data, mode)``: a file that must not exist yet (a key), its mode from the first byte;
* ``replace_dir(tmp, out)``: a finished directory swapped in for ``out`` (the old one kept aside
  until the new one is in place).

``mode=MODE`` (0600) is the default; ``mode=None`` gives the final file the mode a plain
``open(path, "w")`` would (``0666`` under the umask, normally 0644) for files that are public by
design (audio, bundles, caches, benchmark results), while its temp file is still 0600.

``fault_hook``: None, or a callable ``(event, path)`` called at each durable step
(``"begin"`` when a write starts, ``"tmp"`` once its temp file is durable but not yet in place,
``"done"`` when it is in place), which a crash test uses to stop a process exactly there.

    >>> atomic_write(state / "keywords.json", json.dumps(doc).encode())
    >>> sweep_temp(state)       # at start-up: what an earlier crash left behind
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

MODE = 0o600
STALE_S = 3600.0
# .<name>.<pid>.<mkstemp random>.tmp (.tmp<suffix> from atomic_path), and the older
# .<name>.<8 random> of a known state file
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[A-Za-z0-9_]+\.tmp(\.[A-Za-z0-9]+)?$")
_LEGACY = re.compile(r"^\.(?P<name>keywords\.json|active\.json|checkpoint\.npz|v\d+\.npz|features-[0-9a-f]+\.npy"
                     r"|replay(_tail)?\.bin|scheduler\.state|current)\.[A-Za-z0-9_]{8}$")

fault_hook = None


def _fault(event: str, path) -> None:
    if fault_hook is not None:
        fault_hook(event, str(path))


def fsync_dir(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    try:  # Linux says it without changing it (os.umask would, for every thread, for a moment)
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def _final_mode(mode: int | None) -> int:
    return 0o666 & ~_umask() if mode is None else mode


@contextmanager
def atomic_file(path, mode: int | None = MODE):
    """A binary file to write ``path`` through; a crash leaves the old file or the new one."""
    path = Path(path)
    _fault("begin", path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    with _renamed_over(tmp, path):
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if mode != MODE:
                os.fchmod(f.fileno(), _final_mode(mode))
            os.fsync(f.fileno())


@contextmanager
def _renamed_over(tmp, path: Path):
    """When the block ends, the (fsynced) temp ``tmp`` replaces ``path`` and the directory is synced;
    when it raises, ``tmp`` is removed and ``path`` is untouched."""
    try:
        yield
        _fault("tmp", path)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        if e.filename is None:  # a write or fsync (a full disk): say which file could not be written
            raise type(e)(e.errno, e.strerror or str(e), str(path)) from e
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    _fault("done", path)


_LOCKS: dict = {}  # lock file -> [RLock of this process's threads, depth, fd while held]
_LOCKS_GUARD = threading.Lock()


@contextmanager
def locked(directory, name: str = ".lock"):
    """Hold the exclusive ``flock`` on ``directory/name`` (created 0600, the directory too) while the
    block runs; other processes wait for it. Re-entrant in one process (flock on a second open file
    of the same lock would wait on itself)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / name
    key = os.path.realpath(path)
    with _LOCKS_GUARD:
        entry = _LOCKS.setdefault(key, [threading.RLock(), 0, -1])
    with entry[0]:
        if entry[1] == 0:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, MODE)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
            entry[2] = fd
        entry[1] += 1
        try:
            yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                fd, entry[2] = entry[2], -1
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)


STATE_LOCK = ".lock"


def state_lock(state_dir):
    """The device state directory's writer lock, ``ST/.lock`` (``locked``): every read-modify-write
    of ``keywords.json``, ``operating.json`` and the replay buffers holds it while it re-reads the
    file and writes the merge (``edge.keywords.DeviceState.save``, ``edge.replay.ReplayStore.flush``,
    ``edge.operating.save_points``)."""
    return locked(state_dir, STATE_LOCK)


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # a full disk or quota: the old file stays (atomic writes)


def no_space(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in NO_SPACE


def set_aside(path, why: str) -> None:
    """Keep a damaged file beside as ``NAME.damaged`` (replacing an older one) and say so once on
    stderr, for state a command can rebuild (a replay buffer, a client's sequence)."""
    import json
    import sys

    path = Path(path)
    os.replace(path, path.with_name(path.name + ".damaged"))
    print(json.dumps({"warning": f"{path} is damaged ({why}); kept as {path.name}.damaged"}),
          file=sys.stderr, flush=True)


def atomic_write(path, data: bytes, mode: int | None = MODE) -> None:
    """Write bytes so that a crash leaves either the old file or the new one, never a mix."""
    with atomic_file(path, mode) as f:
        f.write(data)


@contextmanager
def atomic_path(path, mode: int | None = MODE):
    """A temp file name beside ``path`` (0600, ending in ``path``'s suffix) for a tool that writes
    to a name; when the block ends the file is fsynced and renamed over ``path``."""
    path = Path(path)
    _fault("begin", path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.",
                               suffix=f".tmp{path.suffix}")
    os.close(fd)
    with _renamed_over(tmp, path):
        yield Path(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            if mode != MODE:
                os.fchmod(fd, _final_mode(mode))
            os.fsync(fd)
        finally:
            os.close(fd)


def npz_bytes(arrays: dict) -> bytes:
    """``np.savez`` of ``arrays`` (name -> array), as bytes."""
    import io

    import numpy as np

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def write_new(path, data: bytes, mode: int = MODE) -> None:
    """Create ``path``, which must not exist (FileExistsError), with exactly ``mode`` from its
    first byte (whatever the umask), fsynced with its directory."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(path, mode)  # the umask may have narrowed it; make it exact
    fsync_dir(path.parent)


def replace_dir(tmp, out) -> None:
    """Put the finished directory ``tmp`` in place of ``out`` (beside it). Linux has no portable
    atomic directory swap from Python: the old one is kept under a side name until the new one
    is in place, then removed."""
    tmp, out = Path(tmp), Path(out)
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
        os.rename(out, old / "b")
    os.rename(tmp, out)
    fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def replace(src, dst) -> None:
    """Rename a staged (complete, fsynced) file over ``dst``, durably."""
    dst = Path(dst)
    _fault("begin", dst)
    os.replace(src, dst)
    fsync_dir(dst.parent)
    if Path(src).parent != dst.parent:
        fsync_dir(Path(src).parent)
    _fault("done", dst)


def remove(path) -> bool:
    """Delete a file durably; False if it was not there."""
    path = Path(path)
    if not path.exists():
        return False
    _fault("begin", path)
    path.unlink(missing_ok=True)
    fsync_dir(path.parent)
    _fault("done", path)
    return True


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's process counts; a pid no process can have does not)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0  # someone else's process (or a pid no process can have: not alive)
    return True


def is_temp(name: str) -> bool:
    return bool(_TEMP.match(name) or _LEGACY.match(name))


def sweep_temp(directory, now: float | None = None) -> list[Path]:
    """Remove the temp files of atomic writes that a crash left in ``directory``; returns them.

    A temp file is stale when its writer's pid is not running or it is over ``STALE_S`` old
    (pid reuse after a reboot); the older unnamed kind (no pid) when over a minute old."""
    d = Path(directory)
    if not d.is_dir():
        return []
    now = time.time() if now is None else now
    gone = []
    for p in d.iterdir():
        m, legacy = _TEMP.match(p.name), _LEGACY.match(p.name)
        if not (m or legacy) or not p.is_file() or p.is_symlink():
            continue
        try:
            age = now - p.stat().st_mtime
        except OSError:
            continue
        stale = age > STALE_S or (not pid_alive(int(m["pid"])) if m else age > 60)
        if stale:
            p.unlink(missing_ok=True)
            gone.append(p)
    return gone


def append_line(path, line: str, max_bytes: int) -> None:
    """Append one record (``line``, no newline) to a log of at most ``max_bytes`` per file."""
    path = Path(path)
    rec = (line.rstrip("\n") + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, MODE)
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o777 != MODE:
            os.fchmod(fd, MODE)  # a log written before the 0600 rule
        size = st.st_size
        if size and size + len(rec) > max_bytes:
            os.close(fd)
            fd = -1
            os.replace(path, path.with_name(path.name + ".1"))
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, MODE)
            size = 0
        if size:
            with open(path, "rb") as f:  # a torn last record stays on its own line
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    rec = b"\n" + rec
        os.write(fd, rec)
        os.fdatasync(fd)
    finally:
        if fd >= 0:
            os.close(fd)
