"""Old adapted versions deleted after each commit (``AdaptStore.save`` calls ``prune`` under its lock).

Each context keeps its current version, the one ``rollback`` goes to (``previous``), its newest
``keep`` versions (``KEEP_VERSIONS`` unless the store, ``device adapt --keep-versions N`` or
``Device.adapt(keep_versions=N)`` says otherwise) and any version something else names (a commit's
staged moves, ``agent.json``'s running model, the calibration in ``operating.json``); the rest are
deleted one file at a time, oldest first (``edge.atomic.remove``: a kill leaves each version whole or
gone, and the next commit prunes what is left). Split from store.py to keep it about the commit.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from edge import atomic

log = logging.getLogger("edgelearn.adapt")

# Versions of each context kept besides its current and previous ones: enough to go back by hand a
# while (a bias-only version is ~2 KB, a full-tail one far more); at least 1.
KEEP_VERSIONS = 10


def check_keep(keep) -> int:
    """``keep`` (None: ``KEEP_VERSIONS``) if it is a whole number of versions, at least 1 (the rule
    of ``--keep-versions``, ``edge.options``), else one EdgelearnError."""
    from edge.options import check

    return KEEP_VERSIONS if keep is None else check("keep_versions", keep)


def versions(store, context: str | None = None) -> list[int]:
    """The version numbers of ``context`` (the active one by default) on disk, oldest first."""
    from edge.adapt.store import _CONTEXT, _VERSION

    context = context or store.meta.get("active")
    if context is None or not _CONTEXT.match(context):
        return []
    return sorted(int(m[1]) for p in (store.root / context).glob("v*.npz") if (m := _VERSION.match(p.name)))


def referenced(store) -> set:
    """(context, version) of every version something names: each context's current and previous
    one, a commit's staged moves, the model ``agent.json`` says the agent runs, the one the
    calibration in ``operating.json`` was made for. (A paused run's checkpoint names the version
    it started from, which is the current one: the roll-forward removes any other.)"""
    from edge.adapt.store import _VERSION

    refs = set()
    for name, entry in store.meta["contexts"].items():
        refs |= {(name, entry.get(k)) for k in ("current", "previous") if entry.get(k) is not None}
    for _, target in (store.meta.get("pending") or {}).get("moves", []):
        parts = Path(target).parts
        if len(parts) == 3 and parts[0] == "adapt" and (m := _VERSION.match(parts[2])):
            refs.add((parts[1], int(m[1])))
    for file, path in (("agent.json", ("model",)), ("operating.json", ("for",))):
        try:
            doc = json.loads((store.state / file).read_bytes()[: 1 << 20])
            for k in path:
                doc = doc.get(k)
            c, v = doc.get("context"), doc.get("context_version")
        except (OSError, ValueError, AttributeError):
            continue  # none, or unreadable: it names nothing
        if isinstance(c, str) and isinstance(v, int) and not isinstance(v, bool):
            refs.add((c, v))
    return refs


def prune(store, keep: int | None = None) -> list[Path]:
    """Delete ``store``'s old versions (``keep``: None, the store's ``keep``): of each context, all
    but its newest ``keep``, its current and previous ones and any version something names
    (``referenced``). Oldest first, one file at a time (``edge.atomic.remove``, the directory
    fsynced), under the store's lock: a kill leaves every version whole or gone, and the next commit
    prunes the rest. A file that cannot be removed (a read-only state) is left, with a log line: the
    commit before it stands. Returns the files removed."""
    keep = store.keep if keep is None else check_keep(keep)
    gone = []
    with store._locked():
        refs = referenced(store)
        for context in sorted(store.meta["contexts"]):
            for v in versions(store, context)[:-keep]:
                if (context, v) in refs:
                    continue
                path = store.root / context / f"v{v}.npz"
                try:
                    if atomic.remove(path):
                        gone.append(path)
                except OSError as e:
                    log.warning("could not remove %s (%s): kept", path, e.strerror or e)
    if gone:
        log.info("pruned %d old adapted versions", len(gone))
    return gone
