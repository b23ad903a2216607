"""The aggregator's state in PostgreSQL, shared by any number of ``aggregator serve`` replicas.

The same tables as the SQLite store (``store.SCHEMA``, with PostgreSQL's types) plus three of its
own: ``files`` (the published model files and bundles, the held-out set and the base bundle, so a
replica on another machine serves and builds versions it did not publish), ``changes`` (one counter
every write transaction bumps) and nothing else. Every write transaction first takes one
transaction-scoped advisory lock (``pg_advisory_xact_lock``): writers of one database are serialised
exactly as SQLite's ``BEGIN IMMEDIATE`` serialises them, across machines and without a lock file,
and the lock goes with the transaction however its session ends (a replica killed mid-transaction
leaves nothing locked and nothing half-written). Inside the lock the counter tells a replica whether
another one committed since its own last transaction; if so ``on_stale`` (``RoundManager.resync``)
re-reads the shared state before anything is decided. ``synchronous_commit`` stays the server's
(on by default): a commit is acknowledged after its WAL record is flushed.

    store = PgStore("postgresql://edgelearn@db.local:5432/agg")
    with store.tx() as c:        # the lock, the counter, then your statements
        c.execute("UPDATE devices SET last_seq=? WHERE device_id=?", (41, "pi-001"))
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from functools import lru_cache

from edge.errors import EdgelearnError
from host.aggregator.store import SCHEMA, MetaQueries, redact

LOCK_KEY = 0x65646C6E  # "edln": the advisory lock every write transaction of an aggregator database takes
LOCK_TIMEOUT_MS = 30_000      # a round's close (signing and zipping a bundle) holds the lock well under this
IDLE_TX_TIMEOUT_MS = 120_000

EXTRA = """
ALTER TABLE devices ADD COLUMN IF NOT EXISTS checkin_time DOUBLE PRECISION;
ALTER TABLE devices ADD COLUMN IF NOT EXISTS revoked DOUBLE PRECISION;
CREATE TABLE IF NOT EXISTS files (name TEXT PRIMARY KEY, data BYTEA NOT NULL);
CREATE TABLE IF NOT EXISTS changes (id INTEGER PRIMARY KEY CHECK (id = 1), n BIGINT NOT NULL);
INSERT INTO changes(id, n) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
"""


def pg_schema() -> str:
    """``store.SCHEMA`` in PostgreSQL's types (64-bit integers: sequence numbers and frame ids are u32)."""
    s = re.sub(r"\bBLOB\b", "BYTEA", SCHEMA)
    s = re.sub(r"\bREAL\b", "DOUBLE PRECISION", s)
    return re.sub(r"\bINTEGER\b", "BIGINT", s) + EXTRA


@lru_cache(maxsize=512)
def _sql(q: str) -> str:
    """SQLite's ``?`` placeholders as psycopg's ``%s`` (no statement of ours holds a literal ? or %)."""
    return q.replace("%", "%%").replace("?", "%s")


class _Db:
    """The connection as the aggregator's code uses SQLite's: ``execute(sql, args)`` -> a cursor."""

    def __init__(self, conn):
        self.conn = conn

    def execute(self, sql: str, args=()):
        if not args:  # psycopg reads no placeholders (and no %) in a statement without arguments
            return self.conn.execute(sql)
        return self.conn.execute(_sql(sql), tuple(args))

    def executemany(self, sql: str, rows) -> None:
        """One statement for many rows, sent in pipeline mode (psycopg: one round trip, not one a row)."""
        with self.conn.cursor() as cur:
            cur.executemany(_sql(sql), [tuple(r) for r in rows])


class PgStore(MetaQueries):
    """One psycopg 3 connection (autocommit outside ``tx``) with the Store interface."""

    shared = True

    def __init__(self, url: str, connect_timeout: int = 10):
        import psycopg

        self.Error = psycopg.Error
        self.url = redact(url)
        self._url, self._timeout = url, connect_timeout
        self.on_stale = None   # called inside a write transaction when another replica committed since ours
        self.seen = None       # the change counter after this replica's last committed transaction
        self._depth = 0
        try:
            self._connect()
        except psycopg.Error as e:
            why = " ".join(line.strip() for line in str(e).strip().splitlines()) or type(e).__name__
            raise EdgelearnError(f"cannot connect to PostgreSQL at {self.url}: {why}",
                                 fix="start the server, check the host, port, user and database in --db "
                                     "(a password goes in ~/.pgpass or PGPASSWORD, not the URL)") from None
        # under the lock, so replicas starting together do not race on CREATE; no arguments, so
        # psycopg sends the statements as one script
        with self.conn.transaction():
            self.db.execute("SELECT pg_advisory_xact_lock(?)", (LOCK_KEY,))
            self.db.execute(pg_schema())

    def _connect(self) -> None:
        """(Re)connect; a failure is a ``psycopg.Error`` (serving answers 503 and tries again next time)."""
        import psycopg

        self.conn = psycopg.connect(self._url, autocommit=True, connect_timeout=self._timeout)
        # a replica that hangs while holding the lock must not stall the others forever: its idle
        # transaction is ended by the server, and a wait for the lock gives up (503, the client resends)
        self.conn.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")
        self.conn.execute(f"SET idle_in_transaction_session_timeout = {IDLE_TX_TIMEOUT_MS}")
        self.db = _Db(self.conn)
        self.seen = None  # a new session knows nothing: the next transaction re-reads the shared state

    @contextmanager
    def tx(self):
        """One transaction under the aggregator's advisory lock (nested calls join the outer one);
        rolls back on any exception. A lost connection is re-opened at the next transaction."""
        if self._depth:
            self._depth += 1
            try:
                yield self.db
            finally:
                self._depth -= 1
            return
        self._ready()
        c = self.db
        self._depth = 1
        try:
            # one round trip (a simple query runs its statements in order: the lock before the counter)
            cur = c.execute(f"BEGIN; SELECT pg_advisory_xact_lock({LOCK_KEY}); "
                            "UPDATE changes SET n = n + 1 WHERE id = 1 RETURNING n")
            cur.nextset()
            cur.nextset()
            n = cur.fetchone()[0]
            stale = self.seen != n - 1
            self.seen = n
            if stale and self.on_stale is not None:
                self.on_stale()
            yield c
        except BaseException:
            self._depth = 0
            self.seen = None
            if not (self.conn.closed or self.conn.broken):
                try:
                    self.conn.execute("ROLLBACK")
                except self.Error:
                    pass  # the connection died meanwhile: the server rolled it back
            raise
        self._depth = 0
        try:
            c.execute("COMMIT")
        except BaseException:
            self.seen = None  # the outcome is unknown to us: re-read before trusting memory
            raise

    def changed(self) -> int | None:
        """The change counter now (read without the lock), or None if it equals this replica's."""
        n = self.one("SELECT n FROM changes WHERE id = 1")[0]
        return None if n == self.seen else n

    def _ready(self) -> None:
        """Outside a transaction, re-open a connection the server dropped (a restart, a network cut)."""
        if not self._depth and (self.conn.closed or self.conn.broken):
            self._connect()

    def one(self, sql: str, args=()):
        self._ready()
        return self.db.execute(sql, args).fetchone()

    def all(self, sql: str, args=()):
        self._ready()
        return self.db.execute(sql, args).fetchall()

    # --- files shared by every replica (models/, bundles/, the held-out set, the base bundle) -------
    def put_file(self, name: str, data: bytes) -> None:
        self.db.execute("INSERT INTO files(name, data) VALUES(?, ?) ON CONFLICT(name) DO UPDATE SET data=excluded.data",
                        (name, bytes(data)))

    def get_file(self, name: str) -> bytes | None:
        r = self.one("SELECT data FROM files WHERE name=?", (name,))
        return None if r is None else bytes(r[0])

    def close(self) -> None:
        self.conn.close()
