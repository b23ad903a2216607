"""RHVoice as a speech synthesizer (host.data.synth): what it is asked for, and what it gives back.

A stand-in ``RHVoice-test`` on PATH records its arguments and writes a tone (the real one is in
Debian's non-free component, which CI does not enable), so these tests run everywhere.
"""

import json
import os
import stat
import sys
import wave

import numpy as np
import pytest

from edge.errors import EdgelearnError
from host.data import synth

FAKE = """#!{python}
import json, sys, wave
import numpy as np
args = sys.argv[1:]
out = args[args.index("-o") + 1]
text = sys.stdin.read()
with open({log!r}, "a") as f:
    f.write(json.dumps({{"args": args, "text": text}}) + "\\n")
t = np.arange(int(0.5 * 24000)) / 24000
pcm = np.r_[np.zeros(2400), 8000 * np.sin(2 * np.pi * 440 * t), np.zeros(2400)].astype("<i2")
with wave.open(out, "wb") as w:
    w.setnchannels(1); w.setsampwidth(2); w.setframerate(24000); w.writeframes(pcm.tobytes())
"""


@pytest.fixture
def fake_rhvoice(tmp_path, monkeypatch):
    log = tmp_path / "calls.jsonl"
    exe = tmp_path / "bin" / "RHVoice-test"
    exe.parent.mkdir()
    exe.write_text(FAKE.format(python=sys.executable, log=str(log)))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ['PATH']}")
    return log


def test_render_asks_for_the_voice_and_rate_and_moves_pitch_by_the_sample_rate(fake_rhvoice):
    voice = synth.Voice("rhvoice", "clb")
    synth.check_installed([voice.synth])
    plain, fast_high = synth.render(voice, [("left", 1.0, 1.0), ("left", 1.25, 1.25)])
    calls = [json.loads(line) for line in fake_rhvoice.read_text().splitlines()]
    assert [c["text"] for c in calls] == ["left", "left"]
    assert [c["args"][c["args"].index("-p") + 1] for c in calls] == ["clb", "clb"]
    assert [c["args"][c["args"].index("-r") + 1] for c in calls] == ["100", "125"]
    # 16 kHz int16 at the corpus's fixed peak, silence trimmed; a pitch of 1.25 is the same audio
    # taken as 1.25x its rate (a 440 Hz tone comes back at 550 Hz, as Festival's voices are shifted)
    assert plain.dtype == np.int16 and abs(int(np.abs(plain).max()) - 16384) <= 1
    assert plain.size < 0.6 * synth.SR
    assert peak_hz(plain) == pytest.approx(440, abs=3)
    assert peak_hz(fast_high) == pytest.approx(550, abs=3)


def peak_hz(pcm):
    spec = np.abs(np.fft.rfft(pcm.astype(np.float64), n=synth.SR))   # 1 Hz bins
    return int(np.argmax(spec))


def test_render_jobs_takes_rhvoice_voices(fake_rhvoice):
    jobs = [(synth.Voice("rhvoice", v), "go", 1.0, 1.0, (v, "go")) for v in synth.RHVOICE_VOICES]
    got = synth.render_jobs(jobs, "test renders")
    assert sorted(got) == sorted((v, "go") for v in synth.RHVOICE_VOICES)


def test_a_failing_synthesizer_is_one_error(tmp_path, monkeypatch):
    exe = tmp_path / "RHVoice-test"
    exe.write_text("#!/bin/sh\necho 'no such voice' >&2\nexit 3\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(RuntimeError, match="RHVoice-test failed: no such voice"):
        synth.render(synth.Voice("rhvoice", "nobody"), [("go", 1.0, 1.0)])


def test_missing_rhvoice_names_the_packages_and_debians_non_free(monkeypatch):
    monkeypatch.setattr(synth.shutil, "which", lambda name: None)
    with pytest.raises(EdgelearnError) as e:
        synth.check_installed(["rhvoice"])
    assert "rhvoice" in str(e.value)
    assert "apt-get install rhvoice rhvoice-english" in e.value.fix and "non-free" in e.value.fix


def test_only_lgpl_voices_that_share_no_speaker_with_a_held_out_voice():
    # alan and slt are the people behind Flite's awb and Festival's slt (held out); evgeniy-eng and
    # lyubov are CC-BY-NC-ND
    assert synth.RHVOICE_VOICES == ["bdl", "clb"]
    assert not {"awb", "slt"} & set(synth.RHVOICE_VOICES)
    assert all(v.synth != "rhvoice" for v in synth.all_voices())   # not in the shipped corpus
