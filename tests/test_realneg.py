"""host.data.realneg: other speakers' prompts as keyword-free real speech (a fake install in tmp)."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from host.data import realneg
from host.data.synth import pcm_to_wav_bytes


def fake_install(root, lang, prompts, rate=8000):
    """Debian's layout: SOUNDS/<speaker>/<name>.wav and DOCS/asterisk-core-sounds-<lang>/core-sounds-<lang>.txt.gz."""
    folder = root / "sounds" / realneg.SPEAKERS.get(lang, ("en_US_f_Allison",))[0]
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


def test_translated_speakers_read_gsm_and_filter_by_the_english_meaning(tmp_path, monkeypatch):
    """An asterisk-prompt package unpacked under PROMPTS (scripts/unpack_prompts.sh): headerless GSM
    prompts with no transcript of their own; core-sounds-en's text of the same name says what each
    means, and a prompt meaning "no" is left out whatever the language says."""
    import soundfile

    monkeypatch.setattr(realneg, "SOUNDS", tmp_path / "sounds")
    monkeypatch.setattr(realneg, "DOCS", tmp_path / "doc")
    monkeypatch.setattr(realneg, "PROMPTS", tmp_path / "unpacked")
    fake_install(tmp_path, "en", [("activated", "Activated.", 1.0), ("vm-no", "No messages.", 1.0),
                                  ("digits/7", "seven", 0.5)])
    assert "scripts/unpack_prompts.sh" in realneg.missing(["fr-armelle"])
    where = realneg.folder("fr-armelle")
    assert where == tmp_path / "unpacked" / "asterisk-prompt-fr-armelle" / "usr/share/asterisk/sounds/fr"
    (where / "digits").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name, seconds in (("activated", 2.0), ("vm-no", 1.0), ("digits/7", 0.5)):
        pcm = (np.sin(np.arange(int(seconds * 8000)) * 0.3) * 8000 + rng.standard_normal(int(seconds * 8000)) * 300)
        soundfile.write(str(where / f"{name}.gsm"), pcm.astype(np.int16), 8000, format="RAW", subtype="GSM610")
    assert realneg.missing(["fr-armelle"]) is None
    got = realneg.prompts("fr-armelle")
    assert [(n, t) for n, t, _ in got] == [("activated", "Activated."), ("digits/7", "seven")]
    assert len(got[0][2]) == pytest.approx(2.0 * 16000, abs=16 * 160)   # GSM frames are 160 samples
    assert 2000 < np.sqrt(np.mean(got[0][2] ** 2)) < 9000              # decoded speech level, not noise or 0
    (tmp_path / "doc" / "asterisk-core-sounds-en" / "core-sounds-en.txt.gz").unlink()
    assert realneg.missing(["fr-armelle"]) == ("real-speech negatives need Debian's asterisk-core-sounds-en "
                                               "(apt-get install asterisk-core-sounds-en)")


def test_unpack_prompts_puts_each_package_where_realneg_looks(tmp_path, monkeypatch):
    """scripts/unpack_prompts.sh with stand-ins for apt-get and dpkg-deb (no network in tests): each
    package unpacked into its own folder, the layout ``realneg.folder`` reads; a second run downloads
    nothing; a failed download is one sentence naming the fix."""
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "apt.log"
    (bin_ / "apt-get").write_text(f"""#!/bin/sh
[ -n "$FAIL" ] && exit 100
echo "$@" >> {log}
shift
for p in "$@"; do touch "${{p}}_1.0_all.deb"; done
""")
    (bin_ / "dpkg-deb").write_text("""#!/bin/sh
case "$2" in
  *es-co*) d=es ;; *armelle*) d=fr ;; *menardi*) d=it_IT_f_Menardi ;;
esac
mkdir -p "$3/usr/share/asterisk/sounds/$d" && touch "$3/usr/share/asterisk/sounds/$d/activated.gsm"
""")
    for f in bin_.iterdir():
        f.chmod(0o755)
    dest = tmp_path / "unpacked"
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "EDGELEARN_ASTERISK_PROMPTS": str(dest)}
    run = lambda **extra: subprocess.run(["bash", str(root / "scripts" / "unpack_prompts.sh")],  # noqa: E731
                                         env={**env, **extra}, capture_output=True, text=True)
    failed = run(FAIL="1")
    assert failed.returncode == 1 and failed.stderr.strip().count("\n") == 0 and "apt-get update" in failed.stderr
    first = run()
    assert first.returncode == 0, first.stderr
    monkeypatch.setattr(realneg, "PROMPTS", dest)
    for lang in realneg.TRANSLATED:
        assert (realneg.folder(lang) / "activated.gsm").is_file()
    again = run()
    assert again.returncode == 0 and "all three" in again.stdout
    assert log.read_text().count("download") == 1
