"""Tests that need a server or package the set-up installs (PostgreSQL, Ray, network namespaces):
skipped on a machine without it, failed in CI (``CI`` set: `.ci/run` exports it), never passed."""

from __future__ import annotations

import os

import pytest


def unavailable(why: str, what: str) -> None:
    """Skip the test (fail it in CI) because ``what`` cannot run here: ``why``."""
    if os.environ.get("CI"):
        pytest.fail(f"{what} cannot run in CI: {why}")
    pytest.skip(why)
