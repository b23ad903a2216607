"""QA pass 4, items 2 and 3: the aggregator's state on a read-only mount, and rounds a storage failure
left open.

Item 2: ``aggregator status`` reads only, so it works on a read-only copy of the state (a mounted
backup); ``aggregator provision`` there is one sentence, not sqlite's "unable to open database file".
Item 3: a round left "open" by a storage failure is closed as superseded when the aggregator starts,
so only the live round is open."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from aggregator_helpers import FakeClock
from host.aggregator.app import Aggregator
from host.aggregator.config import AggregatorConfig
from host.aggregator.inprocess import small_params
from host.aggregator.setup import init_state, provision


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edge.cli", "aggregator", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def read_only_state(tmp_path):
    """A served state directory (WAL database, a round open) copied onto a read-only mount.

    Root ignores file modes, so as root the copy is bind-mounted read-only; otherwise chmod suffices."""
    src = tmp_path / "agg"
    init_state(src, AggregatorConfig(round_timeout=10), params=small_params())
    provision(src, "pi-001")
    agg = Aggregator(src, FakeClock())  # opens a round, like `serve`
    agg.close()
    copy = shutil.copytree(src, tmp_path / "copy")
    if os.geteuid() != 0:
        for p in [copy, *copy.rglob("*")]:
            p.chmod(0o555 if p.is_dir() else 0o444)
        yield copy
        for p in [copy, *copy.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        return
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "--bind", str(copy), str(ro)], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here (root without mount rights)")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], capture_output=True).returncode:
            pytest.skip("cannot remount read-only here")
        yield ro
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)


def test_status_reads_a_read_only_state(read_only_state):
    res = cli("status", "--state", str(read_only_state))
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["round"]["status"] == "open", doc
    assert not any(read_only_state.glob("*.sqlite-*")) or os.geteuid() != 0


def test_provision_on_a_read_only_state_is_one_sentence(read_only_state, tmp_path):
    res = cli("provision", "--state", str(read_only_state), "--device", "pi-002", "--out", str(tmp_path / "keys"))
    assert res.returncode != 0
    assert "Traceback" not in res.stderr and "OperationalError" not in res.stderr, res.stderr
    assert "read-only" in res.stderr and "writable copy" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) <= 2, res.stderr


def test_an_orphaned_open_round_is_superseded_at_start(tmp_path):
    d = tmp_path / "agg"
    init_state(d, AggregatorConfig(round_timeout=10), params=small_params())
    agg = Aggregator(d, FakeClock())
    orphan = agg.rounds.round["round_id"]
    # What a storage failure mid-round leaves behind: the round row stays "open" while the process
    # (or, after recovery, its in-memory state) has moved on to another round.
    with agg.store.tx() as c:
        c.execute("INSERT INTO rounds(round_id, mode, model_version, status, opened, deadline, target, selected, accepted) "
                  "SELECT round_id + 100, mode, model_version, 'open', opened, deadline, target, selected, accepted "
                  "FROM rounds WHERE round_id=?", (orphan,))
    agg.close()
    agg = Aggregator(d, FakeClock())
    try:
        rows = agg.store.all("SELECT round_id, status FROM rounds ORDER BY round_id")
        live = agg.rounds.round["round_id"]
    finally:
        agg.close()
    open_rounds = [r for r, s in rows if s == "open"]
    assert open_rounds == [live], rows
