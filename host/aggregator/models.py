"""Model versions: parameters on disk, a signed bundle per version, and the held-out check.

Every aggregate that passes the held-out check becomes version v+1: its
trainable tensors go into ``head.npz`` inside a bundle that is the base
bundle's files plus that file, with a manifest naming it (``trainable.file``),
signed with the aggregator's Ed25519 key and zipped for download. An
aggregate that loses more than ``tolerance`` accuracy on the held-out
embeddings (voices no device trains on) is recorded as ``rejected`` and the
current version stays: the automatic rollback. Files are written (atomically)
before the database names them, so a crash leaves at worst an unnamed file.

    reg = ModelRegistry(state_dir, store, signing_key)
    v = reg.init_from_bundle("models/kws-dscnn-s", params)
    ok, acc = reg.check(new_params)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from edge.errors import EdgelearnError
from edge.fl.model import HEAD_FILE, head_logits
from edge.atomic import atomic_path, atomic_write, npz_bytes

HEAD_ONNX = "head.onnx"
_BASE_EXCLUDE = ("manifest.json", "manifest.sig", "manifest.mac", HEAD_FILE, HEAD_ONNX)


def params_bytes(params: dict) -> bytes:
    return npz_bytes({k: np.asarray(v, np.float32) for k, v in params.items()})


def load_params(path) -> dict:
    with np.load(path) as z:
        return {k: z[k].astype(np.float32) for k in z.files}


class ModelRegistry:
    """Versions of the federated tail under ``state_dir``, recorded in the ``models`` table."""

    def __init__(self, state_dir, store, signing_key=None):
        self.dir = Path(state_dir)
        self.store = store
        self.signing_key = signing_key
        (self.dir / "models").mkdir(parents=True, exist_ok=True)
        (self.dir / "bundles").mkdir(parents=True, exist_ok=True)
        self.heldout = None
        h = self.dir / "heldout.npz"
        if h.exists():
            with np.load(h) as z:
                self.heldout = (z["X"].astype(np.float32), z["y"].astype(np.int64))

    # --- versions ---------------------------------------------------------
    @property
    def current(self) -> int:
        v = self.store.get_meta("current_version")
        if v is None:
            raise EdgelearnError(f"{self.dir}: no model yet", fix="run `edgelearn aggregator init` first")
        return int(v)

    def params(self, version: int | None = None) -> dict:
        v = self.current if version is None else version
        return load_params(self.dir / "models" / f"v{v}.npz")

    def strategy_state(self, version: int) -> dict:
        p = self.dir / "models" / f"v{version}.state.npz"
        return load_params(p) if p.exists() else {}

    def zip_path(self, version: int) -> Path:
        return self.dir / "bundles" / f"v{version}.zip"

    def accuracy(self, params: dict) -> float | None:
        if self.heldout is None:
            return None
        X, y = self.heldout
        return float(np.mean(np.argmax(head_logits(params, X), axis=1) == y))

    def check(self, new: dict, tolerance: float) -> tuple[bool, float | None, float | None]:
        """(publish?, new accuracy, current accuracy) on the held-out set; always True without one."""
        if self.heldout is None:
            return True, None, None
        cur = self.accuracy(self.params())
        acc = self.accuracy(new)
        return acc >= cur - tolerance, acc, cur

    # --- building ---------------------------------------------------------
    def _build(self, version: int, params: dict, note: dict) -> None:
        from host.bundle import build_bundle, zip_bundle

        if self.signing_key is None:
            raise EdgelearnError("the aggregator has no signing key", fix="pass --signing-key to `edgelearn aggregator`")
        base = Path(self.store.get_meta("base_bundle"))
        manifest = json.loads((base / "manifest.json").read_text())
        head = self.dir / "models" / f"v{version}.npz"
        files = {n: base / n for n in manifest["files"] if n not in _BASE_EXCLUDE}
        files[HEAD_FILE] = head
        m = {k: v for k, v in manifest.items() if k not in ("files", "created_utc", "format", "format_version")}
        m["version"] = version
        if {"proj.w", "classifier.w"} <= set(params):
            # The same tail as ONNX, so the serving shim can answer for this version (split
            # endpoint). MCU models (proto/bias) have no such tail and skip it.
            from host.aggregator.head_onnx import PARTITION, write_head_onnx

            onnx_path = self.dir / "models" / f"v{version}.onnx"
            with atomic_path(onnx_path, mode=None) as tmp:  # public, as published versions are
                part = write_head_onnx(params, tmp)
            files[HEAD_ONNX] = onnx_path
            part["file"] = HEAD_ONNX
            m["partitions"] = [p for p in manifest.get("partitions", []) if p.get("name") != PARTITION] + [part]
        m["trainable"] = {**manifest.get("trainable", {}), "strategy": "federated-head", "file": HEAD_FILE,
                          "tensors": sorted(params)}
        m["extra"] = {**manifest.get("extra", {}), "fl": note}
        out = self.dir / "bundles" / f"v{version}"
        build_bundle(out, files, m, self.signing_key)
        zip_bundle(out, self.zip_path(version))

    def _write(self, version: int, params: dict, state: dict | None) -> None:
        atomic_write(self.dir / "models" / f"v{version}.npz", params_bytes(params))
        if state:
            atomic_write(self.dir / "models" / f"v{version}.state.npz", params_bytes(state))

    def init_from_bundle(self, bundle_dir, params: dict) -> int:
        """Version base+1 = the base bundle with its head as ``head.npz`` (the federated starting point)."""
        base = Path(bundle_dir).resolve()
        m = json.loads((base / "manifest.json").read_text())
        version = int(m["version"]) + 1
        with self.store.tx():
            self.store.set_meta("base_bundle", str(base))
            self.store.set_meta("model_id", m["model_id"])
        self._write(version, params, None)
        self._build(version, params, {"parent": m["version"], "round": None})
        with self.store.tx() as c:
            c.execute("INSERT OR REPLACE INTO models(version, parent, round_id, status, accuracy, path, created) "
                      "VALUES(?,?,?,?,?,?,?)", (version, m["version"], None, "published",
                                                self.accuracy(params), str(self.zip_path(version)), time.time()))
            self.store.set_meta("current_version", version)
        return version

    def publish(self, params: dict, round_id: int, accuracy, epsilon, state: dict | None) -> int:
        """Write files and bundle for version current+1; the caller commits the DB change (same tx)."""
        parent = self.current
        version = parent + 1
        self._write(version, params, state)
        self._build(version, params, {"parent": parent, "round": round_id, "heldout_accuracy": accuracy,
                                      "epsilon": epsilon})
        c = self.store.db
        c.execute("INSERT OR REPLACE INTO models(version, parent, round_id, status, accuracy, epsilon, path, created) "
                  "VALUES(?,?,?,?,?,?,?,?)", (version, parent, round_id, "published", accuracy, epsilon,
                                              str(self.zip_path(version)), time.time()))
        self.store.set_meta("current_version", version)
        return version
