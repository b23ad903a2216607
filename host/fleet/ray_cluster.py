"""A Ray cluster of one or more nodes on this machine, for the fleet tests and benchmarks: started
with ``ray start`` in its own temporary directory, on free ports, with its own auth token, and
stopped by ending exactly the processes it started (``ray stop`` would stop every Ray here).

    with LocalCluster(nodes=2, cpus_per_node=1) as c:
        subprocess.run(["edgelearn", "fleet", "simulate", "--ray", c.address, ...], env=c.env())
        c.rss_mib()                        # resident memory of every process of the cluster

The processes are found by the temporary directory in their command lines (GCS, raylets, monitors)
and their descendants (workers, agents); ``rss_mib`` sums the same set, from /proc (Linux).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edge.errors import EdgelearnError
from host.netutil import free_port


def _procs() -> dict:
    """pid -> (ppid, cmdline) of every process we can read."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        out[int(d.name)] = (ppid, cmd)
    return out


def process_tree(roots, procs=None) -> set:
    """``roots`` and all their descendants."""
    procs = procs if procs is not None else _procs()
    kids: dict = {}
    for pid, (ppid, _) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    seen, todo = set(), [r for r in roots if r in procs]
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo += kids.get(p, [])
    return seen


def rss_mib(pids) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
                    break
        except OSError:
            continue
    return total / 1024


class LocalCluster:
    """``nodes`` Ray nodes on this machine (a head and nodes-1 more), ``cpus_per_node`` CPUs and
    ``object_store_mb`` of object store each."""

    def __init__(self, nodes: int = 2, cpus_per_node: int = 1, object_store_mb: int = 100, ray_bin=None):
        self.nodes, self.cpus, self.store_mb = nodes, cpus_per_node, object_store_mb
        self.ray = str(ray_bin or Path(sys.executable).with_name("ray"))
        self.tmp = Path(tempfile.mkdtemp(prefix="edgelearn-ray-"))
        self.token = self.tmp / "auth_token"
        self.address = None

    def env(self) -> dict:
        """The environment a driver (or ``ray start``) of this cluster needs: its token."""
        return {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token),
                "RAY_USAGE_STATS_ENABLED": "0"}

    def _start(self, args) -> None:
        p = subprocess.run([self.ray, "start", *args, f"--num-cpus={self.cpus}",
                            f"--object-store-memory={self.store_mb * 2**20}", "--disable-usage-stats",
                            f"--dashboard-agent-listen-port={free_port()}"], env=self.env(),
                           capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            tail = " | ".join((p.stderr or p.stdout).strip().splitlines()[-3:])
            raise EdgelearnError(f"`ray start` failed (exit {p.returncode}): {tail[:300]}",
                                 fix="check that Ray (edgelearn[ray]) is installed and the machine has free ports")

    def start(self) -> "LocalCluster":
        self.token.write_text(secrets.token_hex(32))
        self.token.chmod(0o600)
        port = free_port()
        try:
            self._start(["--head", f"--port={port}", f"--temp-dir={self.tmp}", "--include-dashboard=false",
                         f"--ray-client-server-port={free_port()}"])
            ip = self._node_ip()
            self.address = f"{ip}:{port}"
            for _ in range(self.nodes - 1):
                self._start([f"--address={self.address}"])
        except BaseException:
            self.stop()
            raise
        return self

    def _node_ip(self) -> str:
        for _ in range(100):
            for _, cmd in _procs().values():
                if str(self.tmp) in cmd and "--gcs-address=" in cmd:
                    return cmd.split("--gcs-address=", 1)[1].split()[0].rsplit(":", 1)[0]
            time.sleep(0.1)
        return "127.0.0.1"

    def pids(self) -> set:
        """This cluster's processes: those naming its directory (GCS, raylets, monitors) or its GCS
        address (the client server), and their descendants; never this process or its ancestors."""
        procs = _procs()
        mine, p = set(), os.getpid()
        while p > 1 and p in procs:
            mine.add(p)
            p = procs[p][0]
        marks = [str(self.tmp)] + ([f"--address={self.address}"] if self.address else [])
        roots = [p for p, (_, cmd) in procs.items() if p not in mine and any(m in cmd for m in marks)]
        return process_tree(roots, procs) - mine

    def rss_mib(self) -> float:
        return rss_mib(self.pids())

    def kill_node(self) -> set:
        """SIGKILL a node that is not the head (its raylet and everything under it: workers, agents),
        as a machine that loses power would; returns the pids killed."""
        procs = _procs()
        raylets = [p for p, (_, cmd) in procs.items() if "raylet/raylet" in cmd and str(self.tmp) in cmd
                   and "__internal_head__" not in cmd]
        if not raylets:
            raise EdgelearnError("this cluster has no node besides the head to kill", fix="start it with nodes >= 2")
        tree = process_tree(raylets[:1], procs)
        for p in tree:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return tree

    def stop(self) -> None:
        """End this cluster's processes (SIGTERM, then SIGKILL after 10 s) and remove its directory."""
        pids = self.pids()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in pids:
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass
            end = time.monotonic() + 10
            while time.monotonic() < end and any(Path(f"/proc/{p}").exists() and _alive(p) for p in pids):
                time.sleep(0.1)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
