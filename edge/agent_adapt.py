"""The agent's on-device adaptation run: between audio chunks it starts one in a child process when
the interval allows (``edgelearn device adapt`` without ``--force``, at ``nice`` 10: the scheduler
decides, pauses and resumes it, and training never holds the detector's interpreter or its GIL),
reads back what the run did, and stops a run that a new version makes moot.

Split from agent.py to keep each file about one thing; ``Agent`` inherits ``Adaptation``, and
``edge.agent`` imports ``READAPT_RETRY_S`` from here.

    >>> agent._poll_adapt(agent.clock())   # between two chunks: a finished run read back, or one started
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# while the active context was adapted against an older head (a new version arrived), a run the
# scheduler deferred or paused is asked for again this soon (else every adapt_every_s)
READAPT_RETRY_S = 300.0


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _prctl():
    """libc's prctl (Linux), looked up in the agent: the child, between fork and exec, only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _child_setup(parent: int, prctl) -> None:
    """In the adaptation child before it starts: nice 10, SIGINT ignored (Python keeps it so), and
    SIGTERM when the agent dies. A kill -9 of the agent used to leave the run going on its own,
    writing the state while agent.json said "adapting" for ever; SIGTERM ends it as the agent's own
    ``terminate`` does (every file it writes is old or new; the next start recovers). The signal is
    kept across exec; if the agent died before it was set, the child ends itself."""
    import signal

    os.nice(10)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:  # reparented already: the agent is gone
        os.kill(os.getpid(), signal.SIGTERM)


class Adaptation:
    """Mixin: needs ``state_dir``, ``cfg``, ``backend``, ``sysfs_root``, ``trusted_keys``, ``status``,
    ``device``, ``child``, ``_next_adapt``, ``_restart``, ``_model_status`` and ``_write_status`` from
    ``Agent``.

    A run is started only when there is something new to learn since the last run that committed
    (``_nothing_new``): new or changed clips in ``data``, detections added to the tail replay buffer,
    another model version or strategy, or a context to carry to a new version (``readapt_pending``).
    ``last_adapt["inputs"]`` in agent.json records what the last committed run learnt from."""

    _run_inputs = None  # ``_adapt_inputs`` when the run in progress started

    def _adapt_cmd(self) -> list[str]:
        cmd = [sys.executable, "-m", "edge.cli", "device", "adapt", "--state", str(self.state_dir),
               "--data", str(self.cfg.data), "--strategy", self.cfg.strategy, "--backend", self.backend,
               "--sysfs-root", str(self.sysfs_root)]
        root = getattr(self.device.bundle, "root", None)
        if root is not None and Path(root).is_dir():
            cmd += ["--bundle", str(root)]
        if self.trusted_keys is not None:
            cmd += ["--pubkey", str(self.trusted_keys)]
        if self.cfg.keep_versions is not None:
            cmd += ["--keep-versions", str(self.cfg.keep_versions)]
        return cmd

    def _adapt_inputs(self, replay_only: bool = False) -> dict:
        """What a run learns from, cheaply (names, sizes and mtimes; nothing is read): the labelled
        clips in ``data``, the tail replay buffer (the detections confirmed since) and the model."""
        from edge.replay import TAIL_REPLAY

        try:
            st = (self.state_dir / TAIL_REPLAY).stat()
            replay = f"{st.st_mtime_ns}:{st.st_size}:{st.st_ino}"
        except OSError:
            replay = None
        if replay_only:
            return {"replay": replay}
        h = hashlib.sha256()
        root = Path(self.cfg.data)
        try:
            for p in sorted(root.glob("*/*.wav")):
                st = p.stat()
                h.update(f"{p.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except OSError as e:  # a clip removed meanwhile: different from any run's inputs
            h.update(repr(e).encode())
        b = self.device.bundle
        return {"data": h.hexdigest()[:16], "replay": replay, "model": f"{b.model_id} v{b.version}",
                "strategy": self.cfg.strategy}

    def _nothing_new(self, inputs: dict) -> bool:
        """The last run committed, on these very inputs, and the context needs no carrying to a new
        version: a run now would train the committed context again on the same clips (200 steps
        more, drifting from what was checked) and add the same clips to the replay buffer again,
        crowding out the detections in it; a new version every --adapt-every s, for nothing."""
        last = self.status.get("last_adapt") or {}
        return (last.get("status") == "done" and last.get("inputs") == inputs
                and not (self.status.get("model") or {}).get("readapt_pending"))

    def _poll_adapt(self, now: float) -> None:
        if self.child is not None:
            rc = self.child.poll()
            if rc is None:
                return
            out, err = self.child.communicate()
            self.child = None
            try:
                res = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
            except ValueError:
                res = {}
            if rc != 0:
                res = {"status": "failed", "reason": (err.strip().splitlines() or ["exit %d" % rc])[-1]}
            self.status["last_adapt"] = {"time": time.time(), **{k: res.get(k) for k in
                                                                 ("status", "reason", "version", "steps", "strategy")}}
            if res.get("status") == "done" and self._run_inputs is not None:
                # the clips as the run started on them; the replay buffer as its commit left it
                # (detection does not write it during a run: the next detections change it)
                self.status["last_adapt"]["inputs"] = {**self._run_inputs, **self._adapt_inputs(replay_only=True)}
            self.status["state"] = "running"
            if self._model_status()["readapt_pending"]:  # deferred, paused or failed: asked again soon
                self._next_adapt = min(self._next_adapt, now + READAPT_RETRY_S)
            self._write_status()
            self._restart = True  # the adapted model (when the run committed), and replay back on
            return
        if self.cfg.data is None or not self.cfg.adapt or now < self._next_adapt:
            return
        self._next_adapt = now + self.cfg.adapt_every_s
        inputs = self._adapt_inputs()
        if self._nothing_new(inputs):  # asked again at the next interval: new clips or detections by then
            return
        self._run_inputs = inputs
        self._restart = True  # detection stops writing the replay buffer while the run owns it
        # Ctrl-C reaches the whole foreground group: the run ignores it, and the agent ends it on the way out
        # (the death signal is sent when the thread that forks the child ends: this is the loop's thread,
        # which ends the child itself in ``_finish`` on every way out but a kill)
        self.child = subprocess.Popen(self._adapt_cmd(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      preexec_fn=functools.partial(_child_setup, os.getpid(), _prctl()))
        self.status["state"] = "adapting"
        self._write_status()  # an event of note: agent.json says a run is in progress

    def _stop_child(self, why: str) -> None:
        """End the adaptation run in progress, if any (SIGTERM; every file it writes is old or new)."""
        if self.child is None:
            return
        self.child.terminate()
        try:
            self.child.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.communicate()
        self.child = None
        self.status["state"] = "running"
        self.status["last_adapt"] = {"time": time.time(), "status": "stopped", "reason": why, "version": None,
                                     "steps": None, "strategy": self.cfg.strategy}
