"""The aggregator's durable state: one SQLite database in WAL mode, written by one thread.

Every accepted update is a row holding its raw authenticated frame, written in
the same transaction that advances the device's sequence number; the
in-memory running sum is only ever rebuilt from those rows. So a process
killed at any instant restarts with exactly the updates whose acceptance was
committed: none lost, none counted twice (the round/device primary key and
the seq make a second insert impossible). ``synchronous=FULL`` makes a commit
survive a power cut too; ``normal`` only survives a process crash.

The database holds every device's HMAC key, so it is created 0600 before
SQLite opens it (SQLite gives its -wal, -shm and -journal files the main
file's mode), and a database left group- or world-readable by an older
version is narrowed before it is opened. One process serves a state
directory at a time: ``StateLock`` is an exclusive ``flock`` on
``STATE/aggregator.lock`` held for the serving process's lifetime (the
kernel drops it when the process dies, however it dies).

    store = Store("agg/state.sqlite")
    with store.tx() as c:
        c.execute("UPDATE devices SET last_seq=? WHERE device_id=?", (41, "pi-001"))
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sqlite3
import stat
from contextlib import contextmanager
from pathlib import Path

from edge.errors import EdgelearnError

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS devices (
    device_id TEXT PRIMARY KEY, key BLOB NOT NULL, tier TEXT NOT NULL DEFAULT 'linux',
    last_seq INTEGER, rounds_joined INTEGER NOT NULL DEFAULT 0, last_round INTEGER,
    last_checkin REAL, state TEXT);
CREATE TABLE IF NOT EXISTS rounds (
    round_id INTEGER PRIMARY KEY, mode TEXT NOT NULL, model_version INTEGER NOT NULL,
    status TEXT NOT NULL, opened REAL NOT NULL, deadline REAL, target INTEGER NOT NULL,
    selected INTEGER NOT NULL DEFAULT 0, accepted INTEGER NOT NULL DEFAULT 0,
    closed REAL, result_version INTEGER, accuracy REAL, bytes INTEGER NOT NULL DEFAULT 0, note TEXT);
CREATE TABLE IF NOT EXISTS selections (
    round_id INTEGER NOT NULL, device_id TEXT NOT NULL, selected_at REAL NOT NULL,
    base_version INTEGER NOT NULL, PRIMARY KEY (round_id, device_id));
CREATE TABLE IF NOT EXISTS updates (
    round_id INTEGER NOT NULL, device_id TEXT NOT NULL, seq INTEGER NOT NULL,
    base_version INTEGER NOT NULL, num_examples INTEGER NOT NULL, digest BLOB NOT NULL,
    frame BLOB NOT NULL, received REAL NOT NULL, PRIMARY KEY (round_id, device_id));
-- resends are recognised by (device, seq); fairness counts a device's recent selections
CREATE INDEX IF NOT EXISTS updates_by_device_seq ON updates(device_id, seq);
CREATE INDEX IF NOT EXISTS selections_by_device ON selections(device_id, round_id);
-- which device's update each aggregated round accepted, for the last rounds only (pruned as rounds close;
-- a failed round's are deleted): the fairness budget and the per-device weight count them
CREATE TABLE IF NOT EXISTS contributions (
    round_id INTEGER NOT NULL, device_id TEXT NOT NULL, PRIMARY KEY (round_id, device_id));
CREATE INDEX IF NOT EXISTS contributions_by_device ON contributions(device_id, round_id);
CREATE TABLE IF NOT EXISTS chunks (
    device_id TEXT NOT NULL, frame_id INTEGER NOT NULL, idx INTEGER NOT NULL, count INTEGER NOT NULL,
    frame_len INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (device_id, frame_id, idx));
CREATE TABLE IF NOT EXISTS models (
    version INTEGER PRIMARY KEY, parent INTEGER, round_id INTEGER, status TEXT NOT NULL,
    accuracy REAL, epsilon REAL, path TEXT, created REAL NOT NULL);
"""


LOCK_NAME = "aggregator.lock"
SIDE_FILES = ("-wal", "-shm", "-journal")


def create_private(path: Path) -> None:
    """Make sure ``path`` exists with mode 0600 before SQLite opens it: created so (never chmod-ed
    after), or, when an older version left it readable by others, narrowed together with its side files."""
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        return
    except FileExistsError:
        pass
    for p in (str(path),) + tuple(f"{path}{s}" for s in SIDE_FILES):
        try:
            mode = stat.S_IMODE(os.stat(p).st_mode)
        except FileNotFoundError:
            continue
        if mode & 0o077:
            os.chmod(p, mode & 0o700)


class StateLock:
    """An exclusive lock on a state directory for as long as this object (or its process) lives.

    A second holder is refused with one sentence naming the first one's pid (written in the lock file).
    """

    def __init__(self, state_dir):
        self.path = Path(state_dir) / LOCK_NAME
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            who = f"pid {holder}" if holder.isdigit() else "another process (pid not yet written)"
            raise EdgelearnError(f"{state_dir}: this aggregator state is in use by {who}, which holds {self.path}",
                                 fix="stop that aggregator first or give this one its own --state directory "
                                     "(two processes on one state would both accept and close the same rounds)") \
                from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (a PostgreSQL URL names who may read device keys)."""
    url = re.sub(r"(://[^/:@]*:)[^@/]*@", r"\1***@", str(url))
    return re.sub(r"(password=)[^&\s]*", r"\1***", url)


def state_db(state_dir, db=None):
    """The database a command works on: ``db`` (its --db) when given, else the one ``init`` recorded
    in ``STATE/config.json`` (``AggregatorConfig.db``), else None (``STATE/state.sqlite``)."""
    if db:
        return str(db)
    try:
        raw = json.loads((Path(state_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return (raw.get("db") or None) if isinstance(raw, dict) else None


def sqlite_path(db, state_dir) -> Path | None:
    """The SQLite file a --db names (None: STATE/state.sqlite), or None for a PostgreSQL URL."""
    if not db:
        return Path(state_dir) / "state.sqlite"
    db = str(db)
    return Path(db[len("sqlite:///"):]) if db.startswith("sqlite:///") and len(db) > len("sqlite:///") else None


def open_store(db, state_dir, synchronous: str = "full"):
    """The store a ``--db`` URL names: ``None`` is ``STATE/state.sqlite`` (the default),
    ``sqlite:///PATH`` a SQLite file (relative to the working directory; ``sqlite:////abs`` is absolute),
    ``postgresql://user@host:port/db`` a PostgreSQL database shared by every replica (``PgStore``)."""
    if not db:
        return Store(Path(state_dir) / "state.sqlite", synchronous)
    db = str(db)
    if db.startswith("sqlite:///") and len(db) > len("sqlite:///"):
        return Store(Path(db[len("sqlite:///"):]), synchronous)
    if db.startswith(("postgresql://", "postgres://")):
        from host.aggregator.pgstore import PgStore
        return PgStore(db)
    raise EdgelearnError(f"--db {redact(db)} is neither a sqlite:///PATH nor a postgresql:// URL",
                         fix="pass sqlite:///agg/state.sqlite (the default) or postgresql://user@host:5432/dbname")


def _writable(path: Path) -> bool:
    """Whether ``path`` (or, when it does not exist yet, its directory) can be written; os.access
    answers False on a read-only mount even for root."""
    target = path if path.exists() else path.parent
    return os.access(target, os.W_OK) and os.access(path.parent, os.W_OK)


def _connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection that never writes (for ``aggregator status``): no WAL pragma, no schema.

    ``mode=ro`` reads beside a running ``serve``; a WAL database on a read-only mount cannot
    create its ``-shm`` file, so there it is opened ``immutable=1`` (a backup nobody writes)."""
    from urllib.parse import quote
    uri = f"file:{quote(str(path.resolve()))}?mode=ro"
    try:
        db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return db
    except sqlite3.OperationalError:
        if _writable(path):
            raise
    db = sqlite3.connect(uri + "&immutable=1", uri=True, isolation_level=None, check_same_thread=False)
    db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    return db


class MetaQueries:
    """The ``meta`` table's helpers, on top of a store's ``one`` and ``db`` (SQLite and PostgreSQL)."""

    def get_meta(self, key: str, default=None):
        r = self.one("SELECT value FROM meta WHERE key=?", (key,))
        return default if r is None else r[0]

    def set_meta(self, key: str, value) -> None:
        self.db.execute("INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                        (key, str(value)))

    def has_aggregator(self) -> bool:
        return self.get_meta("current_version") is not None


class Store(MetaQueries):
    """A SQLite connection in WAL mode with the aggregator's schema and small helpers.

    ``shared`` is False: this process is the only writer, so its in-memory round state is the truth
    (``PgStore`` is the shared one)."""

    shared = False
    Error = sqlite3.Error
    url = None

    def __init__(self, path, synchronous: str = "full", read_only: bool = False):
        self.path = Path(path)
        self._depth = 0
        if read_only:
            self.db = _connect_read_only(self.path)
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            create_private(self.path)  # device keys live here: 0600 from the first byte (wal/shm follow)
            # isolation_level=None: we issue BEGIN/COMMIT ourselves so a batch is one transaction.
            self.db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
        except (OSError, sqlite3.OperationalError) as e:
            # A state directory on a read-only mount (a backup) fails here with sqlite's
            # "unable to open database file", which names neither the file nor the cause.
            if not _writable(self.path):
                raise EdgelearnError(f"{self.path}: the aggregator database is on a read-only filesystem "
                                     f"or in a directory this user cannot write ({e})",
                                     fix="run this on a writable copy of the state directory "
                                         "(`edgelearn aggregator status` reads a read-only one)") from None
            raise
        self.db.execute(f"PRAGMA synchronous={'FULL' if synchronous == 'full' else 'NORMAL'}")
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.executescript(SCHEMA)
        cols = {r[1] for r in self.db.execute("PRAGMA table_info(devices)")}
        if "checkin_time" not in cols:  # added after version 1 of the schema
            self.db.execute("ALTER TABLE devices ADD COLUMN checkin_time REAL")
        if "revoked" not in cols:  # when `aggregator revoke` revoked the device's key (NULL: it is valid)
            self.db.execute("ALTER TABLE devices ADD COLUMN revoked REAL")

    @contextmanager
    def tx(self):
        """One transaction (nested calls join the outer one); rolls back on any exception."""
        if self._depth:
            self._depth += 1
            try:
                yield self.db
            finally:
                self._depth -= 1
            return
        self.db.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield self.db
        except BaseException:
            self._depth = 0
            self.db.execute("ROLLBACK")
            raise
        self._depth = 0
        self.db.execute("COMMIT")

    def one(self, sql: str, args=()):
        return self.db.execute(sql, args).fetchone()

    def all(self, sql: str, args=()):
        return self.db.execute(sql, args).fetchall()

    def data_version(self) -> int:
        """A number that changes when another connection (another process: ``aggregator revoke``,
        ``provision``) commits to the database, and only then; no table is read."""
        return self.db.execute("PRAGMA data_version").fetchone()[0]

    def close(self) -> None:
        self.db.close()
