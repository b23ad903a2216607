"""Aggregator test helpers: a real ``edgelearn aggregator serve`` process on loopback (the kill
and lock tests), a settable clock, a snapshot of every table, a signed check-in. The in-process
aggregator itself (state, transport) is production code: ``host.aggregator.inprocess``."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLES = ("meta", "devices", "rounds", "selections", "updates", "contributions", "chunks", "models")
# The shipped bundle's version and the federation's first version (the base bundle with its head as
# head.npz, ``ModelRegistry.init_from_bundle``); round k publishes FIRST + k.
BASE_VERSION = json.loads((ROOT / "models" / "kws-dscnn-s" / "manifest.json").read_text())["version"]
FIRST = BASE_VERSION + 1


class FakeClock:
    """A settable clock for ``build_app(..., clock=)``: tests move time instead of sleeping."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self):
        return self.t


def snapshot(store) -> dict:
    """Every row of every table: compare before/after to prove a request changed nothing."""
    return {t: store.all(f"SELECT * FROM {t} ORDER BY 1, 2") for t in TABLES}


def signed_checkin(device_id: str, key: bytes, state: dict | None = None) -> tuple[bytes, dict]:
    body = json.dumps({"device_id": device_id, "battery": 1.0, "charging": True, "network": "wifi",
                       **(state or {})}).encode()
    return body, {"X-Edgelearn-Device": device_id, "Content-Type": "application/json",
                  "X-Edgelearn-Mac": hmac.new(key, body, hashlib.sha256).hexdigest()}


def serve_cmd(state, port, *extra):
    return [sys.executable, "-m", "edge.cli", "aggregator", "serve", "--state", str(state), "--port", str(port),
            *map(str, extra)]


def post(port, path, body, headers, timeout: float = 20):
    """(status, JSON answer) of one POST to a serving aggregator."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", path, body=body, headers=headers)
        r = c.getresponse()
        return r.status, json.loads(r.read())
    finally:
        c.close()


def start(state: Path, port: int, *extra) -> subprocess.Popen:
    """Start the aggregator (``extra``: more `serve` options, e.g. ``--db URL``) and wait until it
    answers /v1/status (killed if it never does)."""
    p = subprocess.Popen(serve_cmd(state, port, *extra), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for _ in range(600):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/v1/status")
            if c.getresponse().status == 200:
                return p
        except OSError:
            time.sleep(0.05)
        if p.poll() is not None:
            raise AssertionError(p.stderr.read().decode())
    p.kill()
    raise AssertionError("aggregator did not start")
