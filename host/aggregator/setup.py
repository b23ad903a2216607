"""Create an aggregator state directory and provision devices (used by the CLI, tests and the simulator).

    init_state("agg/", AggregatorConfig(clients_per_round=5), bundle="models/kws-dscnn-s",
               heldout=(X_test, y_test))
    key = provision("agg/", "pi-001")          # 32 random bytes, registered in the database
    revoke("agg/", "pi-001")                   # its key refused from now on (provision again: a new key)
    v = publish_version("agg/", head)         # an operator's rollout: the next version, outside rounds
"""

from __future__ import annotations

import hmac
import os
import secrets
import shutil
import time
from pathlib import Path

import numpy as np

from edge.errors import EdgelearnError
from edge.fl.model import REHEARSAL_FILE, rehearsal_misfit
from edge.portable.wire import _ID_CHARS, MAX_DEVICE_ID_LEN
from edge.atomic import atomic_write, npz_bytes
from host.aggregator.config import AggregatorConfig
from host.aggregator.models import ModelRegistry
from host.aggregator.store import Store, open_store

BUSY_TIMEOUT_MS = 60_000  # how long provision/revoke wait for a running `serve`'s write transaction (SQLite)


def init_state(state_dir, cfg: AggregatorConfig, bundle=None, signing_key=None, heldout=None,
               params: dict | None = None, db=None, negatives: dict | None = None, rehearsal=None) -> int:
    """Write config, keys, held-out set and model version base+1; returns that version. With ``db`` a
    ``postgresql://`` URL, the database gets them too (config, held-out set, base bundle, version): every
    replica serving it reads them there; only the signing key stays a file each replica is given.
    ``negatives`` (with ``heldout``): keyword-free speech as the Detector's windows, {"X": (T, D)
    embeddings in stream order, "ends": (T, 2) their end and keyword-end times, "keywords": label
    ids, "hours"}: every later version is published with per-word thresholds matched on it
    (``ModelRegistry.operating``). ``rehearsal``: (X, y) embeddings and label ids of the voices the
    shipped model was trained on; every version's bundle carries them (``rehearsal.npz``) and each
    device trains on them beside its own examples (``edge.fl.model.load_rehearsal``)."""
    from host.aggregator.store import SIDE_FILES, redact, sqlite_path

    d = Path(state_dir)
    shared = bool(db) and not str(db).startswith("sqlite:")
    if not shared and ((d / "state.sqlite").exists() or (d / "config.json").exists()):
        raise EdgelearnError(f"{d}: already holds an aggregator", fix="choose an empty --state directory")
    dbfile = sqlite_path(db, d) if db else None
    if dbfile is not None:
        if not dbfile.parent.is_dir():
            raise EdgelearnError(f"--db {db}: the directory {dbfile.parent} does not exist",
                                 fix="create it first, or pass a --db in an existing directory")
        db = f"sqlite:///{dbfile.resolve()}"  # recorded absolute: later commands may run elsewhere
    if dbfile is not None or (shared and str(db).startswith(("postgresql://", "postgres://")) and redact(db) == db):
        cfg.db = str(db)  # later commands without --db use it (a URL with a password is never recorded)
    if signing_key is not None:
        from host.keys import load_private_key
        load_private_key(signing_key)  # a bad key refused before anything is written
    # what a failed init removes again: only what it created
    had_dir = d.is_dir()
    before = set(os.listdir(d)) if had_dir else set()
    db_new = [] if dbfile is None else [p for p in (dbfile, *(Path(f"{dbfile}{x}") for x in SIDE_FILES))
                                        if not p.exists()]
    try:
        return _init_state(d, cfg, bundle, signing_key, heldout, params, db, negatives, rehearsal)
    except BaseException:
        for p in db_new:
            p.unlink(missing_ok=True)
        if not had_dir:
            shutil.rmtree(d, ignore_errors=True)
        elif d.is_dir():
            for name in set(os.listdir(d)) - before:
                p = d / name
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
        raise


def _init_state(d: Path, cfg, bundle, signing_key, heldout, params, db, negatives, rehearsal) -> int:
    import json
    from dataclasses import asdict

    from edge.kws import DEFAULT_BUNDLE
    from host.keys import generate_keypair

    store = open_store(db, d, cfg.synchronous) if db else None
    if store is not None and store.has_aggregator():
        url = store.url or store.path
        store.close()
        raise EdgelearnError(f"{url} already holds an aggregator",
                             fix="serve it (`edgelearn aggregator serve --db ...`) or init an empty database")
    bundle = Path(bundle or DEFAULT_BUNDLE)
    if params is None:
        from host.fleet.data import extract_head
        params = extract_head(bundle)
    held = None
    if heldout is not None:  # (X, y), (X, y, classes): label id -> the class it is reported as, or
        X, y = heldout[:2]    # (X, y, classes, groups): row -> group, each gated on its own
        held = {"X": np.asarray(X, np.float32), "y": np.asarray(y, np.int64)}
        if len(heldout) > 3 and heldout[3] is not None:
            groups = np.asarray(heldout[3])
            if groups.shape != held["y"].shape or not np.issubdtype(groups.dtype, np.integer):
                if store is not None:
                    store.close()
                raise EdgelearnError(f"held-out groups must be one integer per row ({len(held['y'])}), "
                                     f"not {groups.dtype} {groups.shape}", fix="pass one group id per held-out row")
            held["groups"] = groups.astype(np.int64)
        if len(heldout) > 2 and heldout[2] is not None:
            try:  # checked before anything is written
                held["classes"] = _classes(heldout[2], held["y"], params)
            except EdgelearnError:
                if store is not None:
                    store.close()
                raise
    rehearsal = None if rehearsal is None else _rehearsal(rehearsal, params, store)
    if negatives is not None:
        if held is None:
            raise EdgelearnError("negatives for the operating point need a held-out set beside them",
                                 fix="pass heldout=(X, y) too")
        held.update(neg_X=np.asarray(negatives["X"], np.float32), neg_ends=np.asarray(negatives["ends"], np.float64),
                    keywords=np.asarray(negatives["keywords"], np.int64), neg_hours=np.float64(negatives["hours"]))
    d.mkdir(parents=True, exist_ok=True)
    if signing_key is None:
        signing_key, _ = generate_keypair(d / "keys", "aggregator")
    cfg.save(d / "config.json")
    if held is not None:
        atomic_write(d / "heldout.npz", npz_bytes(held))
    if rehearsal is not None:
        atomic_write(d / REHEARSAL_FILE, npz_bytes(rehearsal))
    if store is None:
        store = Store(d / "state.sqlite", cfg.synchronous)
    try:
        with store.tx():
            store.set_meta("signing_key", str(Path(signing_key).resolve()))
            store.set_meta("dp_seed", new_dp_seed())  # DP noise's secret (rounds._round_rng), made once
            if store.shared:
                store.set_meta("config", json.dumps(asdict(cfg), sort_keys=True))
                if heldout is not None:
                    store.put_file("heldout.npz", (d / "heldout.npz").read_bytes())
                if rehearsal is not None:
                    store.put_file(REHEARSAL_FILE, (d / REHEARSAL_FILE).read_bytes())
        return ModelRegistry(d, store, str(signing_key)).init_from_bundle(bundle, params, cfg.eval_metric)
    finally:
        store.close()


def _rehearsal(rehearsal, params, store=None) -> dict:
    """The rehearsal set, checked before anything is written (``edge.fl.model.rehearsal_misfit``)."""
    X, y = np.asarray(rehearsal[0]), np.asarray(rehearsal[1])
    why = rehearsal_misfit(X, y, params)
    if why:
        if store is not None:
            store.close()
        raise EdgelearnError(f"the rehearsal set has {why}",
                             fix="write X with the bundle encoder's embeddings and y with its label ids")
    return {"X": X.astype(np.float32), "y": y.astype(np.int64)}


def _classes(classes, y, params) -> np.ndarray:
    """The held-out set's label -> class map, checked: one non-negative class per label the head
    can name and the set holds."""
    c = np.asarray(classes)
    n = max(int(y.max()) + 1 if len(y) else 0,
            int(np.asarray(params["classifier.b"]).shape[0]) if "classifier.b" in params else 0)
    if c.ndim != 1 or not np.issubdtype(c.dtype, np.integer) or len(c) < n or (len(c) and c.min() < 0):
        raise EdgelearnError(f"the held-out set's classes map has shape {c.shape} and type {c.dtype}; it needs one "
                             f"non-negative integer class for each of the {n} labels",
                             fix="write classes as an integer array indexed by label id (or leave it out)")
    return c.astype(np.int64)


def new_dp_seed() -> int:
    """The database's secret DP seed (meta ``dp_seed``, 63 bits from the OS's CSPRNG): the 0600 SQLite
    file or the PostgreSQL database holds it; it is never logged, in config.json or in /v1/status."""
    return secrets.randbits(63)


def provision(state_dir, device_id: str, key: bytes | None = None, tier: str = "linux", db=None) -> bytes:
    """Register a device and its HMAC key (generated when not given); returns the key. A revoked
    device (``revoke``) is re-enabled with the new key, which must differ from the revoked one; its
    sequence number and check-in time start afresh (nothing signed with the old key verifies now)."""
    b = device_id.encode()
    if not 1 <= len(b) <= MAX_DEVICE_ID_LEN or any(c not in _ID_CHARS for c in b):
        raise EdgelearnError(f"device id {device_id!r} is not 1-{MAX_DEVICE_ID_LEN} characters of A-Z a-z 0-9 . _ : -",
                             fix="choose a plain id such as pi-001")
    key = secrets.token_bytes(32) if key is None else bytes(key)
    if len(key) < 16:
        raise EdgelearnError("device key is shorter than 16 bytes", fix="use 32 random bytes")
    store = existing_store(state_dir, db)
    try:
        with store.tx() as c:
            row = c.execute("SELECT revoked, key FROM devices WHERE device_id=?", (device_id,)).fetchone()
            if row is None:
                c.execute("INSERT INTO devices(device_id, key, tier) VALUES(?,?,?)", (device_id, key, tier))
            elif row[0] is None:
                raise EdgelearnError(f"device {device_id!r} is already provisioned",
                                     fix="choose another id, or `edgelearn aggregator revoke` it first; "
                                         "keys are never replaced silently")
            elif hmac.compare_digest(bytes(row[1]), key):
                raise EdgelearnError(f"device {device_id!r} was revoked with this very key",
                                     fix="let provision generate a new key (a revoked key never works again)")
            else:  # re-enabled: frames and check-ins signed with the old key cannot verify any more
                c.execute("UPDATE devices SET key=?, tier=?, revoked=NULL, last_seq=NULL, checkin_time=NULL "
                          "WHERE device_id=?", (key, tier, device_id))
    except store.Error as e:
        raise _busy(store, e) from None
    finally:
        store.close()
    return key


def revoke(state_dir, device_id: str, db=None, clock=time.time) -> dict:
    """Revoke a device's key: from this transaction on, every request signed with it is refused
    (403 ``DeviceRevoked``), by a ``serve`` running on this state as well (it reads the revocation
    from the database: ``RoundManager.credentials``). Its update that the open round accepted but
    has not aggregated is taken back in the same transaction (row, contribution, the round's count;
    a serving process rebuilds its running sum from the rows before it closes the round:
    ``RoundManager._reconcile``); rounds already closed keep it. Its half-sent chunks are dropped.
    The key stays in the row (a request signed with it gets the revocation, not "unknown device")
    until ``provision`` replaces it. Returns {"device_id", "revoked": Unix time, "already": whether
    it was revoked before (nothing changed), "dropped": round ids whose accepted update was taken
    back}; an unknown id is one EdgelearnError."""
    store = existing_store(state_dir, db)
    try:
        with store.tx() as c:
            row = c.execute("SELECT revoked FROM devices WHERE device_id=?", (device_id,)).fetchone()
            if row is None:
                raise EdgelearnError(f"device {device_id!r} is not provisioned on {store.url or state_dir}",
                                     fix="check the id: it is the --device `edgelearn aggregator provision` was given")
            if row[0] is not None:
                return {"device_id": device_id, "revoked": float(row[0]), "already": True, "dropped": []}
            now = float(clock())
            c.execute("UPDATE devices SET revoked=? WHERE device_id=?", (now, device_id))
            taken = c.execute("SELECT u.round_id, LENGTH(u.frame) FROM updates u JOIN rounds r ON "
                              "r.round_id=u.round_id WHERE u.device_id=? AND r.status='open' ORDER BY u.round_id",
                              (device_id,)).fetchall()
            for rid, nbytes in taken:
                c.execute("DELETE FROM updates WHERE round_id=? AND device_id=?", (rid, device_id))
                c.execute("DELETE FROM contributions WHERE round_id=? AND device_id=?", (rid, device_id))
                c.execute("UPDATE rounds SET accepted=accepted-1, bytes=bytes-? WHERE round_id=?", (int(nbytes), rid))
            if taken:
                c.execute("UPDATE devices SET rounds_joined=rounds_joined-? WHERE device_id=?", (len(taken), device_id))
            c.execute("DELETE FROM chunks WHERE device_id=?", (device_id,))
    except store.Error as e:
        raise _busy(store, e) from None
    finally:
        store.close()
    return {"device_id": device_id, "revoked": now, "already": False, "dropped": [int(r) for r, _ in taken]}


def _busy(store, e) -> EdgelearnError:
    """A write refused by the database (locked for longer than the busy timeout by a round that a
    running ``serve`` closes, or a lost server) as one sentence; nothing was changed."""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return EdgelearnError(f"{store.url or store.path}: the aggregator database refused the change ({first}); "
                          "nothing was changed", fix="run the command again")


def existing_store(state_dir, db=None):
    """The store of an aggregator ``init`` made (--db, else the one it recorded), or one EdgelearnError
    (no aggregator there); creates nothing."""
    from host.aggregator.store import sqlite_path, state_db

    db = state_db(state_dir, db)
    path = sqlite_path(db, state_dir)
    if path is not None and not path.is_file():  # checked first: opening it would create it
        raise EdgelearnError(f"{state_dir}: no aggregator here", fix="run `edgelearn aggregator init` first")
    store = open_store(db, state_dir)
    if path is not None:  # beside a running `serve`, whose transaction (a round's close) may hold the write lock
        store.db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    if path is None and not store.has_aggregator():  # PostgreSQL: an empty database would get the schema
        store.close()
        raise EdgelearnError(f"{store.url or state_dir}: no aggregator here",
                             fix="run `edgelearn aggregator init` first")
    return store


def publish_version(state_dir, params: dict, note: str = "operator", db=None) -> int:
    """Publish ``params`` (the head's tensors, as ``head.npz`` holds them) as the next model version,
    outside any round (``RoundManager.publish_params``: the open round is superseded, the next one
    trains it, devices pull it with their next task). Needs the state lock: it refuses, in one
    sentence, while ``edgelearn aggregator serve`` runs on this state; stop it, publish, serve again.
    Returns the new version."""
    from host.aggregator.app import Aggregator

    agg = Aggregator(state_dir, db=db)
    try:
        return agg.rounds.publish_params(params, note)
    finally:
        agg.close()


def write_device_key(out_dir, device_id: str, key: bytes) -> Path:
    """Write ``out_dir/DEVICE.hmac``, the key line a device reads (``edge.keys``), 0600 from the
    first byte (``atomic_write`` creates it with mkstemp); returns its path."""
    from edge.keys import HMAC_KEY_TAG

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{device_id}.hmac"
    atomic_write(path, f"{HMAC_KEY_TAG} {bytes(key).hex()} {device_id}\n".encode())
    return path
