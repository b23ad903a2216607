"""Real human speech as training negatives: other speakers' telephone prompts from Debian.

Debian's asterisk-core-sounds packages hold each language's prompts spoken by one
professional speaker, 8 kHz, CC-BY-SA-3.0, with transcripts. Besides the English
Allison (the benchmark's real speech, never trained on) there are Canadian French
(June Wallack), Italian (Carlo, a man) and Russian, ~25 minutes each. None of them says
the English commands, so every second of them is real speech that must not fire: the
``_unknown_`` class, as the synthetic fillers are. The Mexican Spanish prompts are
Allison again, the benchmark's English test speaker: they are never trained on, only
counted for false accepts (``prompts``), as the Russian ones are when training takes
French and Italian. A prompt whose transcript holds a word that sounds like a command
("non", "no", "stop", ...) is left out.

    >>> wins = windows(("fr", "it"))     # list of 1 s int16 windows at 16 kHz, [] if none installed
    >>> held = prompts("ru")             # [(name, text, 16 kHz float32)] for false accepts
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import numpy as np

SOUNDS = Path("/usr/share/asterisk/sounds")
DOCS = Path("/usr/share/doc")
# language -> (prompt folder, Debian package)
SPEAKERS = {"es": ("es_MX_f_Allison", "asterisk-core-sounds-es-wav"),  # Allison: false accepts only
            "fr": ("fr_CA_f_June", "asterisk-core-sounds-fr-wav"),
            "it": ("it_IT_m_Carlo", "asterisk-core-sounds-it-wav"),
            "ru": ("ru_RU_f_IvrvoiceRU", "asterisk-core-sounds-ru-wav")}
SOUNDALIKE = {"yes", "no", "non", "nò", "up", "down", "left", "right", "on", "off", "stop", "go",
              "zero", "ok", "okay", "стоп", "он", "но", "ноль", "ап", "гоу"}
MIN_RMS = 100.0  # a window quieter than this (int16 scale) is a pause, not speech


def missing(langs) -> str | None:
    """One sentence naming the packages to install, or None."""
    bad = [SPEAKERS[lg][1] for lg in langs if not (SOUNDS / SPEAKERS[lg][0]).is_dir()]
    if not bad:
        return None
    return f"real-speech negatives need Debian's {', '.join(bad)} (apt-get install {' '.join(bad)})"


def transcripts(lang: str) -> dict:
    """{prompt name: text} from the package's core-sounds-LANG.txt.gz."""
    path = DOCS / f"asterisk-core-sounds-{lang}" / f"core-sounds-{lang}.txt.gz"
    if not path.is_file():
        return {}
    out = {}
    for line in gzip.open(path, "rt", encoding="utf-8", errors="replace"):
        line = line.strip().lstrip("\ufeff")
        if not line or line.startswith(";") or ":" not in line:
            continue
        name, text = line.split(":", 1)
        out[name.strip()] = text.strip()
    return out


def usable(text: str) -> bool:
    words = {w.lower() for w in re.findall(r"\w+", text)}
    return bool(words) and not (words & SOUNDALIKE)


def prompts(lang: str) -> list[tuple[str, str, np.ndarray]]:
    """Every installed, usable prompt of ``lang``: (name, text, 16 kHz float32 at int16 scale)."""
    from host.data.synth import read_wav_file, resample

    folder = SOUNDS / SPEAKERS[lang][0]
    out = []
    for name, text in sorted(transcripts(lang).items()):
        path = folder / f"{name}.wav"
        if path.is_file() and usable(text):
            pcm, rate = read_wav_file(path)
            out.append((name, text, np.asarray(resample(pcm, rate, 16000), np.float32)))
    return out


def windows(langs=("fr", "it"), hop_s: float = 1.0, seed: int = 0) -> list[np.ndarray]:
    """Every installed, usable prompt of ``langs`` cut into 1 s windows (16 kHz int16), ``hop_s``
    apart from a random start in each prompt; windows under ``MIN_RMS`` are dropped."""
    rng = np.random.default_rng(seed)
    hop = int(hop_s * 16000)
    out = []
    for lang in langs:
        for _, _, x in prompts(lang):
            if len(x) < 16000:
                x = np.pad(x, (0, 16000 - len(x)))
            for a in range(int(rng.integers(0, min(hop, len(x) - 16000 + 1))), len(x) - 16000 + 1, hop):
                w = x[a:a + 16000]
                if np.sqrt(np.mean(w ** 2)) >= MIN_RMS:
                    out.append(np.clip(w, -32768, 32767).astype(np.int16))
    return out
