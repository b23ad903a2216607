"""The Wyoming server's shared models: one keyword selection's loaded models (``ModelSet``) and the
cheap signature of the state files that decide which models detection runs (``state_signature``).

``edge.wyoming.WakeServer`` loads a ``ModelSet`` once per keyword selection and state, and every
stream of every connection pushes through it; both names stay importable from ``edge.wyoming``.

    >>> ms = ModelSet(device.detector(keywords=["yes"], replay=False)[0], state_signature(device))
    >>> det = ms.detector()             # one stream's own state over the shared models
    >>> events = ms.push(det, pcm)      # under the set's lock
"""

from __future__ import annotations

import copy
import threading
import time
from pathlib import Path

# files in the state directory whose change means detection runs other models (``Device.detector`` reads
# them): the enrolled keywords, the adapt pointer (an adapted context committed, rolled back or carried
# to a new version), the calibrated operating points
STATE_FILES = ("keywords.json", "adapt/active.json", "operating.json")


def state_signature(device) -> tuple:
    """What decides the models ``device`` detects with, cheaply: (mtime, size, inode) of each of
    ``STATE_FILES`` (``edge.atomic`` replaces a file, so a rewrite is a new inode even within one
    mtime tick). The Device itself is compared by identity beside it (the agent swaps in a new
    Device, on the new bundle, when a version is installed)."""
    root = Path(device.state_dir)
    out = []
    for name in STATE_FILES:
        try:
            st = (root / name).stat()
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except FileNotFoundError:
            out.append(None)
    return tuple(out)


class ModelSet:
    """One keyword selection's loaded models, shared by every stream that detects it.

    ``template``: a Detector built once (``Device.detector``); ``detector()`` gives each stream a
    copy of it whose stream state is its own (``Detector.reset`` makes every per-stream field
    anew; the copy shares only what never changes once built: the keyword model, the custom
    keywords and their verifier, the adapted head, the keyword indices and thresholds).

    ``lock`` is held around every push and flush of those detectors: LiteRT interpreters are not
    thread-safe (``set_tensor``/``invoke``/``get_tensor`` of two threads interleave), and the
    verifier's and an adapted tail's interpreters are reached from inside ``push`` too, so the
    whole push is the unit that is safe by construction (without it, threads pushing through one
    set fail with LiteRT's RuntimeError "There is at least 1 reference to internal data in the
    interpreter", and tests/test_wyoming_shared.py's threads test fails). A lock and not a pool
    of interpreters or one per worker thread, by measurement (bench/wyoming_latency.py,
    2026-12-02, 2 shared cores): eight streams pushed from eight threads at real time, every
    thread's chunk due at the same moment (the worst case for a lock), return from their pushes as
    soon through one shared set as through a set each (p50 1.64 vs 1.63 ms after the chunk is
    due, p99 12.0 vs 12.9 ms: the GIL already serialises most of a push, and a push is short, the
    encoder invoke 0.04 ms), at the same CPU (5.3 vs 5.5 ms per second of audio); a set per
    thread or per connection would load the models again for each (3.9 ms of CPU and 0.4 MB per
    set; per connection, what this server did before, it was 6.3 ms of set-up per stream and 44 MB
    more RSS with 32 connections). ``waits`` / ``wait_s`` count the pushes that found the lock
    held and how long they waited."""

    def __init__(self, template, signature=None):
        self.template, self.signature = template, signature
        self.lock = threading.Lock()
        self.streams = 0               # detectors handed out
        self.pushes = self.waits = 0   # lock acquisitions, and those that found it held
        self.wait_s = 0.0              # time spent waiting for it

    def detector(self):
        """A Detector for one stream: the shared models, its own stream state. Push through it
        with ``push`` / ``flush`` (the lock held), never directly."""
        det = copy.copy(self.template)  # the template itself is never pushed: nothing of it changes
        det.reset()
        with self.lock:
            self.streams += 1
        return det

    def _run(self, fn, *args):
        lock = self.lock
        if not lock.acquire(blocking=False):
            t = time.perf_counter()
            lock.acquire()
            self.waits += 1  # counted while holding the lock
            self.wait_s += time.perf_counter() - t
        try:
            self.pushes += 1
            return fn(*args)
        finally:
            lock.release()

    def push(self, det, pcm) -> list[dict]:
        return self._run(det.push, pcm)

    def flush(self, det) -> list[dict]:
        return self._run(det.flush)

