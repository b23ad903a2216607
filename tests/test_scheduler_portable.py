"""The portable scheduling policy: thresholds, hysteresis, unknowns, budget, persistence, MicroPython."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge.portable.schedule import PAUSE, TRAIN, WAIT, Readings, SchedulePolicy

ROOT = Path(__file__).resolve().parents[1]


def good(**kw):
    base = dict(battery_pct=90, charging=True, on_mains=True, has_battery=True, temp_c=40.0,
                idle_s=600, now_s=1000)
    base.update(kw)
    return Readings(**base)


def test_good_conditions_train_within_budget():
    pol = SchedulePolicy(daily_budget_j=1.0, joules_per_step=0.01, max_steps=500)
    d = pol.decide(good())
    assert d.action == TRAIN and d.steps == 100 and d.reason.startswith("ok:")


def test_temperature_hysteresis():
    pol = SchedulePolicy(temp_pause_c=70, temp_resume_c=60, temp_throttle_c=55, max_steps=100)
    seq = [50, 69, 71, 65, 61, 59, 65]
    acts = [pol.decide(good(temp_c=t)).action for t in seq]
    assert acts == [TRAIN, TRAIN, PAUSE, PAUSE, PAUSE, TRAIN, TRAIN]
    assert pol.decide(good(temp_c=65)).steps == 50  # warm: throttled to half


def test_unknowns_are_conservative_and_explained():
    pol = SchedulePolicy(max_steps=100)
    d = pol.decide(good(battery_pct=None))
    assert d.action == PAUSE and "unknown" in d.reason
    d = pol.decide(good(charging=None, on_mains=None))
    assert d.action == PAUSE and "charging state unknown" in d.reason
    d = pol.decide(good(idle_s=None))
    assert d.action == WAIT and "idleness unknown" in d.reason
    d = pol.decide(good(temp_c=None))
    assert d.action == TRAIN and d.steps == 25 and "temperature unknown" in d.reason


def test_battery_rules():
    pol = SchedulePolicy(min_battery_pct=50, min_battery_charging_pct=20)
    assert pol.decide(good(battery_pct=40, charging=False, on_mains=False)).action == PAUSE
    assert pol.decide(good(battery_pct=40, charging=True)).action == TRAIN
    assert pol.decide(good(battery_pct=10, charging=True)).action == PAUSE
    assert pol.decide(good(battery_pct=None, has_battery=False, charging=None)).action == TRAIN


def test_idle_and_daily_budget_reset():
    pol = SchedulePolicy(daily_budget_j=0.5, joules_per_step=0.01, max_steps=1000, min_idle_s=30)
    assert pol.decide(good(idle_s=5)).action == WAIT
    d = pol.decide(good())
    assert d.steps == 50
    pol.spend(50, 1000)
    d = pol.decide(good(now_s=2000))
    assert d.action == WAIT and "budget spent" in d.reason
    assert pol.decide(good(now_s=86400 + 5)).steps == 50  # a new day


def test_state_roundtrip_keeps_budget_and_hysteresis():
    pol = SchedulePolicy(daily_budget_j=0.5, joules_per_step=0.01)
    pol.decide(good(temp_c=80))
    pol.spend(20, 1000)
    again = SchedulePolicy(daily_budget_j=0.5, joules_per_step=0.01)
    again.load_state(pol.state_bytes())
    assert again.hot and again.remaining_j(1000) == pytest.approx(0.3)
    with pytest.raises(ValueError):
        again.load_state(b"junk")


def test_bad_configuration():
    with pytest.raises(ValueError, match="hysteresis"):
        SchedulePolicy(temp_pause_c=60, temp_resume_c=65)


TRACE = """
from edge.portable.schedule import SchedulePolicy, Readings
pol = SchedulePolicy(daily_budget_j=0.5, joules_per_step=0.01, max_steps=40)
for t, b, ch, idle in ((40, 90, 1, 600), (72, 90, 1, 600), (65, 90, 1, 600), (58, 45, 0, 600),
                       (58, 80, 1, 5), (58, 80, 1, 100), (None, 80, 1, 100)):
    d = pol.decide(Readings(battery_pct=b, charging=bool(ch), on_mains=bool(ch), has_battery=True,
                            temp_c=t, idle_s=idle, now_s=500))
    if d.steps:
        pol.spend(d.steps, 500)
    print(d.action, d.steps, d.reason)
print(pol.state_bytes().hex())
"""


@pytest.mark.micropython
def test_same_decisions_on_micropython(micropython):
    board = micropython(TRACE, heap="100k", path=[ROOT])
    ns: dict = {}
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(TRACE, ns)
    assert board == buf.getvalue()
