"""One agent per state: ``edgelearn device run`` holds an exclusive ``flock`` on ``STATE/agent.lock``
for its whole life. Two agents on one state both detected, both rewrote agent.json, collided on
their check-ins (409 "dated ... not after its last one"), on bundle installs and on the replay
buffer; now the second one is refused with the first one's pid and the fix.

Why a lock of its own and not ``edge.atomic.locked``: that one waits (a second agent would hang,
not be refused) and is the short lock every state write takes, so holding it for the agent's life
would stop ``device adapt`` / ``enroll`` / ``use`` on the state. This one is tried once
(``LOCK_NB``), and its file holds the holder's pid for the refusal. The kernel drops a flock when the
process dies, kill -9 included, so a restart after a crash is never refused by a stale file.

The fd is close-on-exec (``O_CLOEXEC``; ``subprocess`` closes fds anyway): the adaptation child
(``device adapt``) and the ``--on-detect`` hooks must not inherit it, or a hook still running after the
agent died would keep a restarted agent out. In one process the lock is shared, counted per path:
several ``Agent`` objects on one state in one process (tests build them to inspect a state) would
otherwise refuse each other, as flock locks belong to open files, not processes.

    >>> release = hold("/var/lib/edgelearn")   # EdgelearnError if another agent runs there
    >>> release()                               # idempotent; also run when the Agent is collected
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from edge.errors import EdgelearnError

LOCK_FILE = "agent.lock"
_HELD: dict = {}  # realpath -> [fd, count]: this process's agent locks
_GUARD = threading.Lock()


def _holder(path: Path) -> int | None:
    """The pid the running agent wrote in the lock file (None: unreadable, or not written yet)."""
    try:
        text = path.read_text()[:32].strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None


def hold(state_dir):
    """Take the agent lock of ``state_dir`` (shared within this process); returns the function that
    releases it (once). Raises EdgelearnError naming the running agent's pid when another process
    holds it."""
    path = Path(state_dir) / LOCK_FILE
    key = os.path.realpath(path)
    with _GUARD:
        entry = _HELD.get(key)
        if entry is None:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as e:
                raise EdgelearnError(f"cannot open {path} ({e.strerror})",
                                     fix="run the agent as the user that owns the state directory") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                pid = _holder(path)
                who, kill = (f"pid {pid}", f"kill {pid}") if pid else ("another process", "kill it")
                raise EdgelearnError(
                    f"another agent ({who}) is already running on the state {state_dir}",
                    fix=f"stop it first (systemctl stop edgelearn-agent, or {kill}), or pass another --state"
                ) from None
            except BaseException:
                os.close(fd)
                raise
            try:  # the pid, for a refused second agent's message (the lock itself is the flock)
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError:
                pass  # a full disk: the lock holds all the same; the refusal then names no pid
            entry = _HELD[key] = [fd, 0]
        entry[1] += 1
    done = []

    def release() -> None:
        with _GUARD:
            if done:
                return
            done.append(True)
            entry[1] -= 1
            if entry[1] == 0 and _HELD.get(key) is entry:
                del _HELD[key]
                os.close(entry[0])  # closing the last fd of the open file drops the flock
    return release
