"""Adapted tail parameters on disk, kept apart from the bundle: per context, versioned, rollback.

Layout under ``<state>/adapt/``::

    <context>/v<N>.npz   one adapted delta (only the tensors that differ from the base)
    active.json          {"active": context, "model": [id, version],
                          "contexts": {context: {"current": N, "previous": M|null}},
                          "pending": {...}  only between a commit and its roll-forward}
    checkpoint.npz       a paused training run (delta + optimiser state), if any
    pending/             files staged for a commit (a new version, the replay buffer)
    .lock                flock'd while a commit or a recovery runs (one writer at a time)

A run commits by one atomic write of ``active.json``. Before it, the new version and
every other file of the run (``save(stage=...)``: the replay buffer) are written
(``edge.atomic.atomic_write``) to ``pending/``; the pointer then flips and names them and the
run's energy charge (``pending``); after it they are renamed into place, the run's checkpoint is
removed and ``pending`` dropped. ``recover()`` (the start of every writing command) finishes a
commit a crash cut short (roll forward: renames, checkpoint, the charge, via the scheduler's
idempotent ``charge``) and removes what an uncommitted run left (staged files nothing names,
the temp files of interrupted atomic writes). So a crash at any point leaves either the state
before the run or the state after it, never a mix: no orphan version, no stale checkpoint on top
of a saved version, energy charged exactly once.

Old versions are pruned after each commit (``prune``, under the same lock: edge/adapt/prune.py).

What a version may hold, and its bytes, is ``edge.adapt.delta``. Every file is read by a validated loader: a damaged pointer or version is one ``EdgelearnError``
naming the file (nothing is deleted); a damaged checkpoint is a cache of computation: it is
reported once and removed (the run starts over).

    >>> st = AdaptStore("state", bundle)
    >>> st.save("kitchen", trainer.tail.merged(), {"strategy": "lora"})
    >>> delta = st.load()          # the active context's current delta
    >>> st.rollback("kitchen")
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np

from edge import atomic
from edge.adapt.delta import READ_ERRORS, check_delta, delta_shapes, npz_arrays, npz_info
from edge.atomic import atomic_write, npz_bytes
from edge.adapt.prune import KEEP_VERSIONS, check_keep  # noqa: F401 (KEEP_VERSIONS: importable from here)
from edge.errors import EdgelearnError

log = logging.getLogger("edgelearn.adapt")
_CONTEXT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
_VERSION = re.compile(r"^v([1-9][0-9]{0,8})\.npz$")
META, CHECKPOINT, PENDING = "active.json", "checkpoint.npz", "pending"
def _version_number(v, what: str):
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v < 10 ** 9:
        raise ValueError(f"{what} is {v!r}, not a version number")
    return v


def check_meta(meta, model) -> dict:
    """The pointer document, checked field by field; raises ValueError saying what is wrong."""
    if not isinstance(meta, dict):
        raise ValueError(f"it holds {type(meta).__name__}, not an object")
    if not isinstance(meta.get("contexts"), dict):
        raise ValueError("'contexts' is not an object")
    for name, entry in meta["contexts"].items():
        if not _CONTEXT.match(name):
            raise ValueError(f"context name {name!r} is not usable")
        if not isinstance(entry, dict):
            raise ValueError(f"context {name!r} is {entry!r}, not an object")
        _version_number(entry.get("current"), f"context {name!r} current")
        _version_number(entry.get("previous"), f"context {name!r} previous")
    active = meta.get("active")
    if active is not None and (not isinstance(active, str) or active not in meta["contexts"]):
        raise ValueError(f"the active context {active!r} is not one of its contexts")
    m = meta.get("model")
    if not (isinstance(m, list) and len(m) == 2 and isinstance(m[0], str)
            and isinstance(m[1], int) and not isinstance(m[1], bool)):
        raise ValueError(f"'model' is {m!r}, not [model_id, version]")
    pending = meta.get("pending")
    if pending is not None:
        if not isinstance(pending, dict) or not isinstance(pending.get("moves", []), list):
            raise ValueError("'pending' is not a commit record")
        for mv in pending.get("moves", []):
            if not (isinstance(mv, list) and len(mv) == 2 and all(isinstance(p, str) for p in mv)
                    and all(_safe_rel(p) for p in mv)):
                raise ValueError(f"pending move {mv!r} is not a pair of state-relative paths")
        charges = pending.get("charges", [])
        if not isinstance(charges, list):
            raise ValueError("pending 'charges' is not a list")
        for c in charges:
            _check_charge(c)
    return meta


def _safe_rel(p: str) -> bool:
    parts = Path(p).parts
    return bool(parts) and not Path(p).is_absolute() and ".." not in parts


def _check_charge(c):
    if c is None:
        return None
    if not (isinstance(c, dict) and all(isinstance(c.get(k), int) and not isinstance(c.get(k), bool)
                                        and c[k] >= 0 for k in ("seq", "steps"))):
        raise ValueError(f"charge {c!r} is not {{seq, steps}}")
    return c


class AdaptStore:
    """``keep``: how many of each context's newest versions a commit leaves besides its current and
    previous ones (``prune``; None: ``KEEP_VERSIONS``)."""

    def __init__(self, state_dir, bundle, keep: int | None = None):
        self.state = Path(state_dir)
        self.root = self.state / "adapt"
        self.bundle = bundle
        self.model = [bundle.model_id, bundle.version]
        self.keep = check_keep(keep)
        self.meta_path = self.root / META
        self.meta = self._read_meta()
        self._shapes = False  # computed on the first load

    # -- the pointer ---------------------------------------------------------------------------
    def _read_meta(self) -> dict:
        path = self.meta_path
        fix = (f"restore it from a backup, or delete it to run the base model (the adapted versions "
               f"under {self.root} are kept)")
        try:
            if not path.exists():
                return {"active": None, "model": self.model, "contexts": {}}
            meta = json.loads(path.read_bytes())
            check_meta(meta, self.model)
        except OSError as e:
            raise EdgelearnError(f"{path} is unreadable ({e.strerror or e})", fix=fix) from None
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise EdgelearnError(f"{path} is not a valid adapt pointer ({e})", fix=fix) from None
        if meta["model"] != self.model:
            raise EdgelearnError(f"adapted parameters in {self.root} were trained on bundle "
                                 f"{meta.get('model')}, not {self.model} (says {path})",
                                 fix="use the matching bundle or delete the adapt/ directory")
        return meta

    def _write_meta(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write(self.meta_path, json.dumps(self.meta, indent=1).encode())

    def _locked(self):
        """The adapt store's writer lock, ``adapt/.lock`` (``edge.atomic.locked``)."""
        return atomic.locked(self.root)

    @staticmethod
    def check_context(context: str) -> str:
        if not isinstance(context, str) or not _CONTEXT.match(context or ""):
            raise EdgelearnError(f"context name {context!r} is not usable",
                                 fix="use 1-32 letters, digits, _ or -")
        return context

    def current(self, context: str | None = None):
        """The current version number of ``context`` (the active one by default), or None."""
        context = context or self.meta.get("active")
        return (self.meta["contexts"].get(context) or {}).get("current") if context else None

    def _next_version(self, context: str) -> int:
        entry = self.meta["contexts"].get(context) or {}
        on_disk = [int(m[1]) for p in (self.root / context).glob("v*.npz") if (m := _VERSION.match(p.name))]
        return max(on_disk + [entry.get("current") or 0, entry.get("previous") or 0]) + 1

    def _version_path(self, context: str, version: int) -> Path:
        """Where version ``version`` of ``context`` is: in place, or still staged by a commit that a
        crash stopped before its roll-forward."""
        final = self.root / context / f"v{version}.npz"
        for staged, target in (self.meta.get("pending") or {}).get("moves", []):
            if self.state / target == final and (self.state / staged).exists():
                return self.state / staged
        return final

    # -- commit ---------------------------------------------------------------------------------
    def save(self, context: str, delta: dict, info: dict | None = None, stage: dict | None = None,
             charge: dict | None = None) -> int:
        """Make ``delta`` the context's new current version, in one commit with ``stage``
        ({path relative to the state directory: bytes}, e.g. the replay buffer) and ``charge``
        ({"seq", "steps"}: energy the caller's scheduler books with ``recover``); returns N."""
        self.check_context(context)
        check_delta(dict(delta), None)
        with self._locked():
            self._recover_files()
            version = self._next_version(context)
            pend = self.root / PENDING
            pend.mkdir(parents=True, exist_ok=True)
            arrays = dict(delta)
            arrays["__info__"] = np.frombuffer(json.dumps(info or {}).encode(), np.uint8)
            moves = [(pend / f"{context}.v{version}.npz", self.root / context / f"v{version}.npz")]
            for rel, data in (stage or {}).items():
                if not _safe_rel(rel):
                    raise EdgelearnError(f"cannot stage {rel!r}", fix="give a path inside the state directory")
                moves.append((pend / Path(rel).name, self.state / rel))
            atomic_write(moves[0][0], npz_bytes(arrays))
            for (staged, _), data in zip(moves[1:], (stage or {}).values()):
                atomic_write(staged, data)
            entry = self.meta["contexts"].get(context) or {"current": None, "previous": None}
            self.meta["contexts"][context] = {"current": version, "previous": entry.get("current")}
            self.meta["active"] = context
            charges = (self.meta.get("pending") or {}).get("charges", []) + ([_check_charge(charge)] if charge else [])
            self.meta["pending"] = {"moves": [[str(s.relative_to(self.state)), str(t.relative_to(self.state))]
                                              for s, t in moves], "charges": charges}
            self._write_meta()  # the commit
            self._roll_forward()
            if not charges:
                self.meta.pop("pending")
                self._write_meta()
            self.prune()
        return version

    # -- pruning (edge/adapt/prune.py) -------------------------------------------------------------
    def versions(self, context: str | None = None) -> list[int]:
        """The version numbers of ``context`` (the active one by default) on disk, oldest first."""
        from edge.adapt.prune import versions

        return versions(self, context)

    def prune(self, keep: int | None = None) -> list[Path]:
        """Delete old versions (``edge.adapt.prune.prune``; ``keep``: None, the store's ``keep``)."""
        from edge.adapt.prune import prune

        return prune(self, keep)

    def _roll_forward(self) -> None:
        """The commit's renames and its checkpoint's removal (idempotent: a crash may repeat it)."""
        pending = self.meta.get("pending")
        if pending is None:
            return
        for staged, target in pending.get("moves", []):
            src, dst = self.state / staged, self.state / target
            if src.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                atomic.replace(src, dst)
        _, ck = self.load_checkpoint()
        ctx = (ck or {}).get("context")
        if isinstance(ctx, str) and ctx in self.meta["contexts"] and ck.get("base") != self.current(ctx):
            atomic.remove(self.root / CHECKPOINT)  # the run just committed (its context moved on)

    def _recover_files(self) -> None:
        """Roll a committed run forward; remove what uncommitted ones and interrupted writes left."""
        self._roll_forward()
        pend = self.root / PENDING
        named = {self.state / s for s, _ in (self.meta.get("pending") or {}).get("moves", [])}
        if pend.is_dir():
            for p in pend.iterdir():
                if p.is_file() and p not in named:  # staged by a run that never committed
                    atomic.remove(p)
        for d in [self.state, self.root, pend] + ([p for p in self.root.iterdir() if p.is_dir()]
                                                  if self.root.is_dir() else []):
            for p in atomic.sweep_temp(d):
                log.info("removed %s (an interrupted write)", p)

    def pending_charges(self) -> list[dict]:
        """Energy charges recorded beside results (the last commit's, a paused run's), by sequence."""
        out = list((self.meta.get("pending") or {}).get("charges", []))
        _, ck_info = self.load_checkpoint()
        try:
            c = _check_charge((ck_info or {}).get("charge"))
        except ValueError:
            c = None
        if c:
            out.append(c)
        return sorted(out, key=lambda c: c["seq"])

    def recover(self, charge=None) -> None:
        """Finish or undo what a crash interrupted (see the module docstring). ``charge(seq, steps)``:
        the scheduler's idempotent charge, for the energy a run recorded beside its result."""
        if not self.root.exists():
            if self.state.is_dir():
                atomic.sweep_temp(self.state)
            return
        with self._locked():
            self._recover_files()
            if charge is not None:
                for c in self.pending_charges():
                    charge(c["seq"], c["steps"])
            if "pending" in self.meta and (charge is not None or not self.meta["pending"].get("charges")):
                self.meta.pop("pending")  # what it recorded is done
                self._write_meta()

    # -- reading --------------------------------------------------------------------------------
    def load(self, context: str | None = None) -> dict:
        return self.load_with_info(context)[0]

    def load_with_info(self, context: str | None = None) -> tuple[dict, dict]:
        """(the context's current delta, the ``__info__`` it was committed with: the run's record,
        ``trained_on`` among it); ({}, {}) when there is none. The active context by default."""
        context = context or self.meta.get("active")
        if context is None:
            return {}, {}
        entry = self.meta["contexts"].get(context)
        if entry is None or entry.get("current") is None:
            return {}, {}
        path = self._version_path(context, entry["current"])
        fix = (f"roll back to the previous version (`edgelearn device adapt --rollback --context {context}`), "
               f"or restore the file from a backup")
        if not path.exists():
            raise EdgelearnError(f"{path} is missing, but {self.meta_path} names it as context {context!r}'s "
                                 f"current version", fix=fix)
        if self._shapes is False:
            self._shapes = delta_shapes(self.bundle)
        try:
            arrays = npz_arrays(path)
            info = npz_info(arrays)
            check_delta(arrays, self._shapes)
        except READ_ERRORS as e:
            raise EdgelearnError(f"adapted version {path} is damaged ({e})", fix=fix) from None
        return arrays, info

    def load_carried(self, context: str | None = None, onto=None) -> tuple[dict, dict]:
        """(the context's current delta as this store's bundle runs it, its info): a conv-tail delta
        trained against another head than the bundle's tail ends in (a federated version it was
        carried to, ``Device.carry_to``) is rebased onto it (``edge.adapt.delta.rebase``).
        ``onto``: as that bundle would run it instead (a version not carried to yet; reads only)."""
        from edge.adapt.delta import CONV_TAIL, delta_kind, rebase, stale

        onto = self.bundle if onto is None else onto
        delta, info = self.load_with_info(context)
        if delta and delta_kind(delta) == CONV_TAIL and stale(info, onto):
            from edge.adapt.conv import load_tail

            delta = rebase(delta, info, onto, load_tail(onto))
        return delta, info

    def use(self, context: str | None) -> None:
        from edge.options import check_context

        check_context(context, none_ok=True)  # a list: this sentence, not "unhashable type"
        if context is not None and context not in self.meta["contexts"]:
            raise EdgelearnError(f"no adapted context {context!r}",
                                 fix=f"choose one of {sorted(self.meta['contexts'])} or adapt it first")
        self.meta["active"] = context
        self._write_meta()

    def rollback(self, context: str) -> int | None:
        from edge.options import check_context

        check_context(context)
        entry = self.meta["contexts"].get(context)
        if entry is None:
            raise EdgelearnError(f"no adapted context {context!r}", fix="nothing to roll back")
        self.meta["contexts"][context] = {"current": entry.get("previous"), "previous": None}
        self._write_meta()
        return entry.get("previous")

    # -- the pause checkpoint (a cache of computation: damaged means absent) ----------------------
    def save_checkpoint(self, state: dict, info: dict) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        arrays = dict(state)
        arrays["__info__"] = np.frombuffer(json.dumps(info).encode(), np.uint8)
        atomic_write(self.root / CHECKPOINT, npz_bytes(arrays))

    def load_checkpoint(self):
        path = self.root / CHECKPOINT
        if not path.exists():
            return None, None
        try:
            arrays = npz_arrays(path)
            info = npz_info(arrays)
            for k, v in arrays.items():
                if v.dtype.kind not in "fiu" or (v.dtype.kind == "f" and not np.all(np.isfinite(v))):
                    raise ValueError(f"{k} is not finite numbers")
        except READ_ERRORS as e:
            # reported once: a damaged checkpoint is only a cache, so it goes (no later run warns again)
            try:
                atomic.remove(path)
                log.warning("removed %s (%s): the paused run starts over", path, e)
            except OSError as oe:  # a read-only state: ignored, as before
                log.warning("ignoring %s (%s; cannot remove it: %s): the paused run starts over", path, e, oe)
            return None, None
        return arrays, info

    def clear_checkpoint(self) -> None:
        atomic.remove(self.root / CHECKPOINT)

