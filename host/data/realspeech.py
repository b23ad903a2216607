"""Real human speech: the Allison prompts of Debian's asterisk-core-sounds-en-wav.

What the benchmarks report on (the test half) and what the toolchain chooses on (the development
half: ``host.phrase_stage`` sets the phrase models' cutoffs on it). Moved here from
``bench/_realspeech.py`` (which re-exports it) so that ``edgelearn model`` can use it: ``host``
imports no benchmark code. One US female speaker, ~25 minutes of telephone prompts at 8 kHz (the
front end's 4 kHz top makes that fair), with the transcripts in ``host/data/allison_transcripts.txt``.
The prompts are split by file name into a development half (thresholds and rules may be
chosen on it) and a test half (only reported, looked at once per change): ``split(name)``
hashes the path, so the halves never move when prompts are added.

A prompt is negative speech for a keyword when its transcript does not say the keyword
as a word ("yesterday" is negative speech for "yes", "logged on" is not for "on"); digits
written as numerals count as the spoken words ("press 1" says "one").

    >>> prompts = load_prompts()                       # [] where the package is missing
    >>> dev = [p for p in prompts if p.split == "dev"]
    >>> stream, spans = concat(dev)                    # 16 kHz int16, (start_s, end_s) each
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SOUNDS = Path("/usr/share/asterisk/sounds/en_US_f_Allison")
TRANSCRIPTS = Path(__file__).resolve().parent / "allison_transcripts.txt"
PACKAGE = "asterisk-core-sounds-en-wav"
NUMERALS = {"0": "zero", "1": "one", "2": "two", "3": "three", "4": "four", "5": "five",
            "6": "six", "7": "seven", "8": "eight", "9": "nine"}


@dataclass
class Prompt:
    name: str          # path under the sounds folder, without .wav
    text: str
    words: tuple       # lower-case spoken words
    split: str         # "dev" | "test"
    pcm: np.ndarray    # 16 kHz float32 (int16 scale)

    @property
    def seconds(self) -> float:
        return len(self.pcm) / 16000

    def says(self, keyword: str) -> bool:
        kw = keyword.lower().split()
        n = len(kw)
        return any(list(self.words[i:i + n]) == kw for i in range(len(self.words) - n + 1))


def split(name: str) -> str:
    """'dev' or 'test' from the name alone (sha1 parity): half each, fixed forever."""
    return "dev" if hashlib.sha1(name.encode()).digest()[0] % 2 == 0 else "test"


def spoken_words(text: str) -> tuple:
    out = []
    for tok in re.findall(r"[A-Za-z']+|\d+", text):
        if tok.isdigit():
            out.extend(NUMERALS[d] for d in tok)  # "1234" is read digit by digit in these prompts
        else:
            out.append(tok.lower().strip("'"))
    return tuple(out)


def transcripts(path=TRANSCRIPTS) -> dict:
    out = {}
    for line in Path(path).read_text().splitlines():
        if not line.strip() or line.startswith(";") or ":" not in line:
            continue
        name, text = line.split(":", 1)
        out[name.strip()] = text.strip()
    return out


def is_speech(text: str) -> bool:
    """Tones, silence and beeps are written [..], (..) or <..> in the transcripts."""
    return not re.fullmatch(r"\s*[\[(<].*[\])>]\s*", text)


def load_prompts(root=SOUNDS, which: str | None = None) -> list[Prompt]:
    """Every transcribed speech prompt that is installed (``which``: 'dev', 'test' or both)."""
    from host.data.synth import read_wav_file, resample

    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for name, text in sorted(transcripts().items()):
        path = root / f"{name}.wav"
        if not path.is_file() or not is_speech(text):
            continue
        sp = split(name)
        if which is not None and sp != which:
            continue
        pcm, rate = read_wav_file(path)
        out.append(Prompt(name, text, spoken_words(text), sp, resample(pcm, rate, 16000)))
    return out


def missing_reason() -> str | None:
    if SOUNDS.is_dir():
        return None
    return f"real speech needs Debian's {PACKAGE} (apt-get install {PACKAGE})"


def other_speakers(langs) -> tuple[np.ndarray, float, str] | None:
    """(int16 stream, hours, what) of ``langs``' installed prompts (``host.data.realneg``: other
    speakers, other languages), or None without them."""
    from host.data import realneg

    langs = [lg for lg in langs if not realneg.missing([lg])]
    prompts = [Prompt(name, text, (), "test", pcm) for lg in langs for name, text, pcm in realneg.prompts(lg)]
    if not prompts:
        return None
    pcm, _ = concat(prompts)
    return pcm, len(pcm) / 16000 / 3600, "+".join(langs)


def concat(prompts, gap_s: float = 0.5, floor_rms: float = 3.0) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """One int16 stream: the prompts in order with ``gap_s`` of silence between them, over a
    microphone-like noise floor (~-80 dBFS; no real input is digital zero)."""
    gap = np.zeros(int(gap_s * 16000), np.int16)
    parts, spans, t = [], [], 0.0
    for p in prompts:
        parts += [np.clip(p.pcm, -32768, 32767).astype(np.int16), gap]
        spans.append((t, t + p.seconds))
        t += p.seconds + gap_s
    if not parts:
        return np.zeros(0, np.int16), spans
    pcm = np.concatenate(parts).astype(np.float32)
    pcm += np.random.default_rng(0).standard_normal(len(pcm)).astype(np.float32) * floor_rms
    return np.clip(pcm, -32768, 32767).astype(np.int16), spans
