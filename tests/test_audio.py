"""WAV input: every bad file gets one clear sentence, and nothing on disk changes."""

import wave

import numpy as np
import pytest

from edge.audio import read_wav, write_wav
from edge.errors import AudioError


def _wav(path, rate=16000, channels=1, width=2, n=16000):
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(b"\x01\x00" * (n * channels) if width == 2 else b"\x01" * (n * channels))
    return path


def test_roundtrip(tmp_path):
    x = (np.random.default_rng(0).standard_normal(16000) * 1000).astype(np.int16)
    p = write_wav(tmp_path / "a.wav", x)
    np.testing.assert_array_equal(read_wav(p), x)
    assert not list(tmp_path.glob(".*tmp*"))


@pytest.mark.parametrize("kw,msg", [
    ({"rate": 44100}, "sample rate 44100 Hz, expected 16000"),
    ({"channels": 2}, "2 channels, expected mono"),
    ({"width": 1}, "8-bit samples"),
])
def test_wrong_format(tmp_path, kw, msg):
    p = _wav(tmp_path / "x.wav", **kw)
    before = p.read_bytes()
    with pytest.raises(AudioError, match=msg) as e:
        read_wav(p)
    assert "sox" in str(e.value)
    assert p.read_bytes() == before


def test_truncated(tmp_path):
    p = _wav(tmp_path / "t.wav")
    p.write_bytes(p.read_bytes()[:20000])
    with pytest.raises(AudioError, match="truncated"):
        read_wav(p)


def test_empty_and_not_wav_and_too_short(tmp_path):
    (tmp_path / "e.wav").write_bytes(b"")
    with pytest.raises(AudioError, match="empty"):
        read_wav(tmp_path / "e.wav")
    (tmp_path / "n.wav").write_bytes(b"hello world, not audio")
    with pytest.raises(AudioError, match="not a WAV"):
        read_wav(tmp_path / "n.wav")
    _wav(tmp_path / "s.wav", n=100)
    with pytest.raises(AudioError, match="only 100 samples"):
        read_wav(tmp_path / "s.wav", min_samples=1600)
    with pytest.raises(AudioError, match="no such file"):
        read_wav(tmp_path / "missing.wav")
