"""A real ``edgelearn aggregator serve`` process on loopback, for the kill and lock tests."""

from __future__ import annotations

import http.client
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def serve_cmd(state, port):
    return [sys.executable, "-m", "edge.cli", "aggregator", "serve", "--state", str(state), "--port", str(port)]


def start(state: Path, port: int) -> subprocess.Popen:
    """Start the aggregator and wait until it answers /v1/status (killed if it never does)."""
    p = subprocess.Popen(serve_cmd(state, port), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
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
