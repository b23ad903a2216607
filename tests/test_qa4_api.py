"""QA pass 4: edge.Device answers wrong input with one EdgelearnError naming the argument (README
"Python API"), never a numpy / pathlib / AttributeError traceback; float clips enrol as detect reads
them; `sensitivity --max-fa-per-hour` takes only a finite rate above 0 (edge.options)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from devstate_helpers import make_keyword_clips

import edge
from edge.audio import read_wav

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def dev(tmp_path):
    return edge.Device(tmp_path / "st")


def refused(call, *words):
    with pytest.raises(edge.EdgelearnError) as e:
        out = call()
        list(out) if hasattr(out, "__next__") else out  # detect reads lazily
    msg = str(e.value).lower()
    assert all(w.lower() in msg for w in words), msg
    return msg


# -- 1: detect's source ------------------------------------------------------------------------------
def test_detect_refuses_stereo_and_what_is_not_audio(dev):
    refused(lambda: dev.detect(np.zeros((16000, 2), np.float32)), "mono", "mix or pick a channel")
    refused(lambda: dev.detect(np.zeros((16000, 2), np.int16)), "mono", "(16000, 2)")
    for bad in ({}, 5, b"\x00\x01"):
        refused(lambda: dev.detect(bad), "source may be", "WAV path")
    refused(lambda: dev.detect([None]), "chunk 1", "array of samples")


def test_detect_still_reads_samples_and_chunks(dev):
    x = np.zeros(16000, np.int16)
    assert list(dev.detect(x, replay=False)) == []
    assert list(dev.detect([x[:8000], x[8000:].astype(np.float32)], replay=False)) == []
    assert list(dev.detect(x.reshape(10, 1600), replay=False)) == []  # rows of chunks, as before


def test_detect_takes_none_stride_and_confirm_as_the_default(dev):
    assert list(dev.detect(np.zeros(16000, np.int16), stride=None, confirm=None, replay=False)) == []


# -- 2: float clips enrol as detect reads them --------------------------------------------------------
def test_float_clips_in_unit_range_enrol_like_int16(tmp_path):
    clips = [read_wav(p) for p in make_keyword_clips(tmp_path / "c")]
    a = edge.Device(tmp_path / "a").enroll("hey edge", clips)
    b = edge.Device(tmp_path / "b").enroll("hey edge", [c.astype(np.float64) / 32768 for c in clips])
    assert b["used"] == a["used"] == 5
    assert abs(b["threshold"] - a["threshold"]) < 0.05


def test_float_clips_outside_unit_range_are_refused(dev):
    refused(lambda: dev.enroll("k", [np.full(8000, 3000.0)] * 3), "outside [-1, 1]")


# -- 3: wrong types ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [None, 5, 1.5, ["k"], b"k", {}])
def test_keyword_name_must_be_text(dev, name):
    refused(lambda: dev.enroll(name, [np.zeros(8000, np.int16)] * 3), "keyword name must be text")
    refused(lambda: dev.sensitivity(name, "low"), "keyword name must be text")


@pytest.mark.parametrize("clips", [[], {}, None, 5, b"\x00" * 6400, [None] * 3])
def test_clips_must_be_paths_or_arrays(dev, clips):
    refused(lambda: dev.enroll("k", clips), "clip", "WAV paths", "3-10")


def test_a_level_must_be_one_of_the_levels(dev):
    refused(lambda: dev.sensitivity("k", [1]), "not one of low, medium, high")


@pytest.mark.parametrize("ctx", [[1, 2, 3], np.zeros(3)])
def test_context_must_be_a_name(dev, ctx):
    refused(lambda: dev.adapt(("x", "y"), context=ctx), "context must be", "name (text)")
    refused(lambda: dev.use(ctx), "context must be")
    refused(lambda: dev.rollback(ctx), "context must be")


@pytest.mark.parametrize("data", [5, [1], np.zeros(3)])
def test_adapt_data_must_be_a_directory_or_pairs(dev, data):
    refused(lambda: dev.adapt(data), "data must be a path", "(clips, labels)")


@pytest.mark.parametrize("wavs", [[1, 2, 3], [None] * 3, np.zeros(3), None, 5, []])
def test_calibrate_takes_wav_paths(dev, wavs):
    refused(lambda: dev.calibrate(wavs), "calibrate takes WAV paths")


@pytest.mark.parametrize("st", [None, 5, ["st"]])
def test_state_dir_must_be_a_path(st):
    refused(lambda: edge.Device(st), "state_dir must be a path")


def test_bundle_must_be_a_path_or_a_bundle(tmp_path):
    refused(lambda: edge.Device(tmp_path, bundle=5), "bundle must be a path", "shipped name")


# -- 4: --max-fa-per-hour ----------------------------------------------------------------------------
@pytest.mark.parametrize("rate", [0, float("inf"), -1, float("nan"), [1]])
def test_max_fa_h_must_be_a_finite_rate_above_0(dev, rate):
    refused(lambda: dev.sensitivity("k", max_fa_h=rate), "--max-fa-per-hour")


@pytest.mark.parametrize("rate", ["0", "inf", "-1", "nan"])
def test_cli_max_fa_per_hour_is_one_line(tmp_path, rate):
    r = subprocess.run([sys.executable, "-m", "edge.cli", "device", "sensitivity", "--state", str(tmp_path / "st"),
                        "--keyword", "k", f"--max-fa-per-hour={rate}"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2, r.stderr
    assert "positive finite rate" in r.stderr and "Traceback" not in r.stderr
    # refused by argparse as `detect --sensitivity` is: its usage, then the one sentence
    assert "positive finite rate" in r.stderr.strip().splitlines()[-1], r.stderr
