"""Numeric options of ``device adapt`` / ``device detect`` are range-checked (at parsing and in the
Python API, one rule: ``edge.options``); a diverging adaptation run is not committed; the
scheduler warns about a missing sensor once per run and says why it ran fewer steps than asked."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from devstate_helpers import make_data, make_sysfs

from edge.cli import main
from edge.errors import EdgelearnError

BAD_ADAPT = [("--lr", "-1"), ("--lr", "0"), ("--lr", "nan"), ("--lr", "inf"), ("--steps", "0"),
             ("--steps", "-5"), ("--rank", "0"), ("--rank", "-1"), ("--replay-bytes", "-1"),
             ("--replay-bytes", "0"), ("--memory-budget", "0"), ("--augment", "-1"),
             ("--negative-share", "1.5"), ("--distill", "1.5"), ("--steps", "2.5")]
BAD_DETECT = [("--threshold", "-1"), ("--threshold", "1.5"), ("--threshold", "nan"), ("--threshold", "inf"),
              ("--stride", "0"), ("--stride", "1000"), ("--stride", "17"), ("--confirm", "-5"),
              ("--confirm", "1.5"), ("--sensitivity", "-1"), ("--sensitivity", "0"), ("--sensitivity", "nan")]


def refused_at_parsing(argv, capsys, flag):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    [line] = [ln for ln in err.splitlines() if "error:" in ln]  # argparse's one sentence, naming the option
    assert f"argument {flag}:" in line
    return line


@pytest.mark.parametrize("flag,value", BAD_ADAPT)
def test_device_adapt_refuses_a_nonsense_number_at_parsing(flag, value, capsys, tmp_path):
    state = tmp_path / "st"
    refused_at_parsing(["device", "adapt", "--state", str(state), "--data", str(tmp_path), "--force",
                        flag, value], capsys, flag)
    assert not state.exists()  # nothing read or written


@pytest.mark.parametrize("flag,value", BAD_DETECT)
def test_device_detect_refuses_an_out_of_range_option_at_parsing(flag, value, capsys, tmp_path):
    state = tmp_path / "st"
    refused_at_parsing(["device", "detect", "--state", str(state), "--wav", str(tmp_path / "a.wav"),
                        flag, value], capsys, flag)
    assert not state.exists()


def test_threshold_and_confirm_out_of_range_together_feed_nothing(capsys, tmp_path):
    # QA: --threshold -1 --confirm -5 put every window of everyday audio in the replay buffer as a command
    line = refused_at_parsing(["device", "detect", "--state", str(tmp_path / "st"), "--wav", str(tmp_path / "a.wav"),
                               "--threshold", "-1", "--confirm", "-5"], capsys, "--threshold")
    assert "[0, 1]" in line
    refused_at_parsing(["device", "run", "--state", str(tmp_path / "st"), "--wav", str(tmp_path / "a.wav"),
                        "--confirm", "-5"], capsys, "--confirm")


def test_the_boundaries_parse():
    from devstate_helpers import parse

    a = parse(["detect", "--state", "st", "--wav", "a.wav", "--threshold", "0", "--confirm", "1", "--stride", "16"])
    assert (a.threshold, a.confirm, a.stride) == (0.0, 1.0, 16)
    a = parse(["adapt", "--state", "st", "--lr", "1e-4", "--steps", "1", "--rank", "1", "--distill", "0"])
    assert (a.lr, a.steps, a.rank, a.distill) == (1e-4, 1, 1, 0.0)


@pytest.mark.parametrize("option,value", [("lr", -1), ("lr", 0.0), ("lr", float("nan")), ("steps", 0),
                                          ("steps", -5), ("rank", 0), ("replay_bytes", 0), ("replay_bytes", -1),
                                          ("memory_budget", 0), ("negative_share", 1.0), ("distill", -0.1),
                                          ("negative_distill", 2.0), ("augment", -1), ("seed", -1),
                                          ("steps", 2.5), ("lr", "fast")])
def test_device_adapt_refuses_the_same_in_python(option, value, tmp_path):
    from edge.device import Device

    data = make_data(tmp_path / "data", per_label=1)  # clips it would train on
    with pytest.raises(EdgelearnError) as e:
        Device(tmp_path / "st").adapt(data, force=True, steps=2 if option != "steps" else value, **{
            k: v for k, v in {option: value}.items() if k != "steps"})
    assert "\n" not in str(e.value) and e.value.fix and option.replace("_", "-") in str(e.value).replace("_", "-")
    assert not (tmp_path / "st").exists()  # refused before anything was read or written


@pytest.mark.parametrize("option,value", [("threshold", -1), ("threshold", 1.5), ("threshold", float("inf")),
                                          ("threshold", {"yes": -0.5}), ("stride", 1000), ("stride", 0),
                                          ("confirm", -5), ("confirm", float("nan")), ("sensitivity", -1),
                                          ("sensitivity", float("inf"))])
def test_device_detect_refuses_the_same_in_python(option, value, tmp_path):
    from edge.device import Device

    dev = Device(tmp_path / "st")
    for call in (lambda: dev.detect(np.zeros(16000, np.int16), **{option: value}),
                 lambda: dev.detector(**{option: value})):
        with pytest.raises(EdgelearnError) as e:
            call()
        assert f"--{option} " in str(e.value)  # the option and its range, not a later symptom
    assert not (tmp_path / "st").exists()


# -- a diverging run ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def adapted(tmp_path_factory):
    """A state with one committed version of the default context (bias-only on noise clips)."""
    from edge.device import Device

    base = tmp_path_factory.mktemp("diverge")
    data = make_data(base / "data")
    dev = Device(base / "st")
    assert dev.adapt(data, steps=5, force=True)["status"] == "done"
    return dev, data


def _files(state: Path) -> dict:
    return {str(p.relative_to(state)): p.read_bytes() for p in sorted((state / "adapt").rglob("*"))
            if p.is_file() and p.name != ".lock" and not p.name.startswith("features-")}


@pytest.mark.parametrize("lr,steps", [(1e30, 20), (1e38, 60)])
def test_a_diverging_run_is_not_committed_and_leaves_no_checkpoint(adapted, lr, steps):
    dev, data = adapted
    before = _files(dev.state_dir)
    current = json.loads((dev.state_dir / "adapt" / "active.json").read_text())["contexts"]["default"]["current"]
    replay = (dev.state_dir / "replay_tail.bin").read_bytes()
    res = dev.adapt(data, lr=lr, steps=steps, force=True)
    assert res["status"] == "diverged" and "lower --lr" in res["reason"] and "version" not in res
    assert _files(dev.state_dir) == before  # no new version, the same one active, no checkpoint
    assert not (dev.state_dir / "adapt" / "checkpoint.npz").exists()
    assert (dev.state_dir / "replay_tail.bin").read_bytes() == replay  # the run's clips were not added
    assert dev.adapt(data, steps=3, force=True)["version"] == current + 1  # a sane run goes on from there


def test_a_diverging_run_exits_non_zero_on_the_command(adapted, capsys):
    """`device adapt --lr 1e30`: the result is printed and the exit status says nothing was committed."""
    from edge.cli import main

    dev, data = adapted
    rc = main(["device", "adapt", "--state", str(dev.state_dir), "--data", str(data), "--lr", "1e30",
               "--steps", "20", "--force"])
    out, err = capsys.readouterr()
    assert rc == 1 and json.loads(out)["status"] == "diverged" and "lower --lr" in err and "Traceback" not in err


def test_a_non_finite_checkpoint_is_reported_once_and_removed(adapted, caplog):
    from edge.adapt.store import AdaptStore
    from edge.atomic import npz_bytes

    dev, _ = adapted
    path = dev.state_dir / "adapt" / "checkpoint.npz"
    info = np.frombuffer(json.dumps({"context": "default"}).encode(), np.uint8)
    path.write_bytes(npz_bytes({"delta/pw4_b": np.full(64, np.nan, np.float32), "__info__": info}))
    store = AdaptStore(dev.state_dir, dev.bundle)
    with caplog.at_level(logging.WARNING, logger="edgelearn.adapt"):
        assert store.load_checkpoint() == (None, None)
        assert store.load_checkpoint() == (None, None)
    assert not path.exists()
    assert len([r for r in caplog.records if "checkpoint.npz" in r.getMessage()]) == 1


# -- the scheduler -------------------------------------------------------------------------------------

def test_a_missing_thermal_zone_is_warned_once_and_the_cut_is_explained(tmp_path, caplog):
    from edge.device import Device

    sysfs = make_sysfs(tmp_path / "sysfs")
    for p in sorted((sysfs / "sys/class/thermal").rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    data = make_data(tmp_path / "data")
    with caplog.at_level(logging.WARNING, logger="edgelearn.scheduler"):
        res = Device(tmp_path / "st", sysfs_root=sysfs).adapt(data)  # the plain recipe: 200 steps asked
    warned = [r for r in caplog.records if "no thermal zones" in r.getMessage()]
    assert len(warned) == 1
    assert res["status"] == "done" and res["steps_done"] == 50 and res["steps_asked"] == 200
    assert "50 of the 200 steps" in res["scheduler"] and "temperature unknown" in res["scheduler"]
    assert "25%" in res["scheduler"]


def test_a_run_the_scheduler_does_not_cut_says_nothing_of_it(tmp_path):
    from edge.device import Device

    res = Device(tmp_path / "st", sysfs_root=make_sysfs(tmp_path / "sysfs")).adapt(make_data(tmp_path / "data"),
                                                                                 steps=5)
    assert res["status"] == "done" and res["steps_done"] == 5 and "scheduler" not in res
