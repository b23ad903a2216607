"""A throwaway PostgreSQL server in a temporary directory (Debian's ``postgresql`` package), for the
aggregator's PostgreSQL tests and ``bench/aggregator_replicas.py``.

initdb refuses to run as root (CI runs as root), so as root the cluster belongs to the ``postgres``
system user the package creates and every server command runs through ``runuser -u postgres --``.
It listens on a free loopback port, its Unix socket in the temporary directory, fsync on (the
aggregator's guarantees are about durability), trust authentication for loopback only.

    with PgServer() as pg:
        url = pg.database("t1")    # postgresql://edgelearn@127.0.0.1:PORT/t1, a fresh database
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from host.netutil import free_port

USER = "edgelearn"


def find_bindir() -> Path | None:
    """The directory holding initdb and pg_ctl: $EDGELEARN_PG_BIN, PATH, or Debian's /usr/lib/postgresql/N/bin."""
    env = os.environ.get("EDGELEARN_PG_BIN")
    cands = [env] if env else []
    which = shutil.which("initdb")
    if which:
        cands.append(str(Path(which).parent))
    cands += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name)
                    if Path(p).parent.name.isdigit() else 0, reverse=True)
    for c in cands:
        if c and (Path(c) / "initdb").is_file() and (Path(c) / "pg_ctl").is_file():
            return Path(c)
    return None


def missing_reason() -> str | None:
    """Why no server can be started here, or None."""
    if find_bindir() is None:
        return ("PostgreSQL's initdb/pg_ctl were not found (Debian: apt-get install postgresql; or set "
                "EDGELEARN_PG_BIN to the directory holding them)")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, and there is no 'postgres' user to own the cluster (initdb refuses root)"
        if shutil.which("runuser") is None:
            return "running as root without runuser to start PostgreSQL as the 'postgres' user"
    return None


class PgServer:
    def __init__(self):
        why = missing_reason()
        if why:
            raise RuntimeError(why)
        self.bin = find_bindir()
        self.dir = Path(tempfile.mkdtemp(prefix="edgelearn-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.prefix = []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync")
        self.start()

    def start(self) -> None:
        # fsync on for the running server: commits are durable, as the aggregator's guarantees assume
        opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c fsync=on "
                f"-c synchronous_commit=on -c max_connections=100")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "server.log"), "-o", opts, "-w", "-t", "60",
                  "start")
        self.started = True

    def halt(self) -> None:
        """Stop the server (immediate mode: as a crash looks to its clients); ``start`` brings it back."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        self.started = False

    def _run(self, tool, *args):
        r = subprocess.run([*self.prefix, str(self.bin / tool), *args], capture_output=True, text=True, cwd=self.dir)
        if r.returncode:
            log = self.dir / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{tool} failed ({r.returncode}): {r.stderr.strip()[-2000:]}\n{tail}")
        return r.stdout

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{db}"

    def database(self, name: str) -> str:
        """A fresh, empty database ``name`` (dropped first if it exists); its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if getattr(self, "started", False):
            self.started = False
            try:
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
            except RuntimeError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
