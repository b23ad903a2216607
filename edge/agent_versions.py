"""Which federated version the agent's detection runs: the deep health check a new version passes
before detection uses it (``health_check``), the switch to it or its rollback, and on a start the
version the device opens on (the one the agent ran or carried its keywords to; never a rejected one).

Split from agent.py to keep each file about one thing; ``Agent`` inherits ``Versions``, and
``edge.agent`` imports ``health_check`` and the constants from here.

    >>> health_check(new_bundle, clips, baseline=0.9)   # {"ok": True, "accuracy": 0.92, "reason": "labelled clips"}
"""

from __future__ import annotations

import json
import sys
import time

from edge.agent_audio import SAMPLE_RATE
from edge.device import Device
from edge.errors import EdgelearnError

FL_DIR = "fl"
HEALTH_TOLERANCE = 0.05  # a new version may name at most this fraction fewer labelled clips right


def health_check(bundle, clips=None, baseline: float | None = None, backend: str = "auto",
                 state_dir=None, adapted_from=None) -> dict:
    """The deep check a new version passes before detection uses it: its keyword model (with a
    federated version's head, as detection scores) loads, gives
    finite posteriors that sum to 1 on silence, noise and (when given) the device's labelled clips
    ``(windows, labels)``, and names at least ``baseline - HEALTH_TOLERANCE`` of those clips right.
    With ``state_dir``, the model is the one detection runs there: the active adapted context on
    ``bundle`` (``edge.device.detection_models``; ``adapted_from``: the version the contexts are
    bound to now, read as they would run on ``bundle`` once carried, nothing moved).
    Returns {"ok", "accuracy", "reason"}."""
    import numpy as np

    from edge.device import base_models, detection_models

    try:  # what detection scores with (a federated head and an adapted context included)
        km, head = (base_models(bundle, backend) if state_dir is None
                    else detection_models(bundle, state_dir, backend, adapted_from=adapted_from))
        probe = np.stack([np.zeros(SAMPLE_RATE, np.int16),
                          np.random.default_rng(0).integers(-3000, 3000, SAMPLE_RATE).astype(np.int16)])
        windows = probe if clips is None else np.concatenate([probe, clips[0]])
        emb, probs = km.infer(km.features(windows))
        if head is not None:
            probs = head.probs(emb)
    except Exception as e:  # noqa: BLE001 - whatever breaks a model is a failed check, reported in one line
        return {"ok": False, "accuracy": None, "reason": f"the model does not run ({e.__class__.__name__}: {e})"}
    if probs.shape != (len(windows), len(km.labels)) or not np.all(np.isfinite(probs)) \
            or not np.allclose(probs.sum(axis=1), 1.0, atol=0.1):  # int8 softmax: 1/256 a class
        return {"ok": False, "accuracy": None, "reason": "posteriors are not finite probabilities over the labels"}
    if clips is None:
        return {"ok": True, "accuracy": None, "reason": "smoke inputs only (no labelled clips)"}
    acc = float(np.mean(np.argmax(probs[2:], axis=1) == clips[1]))
    if baseline is not None and acc < baseline - HEALTH_TOLERANCE:
        return {"ok": False, "accuracy": acc,
                "reason": f"names {acc:.0%} of the labelled clips right, the running version {baseline:.0%}"}
    return {"ok": True, "accuracy": acc, "reason": "labelled clips"}


class Versions:
    """Mixin: needs ``state_dir``, ``cfg``, ``backend``, ``sysfs_root``, ``trusted_keys``, ``base_bundle``,
    ``status``, ``device``, ``wyoming``, ``clock``, ``_clips``, ``_next_adapt``, ``_restart``,
    ``labelled_clips`` and ``_model_status`` from ``Agent``, ``_stop_child`` from ``Adaptation``."""

    def _fl_store(self):
        from edge.store import BundleStore

        return BundleStore(self.state_dir / FL_DIR / "store", self._store_keys())

    def _store_keys(self):
        """What a federated version must be signed by: the keys given (else the default ones) and the
        shipped release keys, as every device command trusts (``edge.kws.resolve_trusted_keys``)."""
        from edge.kws import resolve_trusted_keys

        return resolve_trusted_keys(self.trusted_keys)

    def _open_device(self) -> tuple[Device, int | None]:
        """(the device on the federated version it ran last, else the given or shipped bundle; the
        installed version to health-check before detection uses it, or None).

        The federated client installs a version before the agent checks it, so after a kill -9 the
        store's current version may never have passed the check: it is used only when it is the one
        the agent ran (``fl_version`` in agent.json) or the enrolled keywords were already carried
        to it (the check passed and the switch got that far); otherwise the device opens on the
        version it ran and the new one is checked now. A rejected version is never used."""
        bundle, unchecked = self.base_bundle, None
        if self.cfg.aggregator:
            store = self._fl_store()
            ptr = store.pointer()
            cur, prev = (self._installed(store, ptr[k]) for k in ("current", "previous"))
            rejected, ran = self.status["rejected"], self.status["fl_version"]
            if cur is not None and cur.version not in rejected:
                if cur.version == ran or self._carried_to(cur):
                    bundle, ran = cur, cur.version
                else:
                    unchecked = cur.version
            if bundle is self.base_bundle and prev is not None and prev.version == ran and ran not in rejected:
                bundle = prev
                if cur is not None and cur.version in rejected:  # as _drop_rejected: keep the running one
                    try:
                        store.rollback()
                    except EdgelearnError:
                        pass
            if bundle is self.base_bundle:
                ran = None
                if bundle is None:  # decided here: the shipped model, not Device's pick of the installed ones
                    from edge.device_models import open_bundle

                    bundle = open_bundle(None, self.trusted_keys)
            self.status["fl_version"] = ran
        # without an aggregator, no bundle given: Device opens the version an agent installed and ran
        # here before (edge.device_models.installed_version), which the state's keywords are bound to
        dev = Device(self.state_dir, bundle, backend=self.backend, trusted_keys=self.trusted_keys,
                     sysfs_root=self.sysfs_root)
        self.status["version"] = f"{dev.bundle.model_id} v{dev.bundle.version}"
        return dev, unchecked

    @staticmethod
    def _installed(store, name):
        """The verified bundle ``name`` of the store, or None (none, or damaged: not usable)."""
        if name is None:
            return None
        from edge.bundle import load_bundle

        try:
            return load_bundle(store.bundles_dir / name, trusted_keys=store.trusted_keys)
        except EdgelearnError:
            return None

    def _carried_to(self, bundle) -> bool:
        """Whether the enrolled keywords are bound to ``bundle`` already (``Device.carry_to`` ran)."""
        from edge.enroll import DeviceState

        try:
            return bool(DeviceState.open(self.state_dir, bundle).keywords)
        except EdgelearnError:
            return False

    def _drop_rejected(self, version: int) -> None:
        """The store's current version is one the health check rejected (the client installs what a
        round trains): make the running version current again, so the next install keeps it."""
        store = self._fl_store()
        ptr = store.pointer()
        b = self.device.bundle
        if ptr["previous"] == f"{b.model_id}-v{b.version}" and ptr["current"] == f"{b.model_id}-v{version}":
            try:
                store.rollback()
            except EdgelearnError:
                pass

    def _switch_version(self, version: int) -> None:
        """A newly installed federated version: deep health check, then detection uses it; rolled
        back when it fails (the running version stays)."""
        store = self._fl_store()
        new = store.current()
        clips = self.labelled_clips()
        # the path detection runs (an adapted context, rebased onto the new head): before 2026-12-03 the
        # two versions' base models were compared, so an adaptation the new version breaks went unseen
        run = self.device.bundle
        base = health_check(run, clips, backend=self.backend, state_dir=self.state_dir)["accuracy"] \
            if clips is not None else None
        h = health_check(new, clips, baseline=base, backend=self.backend, state_dir=self.state_dir, adapted_from=run)
        if h["ok"]:
            # a run in progress trains against the running version, and its commit would bind the adapt
            # pointer back to it: stopped first (its checkpoint is not resumed on another head)
            self._stop_child(f"version {version} arrived")
            try:  # the enrolled keywords and adapted tail move with it, or the version is not used
                self.device.carry_to(new)
            except EdgelearnError as e:
                h = {"ok": False, "accuracy": h["accuracy"], "reason": str(e)}
        self.status["last_health"] = {"time": time.time(), "version": version, **h}
        if not h["ok"]:
            self.device.unbind_adapted(new)  # a carry_to killed half-way may have moved the adapt pointer
            try:
                store.rollback()
            except EdgelearnError:  # the first federated version: the running (shipped) bundle stays
                pass
            self.status["rollbacks"] += 1
            self.status["rejected"] = sorted(set(self.status.get("rejected", [])) | {int(version)})
            print(json.dumps({"warning": f"version {version} failed its health check ({h['reason']}); rolled back"}),
                  file=sys.stderr, flush=True)
            return
        self.device = Device(self.state_dir, new, backend=self.backend, trusted_keys=self.trusted_keys,
                             sysfs_root=self.sysfs_root)
        self._clips = None
        if self.wyoming is not None:
            self.wyoming.device = self.device
        self.status["version"] = f"{new.model_id} v{new.version}"
        self.status["fl_version"] = new.version
        if self._model_status()["readapt_pending"]:  # adapted on another head: again on this one, at once
            self._next_adapt = self.clock()
        self._restart = True
