"""Cheap device state directories for the hostile-state and crash tests (no espeak, no training set).

Labelled clips are noise (training does not care what they sound like), the enrolled keyword is
a voiced buzz (``make_keyword_clips``), and the sysfs tree says "on mains, 40 C", so the scheduler lets a run train.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path

import numpy as np

from edge.audio import write_wav

LABELS = ("yes", "no")


def make_data(root: Path, per_label: int = 3, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    for w in LABELS:
        (root / w).mkdir(parents=True, exist_ok=True)
        for i in range(per_label):
            write_wav(root / w / f"{i}.wav", (rng.standard_normal(16000) * 3000).astype(np.int16))
    return root


def make_keyword_clips(root: Path, n: int = 5, seed: int = 1) -> list[Path]:
    """``n`` clips of the test keyword: half a second of a voiced buzz (19 harmonics) whose pitch
    rises from 140 to 200 Hz and falls back, like one stressed syllable. A pure tone sweep
    (400-700 Hz, used until version 3 of the shipped model) is no speech to an encoder trained with
    running speech as `_unknown_`: its stream scores stayed under the enrolled threshold."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    t = np.arange(8000) / 16000
    phase = 2 * np.pi * np.cumsum(140 + 60 * np.sin(np.pi * t / t[-1])) / 16000
    buzz = sum(np.sin(k * phase) / k for k in range(1, 20)) * np.hanning(len(t))
    out = []
    for i in range(n):
        x = buzz * 6000 * (1 + 0.05 * i)
        x = np.r_[np.zeros(2000), x, np.zeros(2000)] + rng.standard_normal(12000) * 50
        out.append(write_wav(root / f"kw{i}.wav", x.astype(np.int16)))
    return out


def make_sysfs(root: Path) -> Path:
    ac = root / "sys/class/power_supply/AC"
    ac.mkdir(parents=True, exist_ok=True)
    (ac / "type").write_text("Mains\n")
    (ac / "online").write_text("1\n")
    tz = root / "sys/class/thermal/thermal_zone0"
    tz.mkdir(parents=True, exist_ok=True)
    (tz / "temp").write_text("40000\n")
    return root


def parse(argv) -> argparse.Namespace:
    from edge.commands import device as device_cli

    p = argparse.ArgumentParser(prog="edgelearn device")
    device_cli.add_arguments(p)
    return p.parse_args([str(a) for a in argv])


def run_device(argv) -> str:
    """Run ``edgelearn device ARGV`` in this process; returns its stdout, raises what it raises."""
    from edge.commands import device as device_cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        device_cli.run(parse(argv))
    return out.getvalue()
