"""firmware/ type-checks against the pinned micropython-esp32-stubs (pyright, offline)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pyright_cmd():
    exe = Path(sys.executable).with_name("pyright")
    if not exe.exists():
        return None, "pyright is not installed (dev extra)"
    import pyright
    bundled = Path(pyright.__file__).with_name("dist")
    if not bundled.is_dir():
        return None, "this pyright wheel has no bundled dist/ and would download it; no network in tests"
    if shutil.which("node") is None:
        return None, "no node on PATH; the pyright wheel would download a Node.js (no network in tests)"
    return str(exe), ""


def test_firmware_type_checks_against_esp32_stubs():
    exe, why = pyright_cmd()
    if exe is None:
        pytest.skip(why)
    stubs = list(Path(sys.executable).parents[1].glob("lib/python3*/site-packages/machine.pyi"))
    if not stubs:
        pytest.skip("micropython-esp32-stubs not installed")
    env = dict(os.environ, PYRIGHT_PYTHON_IGNORE_WARNINGS="1", NPM_CONFIG_OFFLINE="true")
    # the config names ../.venv (for an editor in a checkout); the test points pyright at the stubs
    # and interpreter of whichever environment runs it
    res = subprocess.run([exe, "-p", "pyrightconfig.json", "--typeshedpath", str(stubs[0].parent),
                          "--pythonpath", sys.executable], cwd=ROOT / "firmware", capture_output=True,
                         text=True, env=env, timeout=300)
    summary = re.search(r"(\d+) errors?, (\d+) warnings?", res.stdout)
    assert summary, res.stdout + res.stderr
    assert summary.group(1) == "0", res.stdout
