"""Input checks from the third QA pass (items 2-6; item 1 is tests/test_qa3_input_wyoming.py):
a WAV path that is no regular file, a damaged kept-clips file, one file given twice to enrolment,
keyword names (ASCII, a long one echoed short), and `spot` / `data check` with several bad files.
Every refusal is one sentence (no traceback) that names the problem and the fix, and writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import wave
from pathlib import Path

import numpy as np
import pytest
from devstate_helpers import make_keyword_clips

from edge import audio
from edge.audio import write_wav
from edge.errors import AudioError, EdgelearnError

ROOT = Path(__file__).resolve().parents[1]
HANG_GUARD_S = 600  # a command that hangs is killed after this (no test waits on it when it works)


def one_line_error(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("INFO: ")]  # LiteRT's banner
    assert "Traceback" not in err and len(lines) == 1, err[-2000:]
    return lines[0]


def cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "edge.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=HANG_GUARD_S, **kw)


def empty_wav(path: Path) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
    return path


# --- 2: a path that is not a regular file ---------------------------------------------------------

@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes")
def test_a_named_pipe_is_read_as_a_stream_from_its_writer(tmp_path):
    """A pipe is audio in a stream (`--wav <(sox ...)`, /dev/stdin, a named pipe): read as any Unix
    reader reads one, waiting for its writer (the refusal of devices must not refuse pipes)."""
    fifo = tmp_path / "f.wav"
    os.mkfifo(fifo)
    pcm = np.ones(2000, np.int16)
    blob = _wav_bytes(tmp_path, pcm)

    def write():
        with open(fifo, "wb") as f:  # waits for the reader, writes, and closes: the reader sees the end
            f.write(blob)

    writer = threading.Thread(target=write)
    writer.start()
    np.testing.assert_array_equal(audio.read_wav(fifo), pcm)
    writer.join()


def _wav_bytes(tmp_path: Path, pcm) -> bytes:
    return write_wav(tmp_path / "w.wav", pcm).read_bytes()


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="no /dev/null")
def test_a_character_device_is_refused():
    with pytest.raises(AudioError, match=r"^/dev/null: not a WAV file but a character device, not a regular file"):
        audio.read_wav("/dev/null")


def test_a_stream_is_still_read_from_a_file_object(tmp_path):
    """stdin's own options hand ``open_wav`` the file object: a pipe, read as a stream."""
    pcm = (np.arange(3000) % 200).astype(np.int16)
    blob = _wav_bytes(tmp_path, pcm)
    r, w = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(w, blob), os.close(w)))
    writer.start()
    with os.fdopen(r, "rb") as f:
        np.testing.assert_array_equal(audio.read_wav(f), pcm)
    writer.join()


# --- 3, 4: enrolment ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def enrolled(tmp_path_factory):
    """A state with "hey computer" enrolled (its clips kept), and three other clips of it."""
    from edge.device import Device

    tmp = tmp_path_factory.mktemp("qa3enrol")
    clips = make_keyword_clips(tmp / "clips", n=6)
    Device(tmp / "st").enroll("hey computer", clips[:3])
    return tmp / "st", clips[3:]


def test_a_damaged_kept_clips_file_is_named_with_the_replace_fix(enrolled, tmp_path, capsys):
    import shutil

    from edge.cli import main

    st = tmp_path / "st"
    shutil.copytree(enrolled[0], st)
    (kept,) = (st / "enrolment").glob("hey_computer-*.npz")
    kept.write_bytes(np.random.default_rng(0).integers(0, 256, 100, dtype=np.uint8).tobytes())
    before = {p: p.read_bytes() for p in st.rglob("*") if p.is_file()}
    rc = main(["device", "enroll", "--state", str(st), "--keyword", "hey computer", "--add",
               "--wav", *map(str, enrolled[1])])
    assert rc == 2
    line = one_line_error(capsys.readouterr().err)
    assert str(kept) in line and "damaged" in line and "--replace" in line
    assert "enrolled before it kept them" not in line
    assert {p: p.read_bytes() for p in st.rglob("*") if p.is_file()} == before


def test_one_file_given_several_times_is_refused(enrolled, tmp_path, capsys):
    from edge.cli import main

    sq = enrolled[1][0]
    for wavs, said in (([sq, sq, sq], f"{sq} is given twice"),
                       ([sq, enrolled[1][1], Path(os.path.relpath(sq, ROOT))],  # another spelling of one file
                        f"{sq} and {os.path.relpath(sq, ROOT)} are the same file")):
        st = tmp_path / f"st{len(said)}"
        rc = main(["device", "enroll", "--state", str(st), "--keyword", "square", "--wav", *map(str, wavs)])
        assert rc == 2
        line = one_line_error(capsys.readouterr().err)
        assert said in line and "once" in line
        assert not (st / "keywords.json").exists() and not (st / "enrolment").exists()


# --- 5: keyword names -------------------------------------------------------------------------------

def test_a_non_ascii_name_is_refused_saying_ascii():
    from edge.enroll import check_name

    with pytest.raises(EdgelearnError) as e:
        check_name("café", ["yes"], [])
    assert "'café' is not usable" in str(e.value) and "ASCII letters" in e.value.fix


def test_a_long_name_is_echoed_short():
    from edge.enroll import check_name, keyword_sensitivity
    from edge.keywords import SHOWN_CHARS

    name = "a" * 1000
    with pytest.raises(EdgelearnError) as e:
        check_name(name, ["yes"], [])
    assert len(str(e.value)) < 200 and f"'{'a' * SHOWN_CHARS}'…" in str(e.value)

    class NoKeywords:
        keywords: list = []

        def names(self):
            return []

    with pytest.raises(EdgelearnError) as e:
        keyword_sensitivity(NoKeywords(), name)
    assert len(str(e.value)) < 200 and "…" in str(e.value)


# --- 6: spot and data check ---------------------------------------------------------------------------

def test_spot_classifies_every_readable_clip_and_exits_2_for_the_bad_ones(tmp_path):
    rng = np.random.default_rng(3)
    a = write_wav(tmp_path / "a.wav", (rng.standard_normal(16000) * 1000).astype(np.int16))
    b = write_wav(tmp_path / "b.wav", (rng.standard_normal(16000) * 1000).astype(np.int16))
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not a wav at all")
    empty = empty_wav(tmp_path / "empty.wav")
    r = cli("spot", a, bad, empty, b)
    assert r.returncode == 2, r.stderr[-2000:]
    assert [ln.split()[0] for ln in r.stdout.strip().splitlines()] == [str(a), str(b)]
    errs = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("INFO: ")]
    assert "Traceback" not in r.stderr and len(errs) == 2, r.stderr
    assert errs[0].startswith(f"edgelearn spot: {bad}: not a WAV file")
    assert errs[1].startswith(f"edgelearn spot: {empty}: holds no audio (0 samples)")


def test_a_wav_with_no_samples_holds_no_audio(tmp_path):
    with pytest.raises(AudioError) as e:
        audio.read_wav(empty_wav(tmp_path / "e.wav"))
    assert str(e.value).startswith(f"{tmp_path / 'e.wav'}: holds no audio (0 samples);")


def test_data_check_lists_every_bad_file_and_no_line_starts_with_a_semicolon(tmp_path):
    for w in ("yes", "no"):
        (tmp_path / "d" / w).mkdir(parents=True)
        write_wav(tmp_path / "d" / w / "ok.wav", np.ones(16000, np.int16))
    (tmp_path / "d" / "yes" / "bad.wav").write_bytes(b"junk")
    empty_wav(tmp_path / "d" / "no" / "empty.wav")
    r = cli("data", "check", tmp_path / "d")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert not [ln for ln in lines if ln.lstrip().startswith(";")], r.stderr
    assert lines[0].startswith(f"edgelearn data: {tmp_path / 'd'}: 2 problem(s); fix or remove these files")
    assert sorted(ln.split(":")[0].strip() for ln in lines[1:]) == sorted(
        [str(tmp_path / "d" / "no" / "empty.wav"), str(tmp_path / "d" / "yes" / "bad.wav")])
