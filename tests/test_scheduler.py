"""The sysfs scheduler on fake trees and recorded battery/thermal traces (tests/data/sched_trace_*.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edge.adapt import EmbeddingHead, Trainer
from edge.adapt.run import train
from edge.adapt.store import AdaptStore
from edge.portable.schedule import SchedulePolicy
from edge.scheduler import Scheduler, joules_per_step, profile_pj_per_mac, read_sysfs

DATA = Path(__file__).resolve().parent / "data"
ROOT = Path(__file__).resolve().parents[1]


def write_tree(root: Path, rec: dict) -> None:
    """Lay out one trace record as sysfs files (value None = unreadable, 'absent' = no battery)."""
    ps = root / "sys/class/power_supply"
    for d in ("BAT0", "AC"):
        if (ps / d).exists():
            for f in (ps / d).iterdir():
                f.unlink() if f.is_file() else f.rmdir()
    (ps / "AC").mkdir(parents=True, exist_ok=True)
    (ps / "AC/type").write_text("Mains\n")
    (ps / "AC/online").write_text(f"{rec['ac']}\n")
    if rec["capacity"] != "absent":
        (ps / "BAT0").mkdir(exist_ok=True)
        (ps / "BAT0/type").write_text("Battery\n")
        if rec["capacity"] is None:
            (ps / "BAT0/capacity").mkdir()  # exists but unreadable: a directory
        else:
            (ps / "BAT0/capacity").write_text(f"{rec['capacity']}\n")
        (ps / "BAT0/status").write_text(rec["status"] + "\n")
    elif (ps / "BAT0").exists():
        (ps / "BAT0").rmdir()
    tz = root / "sys/class/thermal/thermal_zone0"
    tz.mkdir(parents=True, exist_ok=True)
    if (tz / "temp").exists():
        (tz / "temp").unlink()
    if rec["temp_mC"] is not None:
        (tz / "temp").write_text(f"{rec['temp_mC']}\n")


def replay_trace(name, tmp_path):
    recs = [json.loads(line) for line in (DATA / name).read_text().splitlines()]
    now = {"t": 0.0, "idle": 0}
    sch = Scheduler(tmp_path / "state", sysfs_root=tmp_path / "sysfs", idle_s=lambda: now["idle"],
                    clock=lambda: now["t"])
    got = []
    for rec in recs:
        write_tree(tmp_path / "sysfs", rec)
        now.update(t=rec["t"], idle=rec["idle_s"])
        got.append(sch.decide().action)
    return recs, got, sch


@pytest.mark.parametrize("trace", sorted(p.name for p in DATA.glob("sched_trace_*.jsonl")))
def test_follows_recorded_traces(trace, tmp_path):
    recs, got, sch = replay_trace(trace, tmp_path)
    assert got == [r["expect"] for r in recs]
    log = [json.loads(line) for line in sch.log_path.read_text().splitlines()]
    assert len(log) == len(recs) and all(entry["reason"] for entry in log)


def test_unreadable_files_are_logged_as_unknown(tmp_path, caplog):
    write_tree(tmp_path, {"ac": 1, "capacity": None, "status": "Charging", "temp_mC": "junk"})
    r, problems = read_sysfs(tmp_path, 0.0, 100)
    assert r.battery_pct is None and r.temp_c is None
    assert any("capacity" in p for p in problems) and any("not a number" in p for p in problems)
    r, problems = read_sysfs(tmp_path / "nothing-here", 0.0, 100)
    assert r.has_battery is None and r.temp_c is None and len(problems) == 2
    sch = Scheduler(tmp_path / "st", sysfs_root=tmp_path / "nothing-here", idle_s=lambda: 100)
    with caplog.at_level("WARNING"):
        d = sch.decide()
    assert d.action == "pause" and "unknown" in d.reason and "missing" in caplog.text


def test_budget_survives_a_restart(tmp_path):
    write_tree(tmp_path / "sysfs", {"ac": 1, "capacity": "absent", "status": "", "temp_mC": 40000})
    pol = lambda: SchedulePolicy(daily_budget_j=1.0, joules_per_step=0.01, max_steps=1000)  # noqa: E731
    a = Scheduler(tmp_path / "st", tmp_path / "sysfs", idle_s=lambda: 999, clock=lambda: 500.0, policy=pol())
    assert a.decide().steps == 100
    a.spend(70)
    b = Scheduler(tmp_path / "st", tmp_path / "sysfs", idle_s=lambda: 999, clock=lambda: 600.0, policy=pol())
    assert b.decide().steps == 30


def test_energy_from_profile():
    pj = profile_pj_per_mac(ROOT / "host/profiles/rpi4.toml")
    assert pj > 0 and joules_per_step(pj) == pytest.approx(3 * 32 * (125 * 64 * 73 + 64 * 37) * pj * 1e-12)


class FakeBundle:
    model_id, version = "m", 1


def test_training_pauses_when_it_gets_hot_and_resumes_intact(tmp_path):
    """A thermal trace played one reading per training step: pause at 71 C, resume below 60 C."""
    temps = [45, 50, 58, 65, 71.5, 69, 64, 61, 59, 55, 50] + [48] * 200
    i = {"k": 0}
    clock = {"t": 0.0}

    def tick():
        write_tree(tmp_path / "sysfs", {"ac": 1, "capacity": "absent", "status": "",
                                        "temp_mC": int(temps[min(i["k"], len(temps) - 1)] * 1000)})
        i["k"] += 1
        clock["t"] += 1
        return sch.should_continue()

    sch = Scheduler(tmp_path / "st", tmp_path / "sysfs", idle_s=lambda: 999, clock=lambda: clock["t"])
    rng = np.random.default_rng(0)
    base = {"proj.w": np.eye(8, dtype=np.float32), "proj.b": np.zeros(8, np.float32),
            "classifier.w": rng.standard_normal((8, 4)).astype(np.float32), "classifier.b": np.zeros(4, np.float32)}
    x, y = np.abs(rng.standard_normal((32, 8))).astype(np.float32), rng.integers(0, 4, 32)
    store = AdaptStore(tmp_path / "st", FakeBundle)
    statuses = []
    for _ in range(20):
        tr = Trainer(EmbeddingHead(base), "full", "adam")
        res = train(tr, x, y, store, "ctx", steps=12, batch=8, should_continue=tick, checkpoint_every=100)
        statuses.append((res["status"], res["steps_done"]))
        if res["status"] == "done":
            break
    assert statuses[0] == ("paused", 4)  # four good readings, then 71.5 C
    assert statuses[-1] == ("done", 12)
    ref_store = AdaptStore(tmp_path / "ref", FakeBundle)
    train(Trainer(EmbeddingHead(base), "full", "adam"), x, y, ref_store, "ctx", steps=12, batch=8)
    for k, v in ref_store.load("ctx").items():
        np.testing.assert_allclose(store.load("ctx")[k], v, atol=1e-6)
    log = [json.loads(line)["action"] for line in sch.log_path.read_text().splitlines()]
    assert "pause" in log and log.index("pause") == 4
