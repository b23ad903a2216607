"""The public Python API: README's "Python API" example runs as written, ``edge.__all__`` resolves,
``import edge`` stays cheap, and ``edge.Device`` refuses bad input with a fix before loading anything."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from devstate_helpers import make_keyword_clips

import edge
from edge.audio import read_wav, write_wav

ROOT = Path(__file__).resolve().parents[1]


def readme_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, "README's Python API section has no ```python block"
    return blocks[0]


def test_readme_python_api_example_runs(tmp_path, monkeypatch, capsys):
    code = readme_example()
    clips = make_keyword_clips(tmp_path / "clips")  # the buzz the hostile-state tests enrol
    for i, c in enumerate(clips, 1):
        c.rename(tmp_path / f"hey{i}.wav")
    rng = np.random.default_rng(5)
    kw = read_wav(tmp_path / "hey1.wav")
    noise = lambda n: rng.standard_normal(n) * 100  # noqa: E731
    write_wav(tmp_path / "kitchen.wav", np.concatenate([noise(16000), kw, noise(20000), kw, noise(16000)])
              .astype(np.int16))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    ns: dict = {}
    exec(compile(code, "README.md (Python API)", "exec"), ns)
    out = capsys.readouterr().out
    device = ns["device"]
    assert isinstance(device, edge.Device) and device.state_dir.parent == tmp_path / "tmp"
    assert device.status()["keywords"] == ["hey edge"]
    assert out.splitlines()[-1] == "['hey edge']"
    assert "'keyword': 'hey edge'" in out  # the example finds the keyword it enrolled


def test_all_names_resolve():
    assert edge.__all__ == sorted(edge._EXPORTS)
    for name in edge.__all__:
        assert getattr(edge, name) is not None, name
        assert name in dir(edge)
    assert {"Device", "load_bundle", "KeywordModel", "Detector", "DeviceState", "EdgelearnError"} <= set(edge.__all__)
    from edge.device import Device
    from edge.errors import EdgelearnError
    assert edge.Device is Device and edge.EdgelearnError is EdgelearnError
    with pytest.raises(AttributeError):
        edge.no_such_name  # noqa: B018


def test_import_edge_is_cheap_and_lazy():
    code = ("import sys, edge, edge.portable.wire\n"
            "print(sorted(m for m in sys.modules if m == 'numpy' or m.startswith('edge.') and "
            "not m.startswith('edge.portable')))\n"
            "edge.Device\n"
            "print('edge.device' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["[]", "True"], res.stdout


def test_device_refuses_bad_input_before_loading_a_bundle(tmp_path):
    dev = edge.Device(tmp_path / "st", tmp_path / "no-such-bundle")  # never loaded below
    with pytest.raises(edge.EdgelearnError, match="one audio source"):
        dev.detect()
    with pytest.raises(edge.EdgelearnError, match="threshold or a sensitivity"):
        dev.detect("x.wav", threshold=0.5, sensitivity=1.0)
    with pytest.raises(edge.EdgelearnError, match="outside 0..1"):
        dev.adapt(tmp_path, distill=1.5)
    with pytest.raises(edge.EdgelearnError, match="above 0"):
        dev.calibrate(["x.wav"], targets=[0, 1])
    with pytest.raises(edge.BundleError):
        dev.status()


def test_delta_kind_names_the_two_kinds_of_adapted_context():
    from edge.adapt.delta import CONV_TAIL, EMBEDDING_HEAD, delta_kind

    z = np.zeros(3, np.float32)
    assert delta_kind({}) is None and delta_kind(None) is None
    assert delta_kind({"pw4_b": z, "cls_b": z}) == CONV_TAIL
    assert delta_kind({"pw4.lora_a": z}) == CONV_TAIL
    assert delta_kind({"proj.b": z, "classifier.b": z}) == EMBEDDING_HEAD
    assert delta_kind({"adapter.a": z, "adapter.b": z}) == EMBEDDING_HEAD  # a head's residual adapter


def test_status_of_a_state_directory_that_does_not_exist_says_so(tmp_path):
    """`device status --state typo`: an empty device, with a note naming the path (and nothing made)."""
    from edge import Device

    st = Device(tmp_path / "typo").status()
    assert st["keywords"] == [] and "does not exist" in st["note"] and "typo" in st["note"]
    assert not (tmp_path / "typo").exists()
    (tmp_path / "real").mkdir()
    assert "note" not in Device(tmp_path / "real").status()
