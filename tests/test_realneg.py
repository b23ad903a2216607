"""host.data.realneg: other speakers' prompts as keyword-free real speech (a fake install in tmp)."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from host.data import realneg
from host.data.synth import pcm_to_wav_bytes


def fake_install(root, lang, prompts, rate=8000):
    """Debian's layout: SOUNDS/<speaker>/<name>.wav and DOCS/asterisk-core-sounds-<lang>/core-sounds-<lang>.txt.gz."""
    folder = root / "sounds" / realneg.SPEAKERS[lang][0]
    folder.mkdir(parents=True)
    doc = root / "doc" / f"asterisk-core-sounds-{lang}"
    doc.mkdir(parents=True)
    lines = ["\ufeff; Core Asterisk Sounds", ""]
    rng = np.random.default_rng(len(prompts))
    for name, text, seconds in prompts:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        pcm = (rng.standard_normal(int(seconds * rate)) * 3000).astype(np.int16)
        wav = bytearray(pcm_to_wav_bytes(pcm))
        wav[24:28] = rate.to_bytes(4, "little")  # the header's sample rate and byte rate: 8 kHz prompts
        wav[28:32] = (2 * rate).to_bytes(4, "little")
        (folder / f"{name}.wav").write_bytes(bytes(wav))
        lines.append(f"{name}: {text}")
    with gzip.open(doc / f"core-sounds-{lang}.txt.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


@pytest.fixture
def installed(tmp_path, monkeypatch):
    monkeypatch.setattr(realneg, "SOUNDS", tmp_path / "sounds")
    monkeypatch.setattr(realneg, "DOCS", tmp_path / "doc")
    fake_install(tmp_path, "it", [("activated", "Attivato.", 2.5), ("vm-no", "No, nessun messaggio", 3.0),
                                  ("digits/7", "sette", 0.6), ("missing-file", "mancante", 1.0)])
    (tmp_path / "sounds" / realneg.SPEAKERS["it"][0] / "missing-file.wav").unlink()
    return tmp_path


def test_prompts_skip_soundalikes_and_missing_files_and_resample(installed):
    got = realneg.prompts("it")
    assert [n for n, _, _ in got] == ["activated", "digits/7"]  # "No, ..." sounds like a command
    assert len(got[0][2]) == pytest.approx(2.5 * 16000, abs=2)  # 8 kHz read, 16 kHz out


def test_windows_are_one_second_of_speech_and_deterministic(installed):
    w = realneg.windows(("it",), seed=3)
    assert w and all(x.shape == (16000,) and x.dtype == np.int16 for x in w)
    # 2.5 s from a random start in [0, 1 s) gives one or two windows; the 0.6 s prompt is padded to one
    assert len(w) in (2, 3)
    again = realneg.windows(("it",), seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(w, again))


def test_quiet_windows_are_dropped(installed, monkeypatch):
    monkeypatch.setattr(realneg, "MIN_RMS", 1e9)
    assert realneg.windows(("it",)) == []


def test_missing_names_the_packages(installed):
    assert realneg.missing(["it"]) is None
    msg = realneg.missing(["it", "ru"])
    assert msg == ("real-speech negatives need Debian's asterisk-core-sounds-ru-wav "
                   "(apt-get install asterisk-core-sounds-ru-wav)")


def test_usable_reads_words_not_substrings():
    assert realneg.usable("Inoltro chiamata su occupato")
    assert realneg.usable("nonna")  # contains "non" but is not the word
    assert not realneg.usable("Non identificato")
    assert not realneg.usable("")
