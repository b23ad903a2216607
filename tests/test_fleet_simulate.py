"""A small fleet over real loopback HTTP with the real client: rounds close, accuracy is measured,
drop-outs and late uploads happen and are refused cleanly, plots are written."""

from __future__ import annotations

import numpy as np
import pytest

from host.fleet.data import EmbeddingSet
from host.fleet.plots import write_report
from host.fleet.simulate import SimConfig, simulate


def synthetic_set(seed=0, voices=8, per=40, classes=37, dim=64):
    rng = np.random.default_rng(seed)
    means = np.abs(rng.standard_normal((classes, dim))) * 2
    X, y, v, s = [], [], [], []
    for split, nv in (("train", voices), ("test", 2)):
        for k in range(nv):
            lab = rng.integers(0, classes, per)
            X.append(np.maximum(means[lab] + rng.standard_normal((per, dim)), 0))
            y.append(lab)
            v += [f"{split}:{k}"] * per
            s += [split] * per
    return EmbeddingSet(np.concatenate(X).astype(np.float32), np.concatenate(y).astype(np.int16),
                        np.array(v), np.array(s))


@pytest.mark.slow
def test_small_fleet_runs_rounds_with_dropouts_and_writes_plots(tmp_path):
    cfg = SimConfig(devices=8, rounds=3, clients_per_round=3, drop_rate=0.3, slow_fraction=0.2,
                    time_scale=0.01, round_timeout=60, eval_tolerance=1.0)
    res = simulate(cfg, tmp_path / "out", data=synthetic_set(), progress=False)
    done = [r for r in res["rounds"] if r["status"] in ("closed", "rejected")]
    assert len(done) >= 3
    # adaptive over-selection: never more than max_overselect (3.0) times the quorum
    assert all(r["accepted"] <= r["target"] and r["selected"] <= 9 for r in res["rounds"])
    assert res["bytes_up"] > 0 and sum(res["participation"]) == res["stats"]["uploads"]
    assert set(res["stats"].get("refused", {})) <= {"StaleRound", "AlreadyContributed"}
    paths = write_report(res, tmp_path / "out")
    assert (tmp_path / "out" / "fleet.png").stat().st_size > 10000
    assert "Fleet simulation" in open(paths["html"]).read()


@pytest.mark.slow
def test_fleet_with_secure_aggregation_closes_rounds_without_storing_updates(tmp_path):
    cfg = SimConfig(devices=8, rounds=2, clients_per_round=3, drop_rate=0.0, slow_fraction=0.0,
                    time_scale=0.01, round_timeout=120, eval_tolerance=1.0,
                    extra={"secure_aggregation": True, "max_overselect": 1.3})
    res = simulate(cfg, tmp_path / "out", data=synthetic_set(), progress=False)
    done = [r for r in res["rounds"] if r["status"] in ("closed", "rejected")]
    # a secure round reveals a sum only with more than half of those that advertised keys, and at least 2
    assert len(done) >= 2 and all(r["accepted"] >= 2 for r in done)
    assert all(r["note"] == "secure aggregation" for r in done)


def _device(battery, phase, seed=0):
    from host.fleet.simulate import Device

    d = Device(0, None, np.random.default_rng(seed), SimConfig())
    d.battery, d.phase = battery, phase
    return d


def test_a_simulated_battery_drains_with_time_and_training_not_with_check_ins():
    from host.aggregator.checkin import validate_checkin
    from host.fleet.simulate import CHARGE_PER_HOUR, TRAIN_COST

    d = _device(0.6, phase=12.0)  # noon: off the charger for the next 12 hours
    states = [d.state(t) for t in np.linspace(0, 60, 600)]  # 600 check-ins in one simulated minute
    assert not any(s["charging"] for s in states)
    assert 0.6 - d.battery == pytest.approx(d.drain / 60, rel=1e-6) and 0.02 <= d.drain <= 0.06
    d.trained()
    assert d.battery == pytest.approx(0.6 - d.drain / 60 - TRAIN_COST)
    # a battery that runs flat stays at 0 (a negative one would be refused as a malformed check-in)
    flat = _device(0.01, phase=12.0)
    for _ in range(3):
        flat.trained()
    s = flat.state(11 * 3600)
    assert s["battery"] == 0.0 and validate_checkin("dev0", {"device_id": "dev0", **s})["battery"] == 0.0
    night = _device(0.2, phase=1.0)  # 1 am: on the charger
    assert night.state(0)["charging"] and night.state(1800)["battery"] == pytest.approx(0.2 + CHARGE_PER_HOUR / 2)


@pytest.mark.slow
def test_a_round_gap_moves_devices_clocks_so_devices_off_the_charger_join_later(tmp_path):
    """Only devices on the charger may train here (``min_battery`` 1.0). Back to back, every round is
    over within simulated minutes, so only those charging at the start ever join; with rounds 4 h apart
    (``round_gap``) the devices' clocks pass their overnight windows and others join too."""
    from host.fleet.simulate import Device, device_clock

    cfg = SimConfig(devices=12, rounds=6, clients_per_round=2, drop_rate=0.0, slow_fraction=0.0,
                    time_scale=0.01, round_timeout=60, eval_tolerance=1.0, extra={"min_battery": 1.0})
    # the simulator draws each device's schedule from [seed, index]: those on the charger at time 0
    phases = [Device(i, None, np.random.default_rng([cfg.seed, i]), cfg).phase for i in range(cfg.devices)]
    at_start = {i for i, p in enumerate(phases) if p % 24 < 8}
    assert at_start and len(at_start) < cfg.devices
    joined = {}
    for gap in (0.0, 4 * 3600.0):
        res = simulate(SimConfig(**{**cfg.__dict__, "round_gap": gap}), tmp_path / f"gap{gap:.0f}",
                       data=synthetic_set(), progress=False)
        joined[gap] = {i for i, n in enumerate(res["participation"]) if n}
    assert joined[0.0] and joined[0.0] <= at_start
    assert joined[4 * 3600.0] - at_start, (joined, at_start)
    assert device_clock(30.0, 3, SimConfig(round_gap=3600)) == 30.0 + 3 * 3600


def test_a_bad_round_gap_is_one_sentence(tmp_path):
    from edge.errors import EdgelearnError

    for gap in (-1.0, float("nan"), float("inf")):
        with pytest.raises(EdgelearnError, match="round gap"):
            simulate(SimConfig(devices=4, rounds=1, round_gap=gap), tmp_path, data=synthetic_set(), progress=False)
    from host.fleet.ray_sim import _check  # Ray's devices follow the driver's clock alone: refused there

    with pytest.raises(EdgelearnError, match="round gap"):
        _check(SimConfig(devices=4, clients_per_round=2, round_gap=3600))


def _fleet_cli(*args, timeout=300):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "edge.cli", "fleet", "simulate", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_fleet_simulate_runs_on_an_embeddings_file_and_refuses_a_bad_one_in_one_sentence(tmp_path):
    """``--embeddings FILE.npz`` replaces the corpus embeddings (which, uncached, take ~15 min to render);
    a missing, foreign or mis-shaped file is one sentence, before any fleet starts."""
    data = synthetic_set()
    good = tmp_path / "emb.npz"
    np.savez(good, X=data.X, y=data.y, voice=data.voice, split=data.split)
    out = tmp_path / "out"
    r = _fleet_cli("--devices", "6", "--rounds", "1", "--clients-per-round", "3", "--drop-rate", "0",
                   "--slow-fraction", "0", "--time-scale", "0.01", "--eval-tolerance", "1.0",
                   "--embeddings", str(good), "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "data synth" not in r.stderr and "fleet data: embedding" not in r.stderr
    import json

    res = json.loads((out / "fleet.json").read_text())
    assert any(x["status"] == "closed" for x in res["rounds"]) and res["bytes_up"] > 0

    bad = {
        "missing.npz": None,
        "text.npz": b"not a zip",
        "no_split.npz": dict(X=data.X, y=data.y, voice=data.voice),
        "wide.npz": dict(X=np.zeros((len(data.y), 65), np.float32), y=data.y, voice=data.voice, split=data.split),
        "labels.npz": dict(X=data.X, y=data.y + 40, voice=data.voice, split=data.split),
        "short.npz": dict(X=data.X[:5], y=data.y, voice=data.voice, split=data.split),
        "no_test.npz": dict(X=data.X, y=data.y, voice=data.voice, split=np.full(len(data.y), "train")),
    }
    says = {"missing.npz": "no such embeddings file", "text.npz": "not a readable .npz",
            "no_split.npz": "has no array split", "wide.npz": "65 wide", "labels.npz": "labels 40 to",
            "short.npz": "X is (5, 64)", "no_test.npz": "no rows in split(s) test"}
    for name, content in bad.items():
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            np.savez(path, **content)
        r = _fleet_cli("--devices", "6", "--clients-per-round", "3", "--embeddings", str(path),
                       "--out", str(tmp_path / "o2"), timeout=120)
        assert r.returncode == 2, (name, r.stderr[-2000:])
        assert says[name] in r.stderr and "Traceback" not in r.stderr, (name, r.stderr[-2000:])
        assert len(r.stderr.strip().splitlines()) == 1, (name, r.stderr)
        assert not (tmp_path / "o2" / "fleet.json").exists()
