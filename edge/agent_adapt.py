"""The agent's on-device adaptation run: between audio chunks it starts one in a child process when
the interval allows (``edgelearn device adapt`` without ``--force``, at ``nice`` 10: the scheduler
decides, pauses and resumes it, and training never holds the detector's interpreter or its GIL),
reads back what the run did, and stops a run that a new version makes moot.

Split from agent.py to keep each file about one thing; ``Agent`` inherits ``Adaptation``, and
``edge.agent`` imports ``READAPT_RETRY_S`` from here.

    >>> agent._poll_adapt(agent.clock())   # between two chunks: a finished run read back, or one started
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

# while the active context was adapted against an older head (a new version arrived), a run the
# scheduler deferred or paused is asked for again this soon (else every adapt_every_s)
READAPT_RETRY_S = 300.0


def _nice_child() -> None:
    """In the adaptation child before it starts: nice 10, and SIGINT ignored (Python keeps it so)."""
    import signal

    os.nice(10)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Adaptation:
    """Mixin: needs ``state_dir``, ``cfg``, ``backend``, ``sysfs_root``, ``trusted_keys``, ``status``,
    ``device``, ``child``, ``_next_adapt``, ``_restart``, ``_model_status`` and ``_write_status`` from
    ``Agent``."""

    def _adapt_cmd(self) -> list[str]:
        cmd = [sys.executable, "-m", "edge.cli", "device", "adapt", "--state", str(self.state_dir),
               "--data", str(self.cfg.data), "--strategy", self.cfg.strategy, "--backend", self.backend,
               "--sysfs-root", str(self.sysfs_root)]
        root = getattr(self.device.bundle, "root", None)
        if root is not None and Path(root).is_dir():
            cmd += ["--bundle", str(root)]
        if self.trusted_keys is not None:
            cmd += ["--pubkey", str(self.trusted_keys)]
        return cmd

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
            self.status["state"] = "running"
            if self._model_status()["readapt_pending"]:  # deferred, paused or failed: asked again soon
                self._next_adapt = min(self._next_adapt, now + READAPT_RETRY_S)
            self._write_status()
            self._restart = True  # the adapted model (when the run committed), and replay back on
            return
        if self.cfg.data is None or not self.cfg.adapt or now < self._next_adapt:
            return
        self._next_adapt = now + self.cfg.adapt_every_s
        self._restart = True  # detection stops writing the replay buffer while the run owns it
        # Ctrl-C reaches the whole foreground group: the run ignores it, and the agent ends it on the way out
        self.child = subprocess.Popen(self._adapt_cmd(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      preexec_fn=_nice_child)
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
