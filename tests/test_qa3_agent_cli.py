"""QA pass 3, the command line of `edgelearn device` (edge/commands/device.py, edge/agent_unit.py,
edge/operating.py): a repeated file option keeps every file, `run --print-unit` takes the source the
run was tested on and the unit runs where it was printed, `calibrate` refuses audio with no
speech-like sound and keeps the old calibration, says "1 minute" right, and status can show a
damaged or stale calibration."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pytest
from agent_helpers import CLI, ROOT
from devstate_helpers import make_data

from edge.audio import write_wav
from edge.commands import device as device_cmd


def device_parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="edgelearn device")
    device_cmd.add_arguments(top)
    return top


def cli(*args, cwd=ROOT):
    return subprocess.run(CLI + ["device", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


# -- 3. a repeated --wav / --ambient keeps every file ------------------------------------------------

def test_a_repeated_file_option_keeps_every_file():
    p = device_parser()
    a = p.parse_args(["calibrate", "--state", "s", "--wav", "a.wav", "--wav", "b.wav"])
    assert a.wav == [Path("a.wav"), Path("b.wav")]  # used to be [b.wav]
    a = p.parse_args(["enroll", "--state", "s", "--keyword", "hey", "--wav", "1.wav", "--wav", "2.wav", "--wav",
                      "3.wav", "4.wav"])
    assert a.wav == [Path(f"{i}.wav") for i in (1, 2, 3, 4)]
    a = p.parse_args(["adapt", "--state", "s", "--data", "d", "--ambient", "A.wav", "--ambient", "B.wav"])
    assert a.ambient == [Path("A.wav"), Path("B.wav")]
    assert p.parse_args(["adapt", "--state", "s", "--data", "d"]).ambient is None
    # every list-of-files option of every action adds up (a new one that does not fails here)
    sub = next(x for x in p._actions if isinstance(x, argparse._SubParsersAction))
    lists = [(name, act.dest) for name, sp in sub.choices.items() for act in sp._actions if act.nargs == "+"]
    assert lists and all(isinstance(act, argparse._ExtendAction)
                         for sp in sub.choices.values() for act in sp._actions if act.nargs == "+"), lists


def test_enroll_counts_every_repeated_clip(tmp_path):
    """The QA repro: `device enroll --wav 1 --wav 2 --wav 3` said "1 enrolment clips given"."""
    clips = [write_wav(tmp_path / f"{i}.wav", (np.random.default_rng(i).standard_normal(16000) * 300)
                       .astype(np.int16)) for i in range(2)]
    r = cli("enroll", "--state", tmp_path / "st", "--keyword", "hey edge", "--wav", clips[0], "--wav", clips[1])
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "2 enrolment clips given" in r.stderr, r.stderr  # used to count 1


# -- 4. --print-unit with the source the run was tested on; the unit runs where it was printed -----

def test_print_unit_takes_a_source_and_runs_in_the_directory_it_was_printed_in(tmp_path):
    wav = write_wav(tmp_path / "x.wav", np.zeros(1600, np.int16))
    (tmp_path / "with %s").mkdir()
    where = tmp_path / "with %s"
    for source in (["--wav", str(wav)], ["--stdin"], ["--mic", "--mic-device", "hw:1,0"]):
        r = cli("run", "--state", "st", *source, "--on-detect", "./hook.sh $(date +%s)", "--print-unit", cwd=where)
        assert r.returncode == 0, r.stderr  # --wav / --stdin with --print-unit used to be refused
        lines = r.stdout.splitlines()
        assert f"WorkingDirectory={str(where.resolve()).replace('%', '%%')}" in lines, r.stdout
        exec_line = next(line for line in lines if line.startswith("ExecStart="))
        words = shlex.split(exec_line[len("ExecStart="):])
        rest = words[words.index("run") + 1:]
        assert rest[:3] == ["--state", str((where / "st").resolve()).replace("%", "%%"), "--mic"]
        assert "--wav" not in rest and "--stdin" not in rest and "--print-unit" not in rest
        # systemd reads %s as a specifier: the unit writes %%s, which systemd turns back into %s
        assert rest[rest.index("--on-detect") + 1] == "./hook.sh $(date +%%s)"
    r = cli("run", "--state", "st", "--wav", str(wav), "--stdin", "--print-unit", cwd=where)
    assert r.returncode == 2 and "not allowed with" in r.stderr  # still one source at a time
    # a shipped bundle's name is carried as its installed path (was $PWD/kws-dscnn-s, no such path)
    r = cli("run", "--state", "st", "--mic", "--bundle", "kws-dscnn-s", "--print-unit", cwd=where)
    words = shlex.split(next(ln for ln in r.stdout.splitlines() if ln.startswith("ExecStart="))[10:])
    assert (Path(words[words.index("--bundle") + 1]) / "manifest.json").is_file(), r.stdout


# -- 5. calibrate: no speech-like sound is refused; "1 minute"; status sees a damaged calibration --

def test_calibrate_refuses_silence_and_a_square_wave_and_keeps_the_old_calibration(tmp_path):
    st = tmp_path / "st"
    st.mkdir()
    old = json.dumps({"for": {}, "points": [{"target_fa_h": 1.0, "thresholds": {"yes": 0.8}}]}).encode()
    (st / "operating.json").write_bytes(old)
    n = 61 * 16000
    t = np.arange(n) / 16000
    silence = write_wav(tmp_path / "silence.wav", np.zeros(n, np.int16))
    square = write_wav(tmp_path / "square.wav", (np.sign(np.sin(2 * np.pi * 1000 * t)) * 20000).astype(np.int16))
    for wav in (silence, square):
        r = cli("calibrate", "--state", st, "--wav", wav, "--targets", "5")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        said = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("INFO: ")]  # TFLite's
        assert "no speech-like sound" in r.stderr and len(said) == 1, r.stderr
        assert (st / "operating.json").read_bytes() == old  # used to be overwritten, exit 0
    # one of several files with sound is enough; a minute and a second is "61 seconds", never "1 minutes"
    noise = write_wav(tmp_path / "room.wav", (np.random.default_rng(0).standard_normal(n) * 300).astype(np.int16))
    r = cli("calibrate", "--state", st, "--wav", silence, "--wav", noise, "--targets", "5")
    assert r.returncode == 0, r.stderr
    assert "1 minutes" not in r.stderr and "122 seconds" not in r.stderr and "2 minutes of audio" in r.stderr, r.stderr
    assert json.loads((st / "operating.json").read_text())["files"] == [str(silence), str(noise)]


def test_duration_words():
    from edge.commands.device import _duration

    assert [_duration(s) for s in (1, 45, 61, 89.4, 90, 119, 150, 3599)] == [
        "1 second", "45 seconds", "61 seconds", "89 seconds", "2 minutes", "2 minutes", "2 minutes", "60 minutes"]
    assert _duration(60 * 60.4) == "60 minutes" and _duration(91) == "2 minutes"


def test_calibration_status_reports_a_damaged_or_stale_table(tmp_path):
    """`device status` showed nothing of a damaged operating.json (only `detect --sensitivity` said
    it): ``calibration_status`` is what status shows."""
    from edge.device import Device
    from edge.device_models import calibrated_for
    from edge.operating import StaleCalibration, calibration_status, load_points

    dev = Device(tmp_path / "st")
    assert calibration_status(dev.state_dir, dev.bundle) is None
    wav = write_wav(tmp_path / "room.wav", (np.random.default_rng(0).standard_normal(31 * 16000) * 300)
                    .astype(np.int16))
    dev.calibrate([wav], targets=[2.0, 5.0])
    st = calibration_status(dev.state_dir, dev.bundle)
    assert st["current"] is True and st["targets"] == [2.0, 5.0] and "stale" not in st
    dev.adapt(make_data(tmp_path / "data"), force=True, steps=2)  # a new context version: stale
    st = calibration_status(dev.state_dir, dev.bundle)
    assert st["current"] is False and "calibrate" in st["fix"] and "'context': 'default'" in st["stale"]
    with pytest.raises(StaleCalibration):  # what `device detect --sensitivity` refuses
        load_points(dev.state_dir, calibrated_for(dev.bundle, dev.state_dir))
    (dev.state_dir / "adapt" / "active.json").write_text("{")  # a damaged pointer: not status's failure
    assert calibration_status(dev.state_dir, dev.bundle)["current"] is None
    (dev.state_dir / "operating.json").write_text('{"points": [{"target_fa_h": 1')
    st = calibration_status(dev.state_dir, dev.bundle)
    assert "damaged" in st["damaged"] and "calibrate" in st["fix"]


def test_the_python_api_refuses_silence_too(tmp_path):
    """``Device.calibrate`` measures the sound it streams anyway (``SoundMeter.tee``): the API refuses
    what the command refuses, with the old calibration kept."""
    from edge.device import Device
    from edge.errors import EdgelearnError

    silence = write_wav(tmp_path / "silence.wav", np.zeros(61 * 16000, np.int16))
    with pytest.raises(EdgelearnError, match="no speech-like sound"):
        Device(tmp_path / "st").calibrate([silence], targets=[5])
    assert not (tmp_path / "st" / "operating.json").exists()
