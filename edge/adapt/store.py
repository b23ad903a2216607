"""Adapted tail parameters on disk, kept apart from the bundle: per context, versioned, rollback.

Layout under ``<state>/adapt/``::

    <context>/v<N>.npz   one adapted delta (only the tensors that differ from the base)
    active.json          {"active": context, "model": [id, version],
                          "contexts": {context: {"current": N, "previous": M|null}}}
    checkpoint.npz       a paused training run (delta + optimiser state), if any

Every file is written with ``atomic_write`` and the pointer flips last, so a
power cut leaves the previous adapted state (or the bare base) loadable.

    >>> st = AdaptStore("state", bundle)
    >>> st.save("kitchen", trainer.tail.merged(), {"strategy": "lora"})
    >>> delta = st.load()          # the active context's current delta
    >>> st.rollback("kitchen")
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np

from edge.errors import EdgelearnError
from edge.store import atomic_write

_CONTEXT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")


def npz_bytes(arrays: dict) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def read_npz(path: Path) -> dict:
    try:
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError) as e:
        raise EdgelearnError(f"{path} is unreadable ({e})", fix="roll back or delete it") from None


class AdaptStore:
    def __init__(self, state_dir, bundle):
        self.root = Path(state_dir) / "adapt"
        self.model = [bundle.model_id, bundle.version]
        self.meta = self._read_meta()

    def _read_meta(self) -> dict:
        path = self.root / "active.json"
        if not path.exists():
            return {"active": None, "model": self.model, "contexts": {}}
        try:
            meta = json.loads(path.read_text())
        except ValueError as e:
            raise EdgelearnError(f"{path} is corrupt ({e})", fix="delete it to return to the base model") from None
        if meta.get("model") != self.model:
            raise EdgelearnError(f"adapted parameters in {self.root} were trained on bundle "
                                 f"{meta.get('model')}, not {self.model}",
                                 fix="use the matching bundle or delete the adapt/ directory")
        return meta

    def _write_meta(self) -> None:
        atomic_write(self.root / "active.json", json.dumps(self.meta, indent=1).encode())

    @staticmethod
    def check_context(context: str) -> str:
        if not _CONTEXT.match(context or ""):
            raise EdgelearnError(f"context name {context!r} is not usable",
                                 fix="use 1-32 letters, digits, _ or -")
        return context

    def save(self, context: str, delta: dict, info: dict | None = None) -> int:
        self.check_context(context)
        d = self.root / context
        d.mkdir(parents=True, exist_ok=True)
        entry = self.meta["contexts"].get(context, {"current": None, "previous": None})
        version = max([int(p.stem[1:]) for p in d.glob("v*.npz")] + [0]) + 1
        arrays = dict(delta)
        arrays["__info__"] = np.frombuffer(json.dumps(info or {}).encode(), np.uint8)
        atomic_write(d / f"v{version}.npz", npz_bytes(arrays))
        self.meta["contexts"][context] = {"current": version, "previous": entry["current"]}
        self.meta["active"] = context
        self._write_meta()
        return version

    def load(self, context: str | None = None) -> dict:
        context = context or self.meta.get("active")
        if context is None:
            return {}
        entry = self.meta["contexts"].get(context)
        if entry is None or entry["current"] is None:
            return {}
        arrays = read_npz(self.root / context / f"v{entry['current']}.npz")
        arrays.pop("__info__", None)
        return arrays

    def use(self, context: str | None) -> None:
        if context is not None and context not in self.meta["contexts"]:
            raise EdgelearnError(f"no adapted context {context!r}",
                                 fix=f"choose one of {sorted(self.meta['contexts'])} or adapt it first")
        self.meta["active"] = context
        self._write_meta()

    def rollback(self, context: str) -> int | None:
        entry = self.meta["contexts"].get(context)
        if entry is None:
            raise EdgelearnError(f"no adapted context {context!r}", fix="nothing to roll back")
        self.meta["contexts"][context] = {"current": entry["previous"], "previous": None}
        self._write_meta()
        return entry["previous"]

    def save_checkpoint(self, state: dict, info: dict) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        arrays = dict(state)
        arrays["__info__"] = np.frombuffer(json.dumps(info).encode(), np.uint8)
        atomic_write(self.root / "checkpoint.npz", npz_bytes(arrays))

    def load_checkpoint(self):
        path = self.root / "checkpoint.npz"
        if not path.exists():
            return None, None
        arrays = read_npz(path)
        info = json.loads(bytes(arrays.pop("__info__")).decode())
        return arrays, info

    def clear_checkpoint(self) -> None:
        (self.root / "checkpoint.npz").unlink(missing_ok=True)
