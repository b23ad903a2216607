"""``device adapt`` killed at every durable write of a run: the next run equals a clean run.

A run is stopped (``os._exit``, no cleanup, like kill -9 or a power cut) at the k-th write of
``edge.atomic`` (each atomic write once its temp file is durable and once it is in place; each
rename and deletion of a commit once done), then the same command runs again. Whatever k, that
second run reports what a clean run reports (status, steps_done, loss, version) and leaves the
same state: the same versions and pointer, the same replay buffer, the energy of each committed
run charged exactly once, no checkpoint, no temp or staged file. A run killed before its commit
is as if it never ran (the next run is the clean first run); one killed after it is committed
(the next run is a clean second run).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from devstate_helpers import make_data, make_sysfs, run_device

ROOT = Path(__file__).resolve().parents[1]
STEPS = "60"  # past one periodic checkpoint (every 50 steps)

DRIVER = r"""
import os, sys
k, stage, log = int(sys.argv[1]), sys.argv[2], sys.argv[3]
n = [0]

def hook(event, path):
    if event == "begin":
        n[0] += 1
        if log != "-":
            with open(log, "a") as f:
                f.write(str(path) + "\n")
    if n[0] == k and event == stage:
        os._exit(137)

import edge.store as S
if S.atomic_write.__module__ == "edge.atomic":
    import edge.atomic as A
    A.fault_hook = hook
else:  # the code before edge.atomic: wrap its one helper
    real = S.atomic_write
    def wrapped(path, data):
        hook("begin", path)
        real(path, data)
        hook("done", path)
    S.atomic_write = wrapped
from edge.cli import main
sys.exit(main(sys.argv[4:]))
"""


def adapt_args(w, state):
    return ["adapt", "--state", state, "--data", w["data"], "--sysfs-root", w["sysfs"], "--steps", STEPS]


def killed_run(w, state, k, stage, log="-"):
    r = subprocess.run([sys.executable, "-c", DRIVER, str(k), stage, str(log), "device", *map(str, adapt_args(w, state))],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode in (0, 137), r.stderr
    return r.returncode == 137


def result(out: str) -> dict:
    res = json.loads(out)
    return {k: res.get(k) for k in ("status", "steps_done", "version", "loss", "loss_first")}


def _npz(path):
    with np.load(path) as z:
        return {k: z[k].copy() for k in z.files}


def snapshot(state: Path) -> dict:
    """What a run leaves, comparably (the scheduler log and the lock are not compared)."""
    from edge.portable.schedule import SchedulePolicy

    snap = {}
    for p in sorted(state.rglob("*")):
        rel = str(p.relative_to(state))
        if p.is_dir() or rel.startswith("scheduler.log") or p.name == ".lock":
            continue
        if p.name == "scheduler.state":
            data = p.read_bytes()
            pol = SchedulePolicy()
            pol.load_state(data[:13])
            snap[rel] = ("spent_mj", round(pol.spent_mj, 6), "charges", data[13:])
        elif p.suffix == ".npz":
            snap[rel] = _npz(p)
        elif p.name == "active.json":
            snap[rel] = json.loads(p.read_text())
        else:
            snap[rel] = p.read_bytes()
    return snap


def same(a: dict, b: dict) -> list[str]:
    diffs = [f"only in one: {sorted(set(a) ^ set(b))}"] if set(a) != set(b) else []
    for k in sorted(set(a) & set(b)):
        x, y = a[k], b[k]
        if isinstance(x, dict) and x and all(isinstance(v, np.ndarray) for v in x.values()):
            if set(x) != set(y) or any(not np.array_equal(x[n], y[n]) for n in x):
                diffs.append(f"{k} differs")
        elif x != y:
            diffs.append(f"{k} differs")
    return diffs


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("crash")
    w = {"data": make_data(base / "data"), "sysfs": make_sysfs(base / "sysfs"), "base": base}
    clean = base / "clean"
    w["first"] = result(run_device(adapt_args(w, clean)))  # C: a clean first run
    w["after_first"] = snapshot(clean)
    w["second"] = result(run_device(adapt_args(w, clean)))  # D: a clean second run
    w["after_second"] = snapshot(clean)
    assert w["first"]["status"] == "done" and w["first"]["version"] == 1 and w["second"]["version"] == 2
    log = base / "writes.log"
    assert not killed_run(w, base / "count", 0, "none", log)
    w["writes"] = [str(Path(p).relative_to(base / "count")) for p in log.read_text().splitlines()]
    return w


def test_a_kill_at_any_write_then_the_same_command_equals_a_clean_run(world, tmp_path):
    import edge.store

    # each write once its temp file is durable and once it is in place (older code: before and after)
    stages = ("tmp", "done") if edge.store.atomic_write.__module__ == "edge.atomic" else ("begin", "done")
    failures, points = [], 0
    for k in range(1, len(world["writes"]) + 1):
        for stage in stages:
            state = tmp_path / f"k{k}-{stage}"
            if not killed_run(world, state, k, stage):
                continue  # this write has no such moment (a rename, a deletion)
            points += 1
            meta = state / "adapt" / "active.json"
            committed = meta.exists() and json.loads(meta.read_text())["contexts"].get("default", {}).get("current") == 1
            want, want_state = (world["second"], world["after_second"]) if committed else \
                (world["first"], world["after_first"])
            try:
                got = result(run_device(adapt_args(world, state)))
            except Exception as e:  # noqa: BLE001 - recorded, then the next point
                failures.append(f"write {k} ({world['writes'][k - 1]}) at {stage}: the next run failed: {e}")
                continue
            what = f"write {k} ({world['writes'][k - 1]}) at {stage}" \
                   f" ({'after' if committed else 'before'} the commit)"
            if got != want:
                failures.append(f"{what}: next run {got}, a clean run {want}")
            diffs = same(snapshot(state), want_state)
            if diffs:
                failures.append(f"{what}: state {diffs}")
            shutil.rmtree(state)
    assert points >= 2 * len(world["writes"]) - 3, points
    assert not failures, "\n".join(failures)


def test_stale_temp_files_are_swept_and_a_live_writers_are_kept(tmp_path):
    from edge import atomic

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / f".active.json.{dead}.k2j3_x.tmp").write_bytes(b"half")
    (tmp_path / f".replay_tail.bin.{os.getpid()}.abcd.tmp").write_bytes(b"mine, in flight")
    (tmp_path / ".keywords.json.a1b2c3d4").write_bytes(b"older naming")
    old = time.time() - 120
    os.utime(tmp_path / ".keywords.json.a1b2c3d4", (old, old))
    (tmp_path / ".notes.txt.abc").write_text("a user's file")
    (tmp_path / "keywords.json").write_text("{}")
    gone = {p.name for p in atomic.sweep_temp(tmp_path)}
    assert gone == {f".active.json.{dead}.k2j3_x.tmp", ".keywords.json.a1b2c3d4"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f".replay_tail.bin.{os.getpid()}.abcd.tmp", ".notes.txt.abc", "keywords.json"])


def test_recovery_removes_uncommitted_leftovers_and_nothing_else(world, tmp_path):
    """A staged version nothing names goes; a rolled-back version and the user's files stay."""
    state = tmp_path / "st"
    run_device(adapt_args(world, state))
    run_device(adapt_args(world, state))
    run_device(["adapt", "--state", state, "--rollback", "--context", "default"])
    pend = state / "adapt" / "pending"
    pend.mkdir(exist_ok=True)
    (pend / "default.v3.npz").write_bytes(b"a run that never committed")
    (state / "adapt" / "notes.txt").write_text("mine")
    out = result(run_device(adapt_args(world, state)))
    assert out["version"] == 3  # numbered after every version on disk, the rolled-back v2 included
    assert not list(pend.iterdir())
    assert (state / "adapt" / "default" / "v2.npz").exists() and (state / "adapt" / "notes.txt").exists()
    meta = json.loads((state / "adapt" / "active.json").read_text())
    assert meta["contexts"]["default"] == {"current": 3, "previous": 1} and "pending" not in meta


def test_a_pause_and_its_resume_are_charged_once_in_all(world, tmp_path):
    """A paused run books the steps it ran; the resumed run books only the rest."""
    from unittest import mock

    from edge.scheduler import Scheduler

    state = tmp_path / "st"
    answers = iter([True] * 20 + [False])
    with mock.patch("edge.scheduler.Scheduler.should_continue", lambda self: next(answers, True)):
        assert result(run_device(adapt_args(world, state)))["status"] == "paused"
        res = result(run_device(adapt_args(world, state)))
    assert res == world["first"]  # resumed exactly, and it reports the run's first loss
    spent = Scheduler(state).policy.spent_mj
    clean = Scheduler(world["base"] / "one")
    clean.spend(int(STEPS))
    assert spent == pytest.approx(clean.policy.spent_mj)
