"""Hostile audio input: one bounded reader for `spot` and `device detect`.

Every input gives PCM or one AudioError sentence (never a traceback), nothing reads
without bound (/dev/zero, a stream that never ends, a 2-hour file), `device detect`
streams a long file in bounded chunks, and `spot` refuses a clip longer than a few
seconds instead of silently classifying its centre second.
"""

from __future__ import annotations

import io
import os
import resource
import struct
import subprocess
import sys
import tracemalloc
import wave
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from edge import audio
from edge.errors import AudioError, EdgelearnError

ROOT = Path(__file__).resolve().parents[1]
FAST = settings(max_examples=int(os.environ.get("EDGELEARN_HOSTILE_EXAMPLES", 150)), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def riff(pcm_bytes: bytes, *, rate=16000, channels=1, bits=16, tag=1, extra=(), data_size=None,
         fmt_size=16) -> bytes:
    """A WAV image: RIFF/WAVE, `extra` chunks (id, body), fmt, data (with an optional lying size)."""
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * block & 0xFFFFFFFF, block & 0xFFFF, bits)
    fmt += bytes(fmt_size - 16)
    body = b"WAVE"
    for cid, payload in extra:
        body += cid + struct.pack("<I", len(payload)) + payload + (b"\0" if len(payload) % 2 else b"")
    body += b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", len(pcm_bytes) if data_size is None else data_size) + pcm_bytes
    return b"RIFF" + struct.pack("<I", min(len(body), 0xFFFFFFFF)) + body


def sparse_wav(path: Path, seconds: float) -> int:
    """A long 16 kHz WAV that takes no disk space: a header, then a hole of zeros."""
    n = int(seconds * audio.SAMPLE_RATE)
    head = bytearray(riff(b"", data_size=2 * n))
    head[4:8] = struct.pack("<I", len(head) - 8 + 2 * n)  # the RIFF size covers the samples too
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + 2 * n)
    return n


def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # a runaway read dies, not the machine


# --- the reader ------------------------------------------------------------------------------

class SpyFile(io.RawIOBase):
    """Wraps a file and records the size of every read the reader asks for."""

    def __init__(self, f):
        self.f, self.reads = f, []

    def readable(self):
        return True

    def read(self, n=-1):
        self.reads.append(n)
        return self.f.read(n)

    def readinto(self, b):
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def seekable(self):
        return self.f.seekable()

    def seek(self, *a):
        return self.f.seek(*a)

    def tell(self):
        return self.f.tell()

    def fileno(self):
        return self.f.fileno()

    def close(self):
        self.f.close()
        super().close()


def test_two_hour_file_is_read_in_bounded_pieces(tmp_path, monkeypatch):
    n = sparse_wav(tmp_path / "long.wav", 2 * 3600)
    spies = []
    real_open = audio._open

    def spy_open(path):
        spies.append(SpyFile(real_open(path)))
        return spies[-1]

    monkeypatch.setattr(audio, "_open", spy_open)
    total, biggest = 0, 0
    with audio.open_wav(tmp_path / "long.wav") as w:
        assert w.n_samples == n
        for chunk in w.chunks(16000):
            total += len(chunk)
            biggest = max(biggest, len(chunk))
    assert total == n and biggest == 16000
    reads = [r for r in spies[0].reads]
    assert reads and all(0 <= r <= audio.MAX_READ_BYTES for r in reads), max(reads)


def test_endless_stream_is_capped():
    class Endless(io.RawIOBase):
        """A valid header claiming unknown length, then samples forever (a mic piped in)."""

        def __init__(self, head):
            self.head, self.served = head, 0

        def readable(self):
            return True

        def readinto(self, b):
            k = len(b)
            out = self.head[:k] + bytes(max(0, k - len(self.head)))
            self.head = self.head[k:]
            b[:k] = out
            self.served += k
            return k

    s = Endless(riff(b"", data_size=0xFFFFFFFF))
    with pytest.raises(AudioError, match=r"longer than 5 s") as e:
        audio.read_wav(s, max_samples=5 * 16000)
    assert e.value.fix and s.served < 5 * 16000 * 2 + 2 * audio.MAX_READ_BYTES
    # metadata chunks that never end are refused after a bounded number of bytes
    s = Endless(b"RIFF\xff\xff\xff\xffWAVELIST" + struct.pack("<I", 0xFFFFFF00))
    with pytest.raises(AudioError, match="metadata"):
        audio.read_wav(s)
    assert s.served <= audio.MAX_HEADER_BYTES + 2 * audio.MAX_READ_BYTES


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_dev_zero_is_not_a_wav():
    # in a child with a memory cap: an unbounded read must fail there, not take this machine down
    code = ("from edge import audio\n"
            "for name in ('read_wav', 'open_wav'):\n"
            "    try:\n"
            "        getattr(audio, name)('/dev/zero')\n"
            "    except Exception as e:\n"
            "        print(type(e).__name__, e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       preexec_fn=_limited)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("AudioError /dev/zero: not a WAV file") == 2, r.stdout


def test_long_regular_file_is_refused_from_its_header(tmp_path, monkeypatch):
    sparse_wav(tmp_path / "long.wav", 2 * 3600)
    spies = []
    real_open = audio._open
    monkeypatch.setattr(audio, "_open", lambda p: spies.append(SpyFile(real_open(p))) or spies[-1])
    with pytest.raises(AudioError, match=r"7200\.0 s long, longer than 5 s"):
        audio.read_wav(tmp_path / "long.wav", max_samples=5 * 16000)
    assert sum(max(r, 0) for r in spies[0].reads) < 1024  # refused from the header alone
    with pytest.raises(AudioError, match="longer than"):
        audio.read_wav(tmp_path / "long.wav")  # the default cap holds too


# --- properties: any bytes give PCM or one AudioError ------------------------------------------

def _outcome(path_or_file):
    try:
        return audio.read_wav(path_or_file)
    except AudioError as e:
        assert e.problem and "\n" not in str(e)
        return e


def _chunked(path_or_file, k):
    try:
        with audio.open_wav(path_or_file) as w:
            parts = list(w.chunks(k))
        assert all(0 < len(p) <= k for p in parts)
        return np.concatenate(parts) if parts else np.zeros(0, np.int16)
    except AudioError as e:
        return e


@FAST
@given(st.binary(max_size=200))
def test_random_bytes(tmp_path, data):
    p = tmp_path / "r.wav"
    p.write_bytes(data)
    out = _outcome(p)
    assert isinstance(out, (np.ndarray, AudioError))
    assert isinstance(_outcome(io.BytesIO(data)), (np.ndarray, AudioError))


@st.composite
def mangled_wavs(draw):
    """A valid WAV, then one of: a header field set to anything, a cut, a flipped byte, junk chunks."""
    pcm = draw(st.binary(max_size=400))
    kw = {}
    for name, strat in (("rate", st.sampled_from([16000, 8000, 44100, 0, 0xFFFFFFFF])),
                        ("channels", st.sampled_from([1, 2, 0, 0xFFFF])),
                        ("bits", st.sampled_from([16, 8, 24, 0, 0xFFFF])),
                        ("tag", st.sampled_from([1, 3, 0xFFFE, 0])),
                        ("data_size", st.one_of(st.none(), st.integers(0, 0xFFFFFFFF))),
                        ("fmt_size", st.sampled_from([16, 18, 40]))):
        if draw(st.booleans()):
            kw[name] = draw(strat)
    extra = draw(st.lists(st.tuples(st.sampled_from([b"LIST", b"fact", b"JUNK", b"fmt ", b"\0\0\0\0"]),
                                    st.binary(max_size=40)), max_size=3))
    blob = bytearray(riff(pcm, extra=extra, **kw))
    how = draw(st.sampled_from(["as is", "cut", "flip"]))
    if how == "cut":
        blob = blob[: draw(st.integers(0, len(blob)))]
    elif how == "flip" and blob:
        i = draw(st.integers(0, len(blob) - 1))
        blob[i] = draw(st.integers(0, 255))
    return bytes(blob)


@FAST
@given(mangled_wavs(), st.integers(1, 3000))
def test_mangled_wavs_give_pcm_or_one_error(tmp_path, blob, k):
    p = tmp_path / "m.wav"
    p.write_bytes(blob)
    whole = _outcome(p)
    chunked = _chunked(p, k)
    assert isinstance(whole, (np.ndarray, AudioError))
    event("read as PCM" if isinstance(whole, np.ndarray) else "one AudioError")
    if isinstance(whole, np.ndarray):
        np.testing.assert_array_equal(chunked, whole)
    for src in (io.BytesIO(blob),):
        assert isinstance(_outcome(src), (np.ndarray, AudioError))


@FAST
@given(st.lists(st.integers(-32768, 32767), max_size=3000),
       st.lists(st.tuples(st.sampled_from([b"LIST", b"fact", b"JUNK"]), st.binary(max_size=61)), max_size=3),
       st.integers(1, 5000))
def test_valid_wavs_read_the_same_whole_chunked_and_streamed(tmp_path, samples, extra, k):
    pcm = np.array(samples, np.int16)
    blob = riff(pcm.astype("<i2").tobytes(), extra=extra)
    p = tmp_path / "v.wav"
    p.write_bytes(blob)
    if len(pcm) == 0:
        assert isinstance(_outcome(p), AudioError)
        return
    np.testing.assert_array_equal(audio.read_wav(p), pcm)
    np.testing.assert_array_equal(_chunked(p, k), pcm)
    np.testing.assert_array_equal(audio.read_wav(io.BytesIO(blob)), pcm)
    np.testing.assert_array_equal(_chunked(io.BytesIO(blob), k), pcm)


def test_stdlib_wave_files_still_read(tmp_path):
    x = (np.random.default_rng(0).standard_normal(5000) * 3000).astype(np.int16)
    with wave.open(str(tmp_path / "w.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(x.tobytes())
    np.testing.assert_array_equal(audio.read_wav(tmp_path / "w.wav"), x)


# --- the commands ----------------------------------------------------------------------------

def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "edge.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, preexec_fn=_limited)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_dev_zero_spot_and_detect_say_one_sentence(tmp_path):
    for args in (("spot", "/dev/zero"), ("device", "detect", "--state", tmp_path / "st", "--wav", "/dev/zero",
                                         "--no-replay")):
        r = _cli(*args)
        assert r.returncode == 2, r.stderr[-2000:]
        lines = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("INFO: ")]  # LiteRT's banner
        assert "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-2000:]
        assert "/dev/zero: not a WAV file" in r.stderr


def test_spot_refuses_a_long_clip_with_one_sentence(tmp_path, capsys):
    from edge.cli import main

    sparse_wav(tmp_path / "minute.wav", 60)
    assert main(["spot", str(tmp_path / "minute.wav")]) == 2
    err = capsys.readouterr().err
    assert "60.0 s long, longer than" in err and "device detect" in err and len(err.strip().splitlines()) == 1


def test_device_detect_streams_a_long_file_in_bounded_memory(tmp_path, monkeypatch, capsys):
    """10 minutes of audio (19 MB) through `device detect --wav`: the detector sees every sample, in
    chunks of 1600, and the command's peak Python memory stays a small fraction of the file."""
    import edge.detect
    from edge.cli import main

    n = sparse_wav(tmp_path / "long.wav", 10 * 60)

    class FakeDetector:  # the real model is loaded; only the per-chunk work is skipped
        seen = {"samples": 0, "biggest": 0, "flushed": 0}

        def __init__(self, km, **kw):
            pass

        def push(self, pcm):
            self.seen["samples"] += len(pcm)
            self.seen["biggest"] = max(self.seen["biggest"], len(pcm))
            return []

        def flush(self):
            self.seen["flushed"] += 1
            return []

    monkeypatch.setattr(edge.detect, "Detector", FakeDetector)
    tracemalloc.start()
    try:
        rc = main(["device", "detect", "--state", str(tmp_path / "st"), "--wav", str(tmp_path / "long.wav"),
                   "--no-replay"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rc == 0, capsys.readouterr().err
    assert FakeDetector.seen == {"samples": n, "biggest": 1600, "flushed": 1}
    assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB for a {2 * n / 2**20:.0f} MiB file"


def test_detect_refuses_a_truncated_file_before_detecting(tmp_path, capsys):
    from edge.cli import main

    blob = riff(bytes(32000))
    (tmp_path / "t.wav").write_bytes(blob[:20000])
    assert main(["device", "detect", "--state", str(tmp_path / "st"), "--wav", str(tmp_path / "t.wav"),
                 "--no-replay"]) == 2
    err = capsys.readouterr().err
    assert "truncated" in err and len(err.strip().splitlines()) == 1


def test_audio_errors_are_edgelearn_errors():
    assert issubclass(AudioError, EdgelearnError)
