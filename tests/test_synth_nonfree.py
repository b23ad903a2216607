"""RHVoice and SVOX Pico as speech synthesizers (host.data.synth): what each is asked for, and what
it gives back.

A stand-in ``RHVoice-test`` or ``pico2wave`` on PATH records its arguments and writes a tone (the
real ones are in Debian's non-free component, which CI does not enable), so these tests run
everywhere.
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

# RHVoice-test reads the text on stdin and writes -o at 24 kHz; pico2wave takes it as its last
# argument and writes -w (a name ending in .wav) at 16 kHz
FAKE = """#!{python}
import json, sys, wave
import numpy as np
args = sys.argv[1:]
rhvoice = "-o" in args
out = args[args.index("-o" if rhvoice else "-w") + 1]
text = sys.stdin.read() if rhvoice else args[-1]
rate = 24000 if rhvoice else 16000
with open({log!r}, "a") as f:
    f.write(json.dumps({{"args": args, "text": text}}) + "\\n")
if not out.endswith(".wav") and not rhvoice:
    sys.exit("Unknown file format (.wav only)")
t = np.arange(int(0.5 * rate)) / rate
pcm = np.r_[np.zeros(rate // 10), 8000 * np.sin(2 * np.pi * 440 * t), np.zeros(rate // 10)].astype("<i2")
with wave.open(out, "wb") as w:
    w.setnchannels(1); w.setsampwidth(2); w.setframerate(rate); w.writeframes(pcm.tobytes())
"""


def install_fake(tmp_path, monkeypatch, binary):
    log = tmp_path / "calls.jsonl"
    exe = tmp_path / "bin" / binary
    exe.parent.mkdir()
    exe.write_text(FAKE.format(python=sys.executable, log=str(log)))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ['PATH']}")
    return log


@pytest.fixture
def fake_rhvoice(tmp_path, monkeypatch):
    return install_fake(tmp_path, monkeypatch, "RHVoice-test")


@pytest.fixture
def fake_pico(tmp_path, monkeypatch):
    return install_fake(tmp_path, monkeypatch, "pico2wave")


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


def test_pico_is_asked_for_the_voice_and_speed_and_moves_pitch_by_the_sample_rate(fake_pico):
    voice = synth.Voice("pico", "en-US")
    synth.check_installed([voice.synth])
    plain, fast_high = synth.render(voice, [("rock & roll", 1.0, 1.0), ("left", 1.25, 1.25)])
    calls = [json.loads(line) for line in fake_pico.read_text().splitlines()]
    assert [c["args"][c["args"].index("-l") + 1] for c in calls] == ["en-US", "en-US"]
    # the speed in pico's markup (percent), the text escaped inside it
    assert [c["text"] for c in calls] == ['<speed level="100">rock &amp; roll</speed>',
                                          '<speed level="125">left</speed>']
    assert plain.dtype == np.int16 and abs(int(np.abs(plain).max()) - 16384) <= 1
    assert plain.size < 0.6 * synth.SR
    assert peak_hz(plain) == pytest.approx(440, abs=3)
    assert peak_hz(fast_high) == pytest.approx(550, abs=3)


@pytest.mark.parametrize("engine,packages", [("rhvoice", "rhvoice rhvoice-english"), ("pico", "libttspico-utils")])
def test_a_missing_non_free_engine_names_the_packages_and_debians_non_free(monkeypatch, engine, packages):
    monkeypatch.setattr(synth.shutil, "which", lambda name: None)
    with pytest.raises(EdgelearnError) as e:
        synth.check_installed([engine])
    assert engine in str(e.value)
    assert f"apt-get install {packages}" in e.value.fix and "non-free" in e.value.fix


def test_only_lgpl_voices_that_share_no_speaker_with_a_held_out_voice():
    # alan and slt are the people behind Flite's awb and Festival's slt (held out); evgeniy-eng and
    # lyubov are CC-BY-NC-ND
    assert synth.RHVOICE_VOICES == ["bdl", "clb"]
    assert not {"awb", "slt"} & set(synth.RHVOICE_VOICES)
    assert all(v.synth not in synth.NON_FREE for v in synth.all_voices())   # not in the shipped corpus
