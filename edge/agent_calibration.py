"""The agent's detector, built again at every switch (``Agent._detector``), and ``--sensitivity R``
across those switches.

A calibration (``device calibrate``, ``operating.json``) holds for the model version and adapted
context it was measured on (``edge.operating.load_points``). The agent changes both on its own: its
adaptation commits a new context version, a federated version is installed. Rebuilding the detector
with the sensitivity then used to fail (the agent exited, and every restart failed the same way).
Now, when the calibration does not match what detection runs, the agent detects at the model's own
default thresholds (``threshold=None``: the version's operating point, else 0.7), says so once on
stderr and in ``agent.json`` (``calibration``), and uses the calibration again as soon as it
matches: ``device calibrate`` run again rewrites ``operating.json``, which the state watch sees
(``edge.wyoming_models.STATE_FILES``). At start a stale calibration is the same; a missing or
damaged one, or a sensitivity it has no point for, is still an error there (the user's setup is
wrong, and nothing the agent does will change it), and only after the start falls back too.
``device detect --sensitivity`` (one run, nothing changes under it) still refuses a stale one.

Split from agent.py to keep each file about one thing; ``Agent`` inherits ``Calibration``.
"""

from __future__ import annotations

import sys

from edge.errors import EdgelearnError
from edge.wyoming_models import state_signature


class Calibration:
    """Mixin: needs ``device``, ``cfg``, ``child``, ``state_dir``, ``status`` and ``_write_status``
    from ``Agent``; ``_det`` is None until the first detector is built."""

    def _detector(self):
        # the state files the detector reads (enrolled keywords, adapt pointer, operating points),
        # taken before it reads them: a change after this is seen by ``_watch_state``
        self._state_sig = state_signature(self.device)
        # agent.json's ``model`` (``device status``'s agent.model) is what this detector runs: a
        # rebuild after another process's `device adapt` / `use` / `rollback` (the state watch) used
        # to keep the model of the start ("context": None while detection ran context default v1)
        before = self.status.get("model")
        if self._model_status() != before and self._det is not None:
            self._write_status()
        sensitivity = self._usable_sensitivity()
        build = lambda s: self.device.detector(  # noqa: E731
            keywords=self.cfg.keywords, threshold=self.cfg.threshold, sensitivity=s, confirm=self.cfg.confirm,
            replay=self.child is None, asr=self.cfg.asr)
        if sensitivity is None:
            return build(None)
        from edge.operating import StaleCalibration

        try:
            return build(sensitivity)
        except StaleCalibration as e:  # changed between the check and the build (a commit just then)
            self._calibration_off(e)
            return build(None)

    def _usable_sensitivity(self):
        """``cfg.sensitivity`` when the state's calibration holds for the model detection runs now,
        else None (the defaults; said once). At start only a stale calibration falls back."""
        r = self.cfg.sensitivity
        if r is None:
            return None
        from edge.device_models import calibrated_for
        from edge.operating import StaleCalibration, load_points

        try:
            load_points(self.state_dir, calibrated_for(self.device.bundle, self.state_dir)).thresholds(r)
        except StaleCalibration as e:
            self._calibration_off(e)
            return None
        except EdgelearnError as e:
            if self._det is None:  # at start: the setup is wrong (never calibrated, damaged, no such point)
                raise
            self._calibration_off(e)
            return None
        self._calibration_on()
        return r

    def _calibration_off(self, e: EdgelearnError) -> None:
        cal = self.status.get("calibration") or {}
        if cal.get("in_use") is False and cal.get("reason") == e.problem:
            return  # said already
        note = (f"--sensitivity {self.cfg.sensitivity:g} is not used: {e.problem}; detecting at the model's "
                f"default thresholds until it matches again ({e.fix or 'run `edgelearn device calibrate` again'})")
        print(f"device run: {note}", file=sys.stderr, flush=True)
        self.status["calibration"] = {"sensitivity": self.cfg.sensitivity, "in_use": False, "reason": e.problem,
                                      "note": note}
        self._write_status()

    def _calibration_on(self) -> None:
        cal = self.status.get("calibration")
        if cal is not None and cal.get("in_use") is False:
            print(f"device run: the calibration matches the model again: detecting at --sensitivity "
                  f"{self.cfg.sensitivity:g}", file=sys.stderr, flush=True)
            self.status["calibration"] = {"sensitivity": self.cfg.sensitivity, "in_use": True}
            self._write_status()
        elif cal is None:
            self.status["calibration"] = {"sensitivity": self.cfg.sensitivity, "in_use": True}
