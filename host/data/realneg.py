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

Three more speakers come in Debian's asterisk-prompt packages, ~43 usable minutes together:
Colombian Spanish (``es-co``, GSM, GPL-2), Armelle Desjardins' French (``fr-armelle``, GSM,
GPL-2+) and Paola Dal Zot's Italian (``it-menardi``, CC-BY-SA-3.0). They carry no transcripts,
but their prompts have Asterisk's names, so the English transcript of the same name says what
each means (``TRANSLATED``), and a prompt meaning "no" (their "no", "non") is left out by it.
They cannot be installed beside the core sounds (apt replaces asterisk-core-sounds-es and -fr,
whose transcripts the benchmark reads), so ``scripts/unpack_prompts.sh`` unpacks the Debian
packages under ``PROMPTS``, one folder each. Nothing trains on them: they are development
speech for choosing between models (scripts/curve_variants.py), a longer stream than the
English development half's 16 minutes.

    >>> wins = windows(("fr", "it"))     # list of 1 s int16 windows at 16 kHz, [] if none installed
    >>> held = prompts("ru")             # [(name, text, 16 kHz float32)] for false accepts
"""

from __future__ import annotations

import gzip
import os
import re
from pathlib import Path

import numpy as np

SOUNDS = Path("/usr/share/asterisk/sounds")
# where scripts/unpack_prompts.sh unpacks the asterisk-prompt packages: PROMPTS/<package>/usr/share/...
PROMPTS = Path(os.environ.get("EDGELEARN_ASTERISK_PROMPTS", Path(__file__).resolve().parents[2] / ".cache"
                              / "asterisk-prompts"))
DOCS = Path("/usr/share/doc")
# language -> (prompt folder, Debian package)
SPEAKERS = {"es": ("es_MX_f_Allison", "asterisk-core-sounds-es-wav"),  # Allison: false accepts only
            "fr": ("fr_CA_f_June", "asterisk-core-sounds-fr-wav"),
            "it": ("it_IT_m_Carlo", "asterisk-core-sounds-it-wav"),
            "ru": ("ru_RU_f_IvrvoiceRU", "asterisk-core-sounds-ru-wav"),
            "es-co": ("es", "asterisk-prompt-es-co"),
            "fr-armelle": ("fr", "asterisk-prompt-fr-armelle"),
            "it-menardi": ("it_IT_f_Menardi", "asterisk-prompt-it-menardi-wav")}
# no transcripts of their own: core-sounds-en's text of the same prompt name gives the meaning
TRANSLATED = ("es-co", "fr-armelle", "it-menardi")
SOUNDALIKE = {"yes", "no", "non", "nò", "up", "down", "left", "right", "on", "off", "stop", "go",
              "zero", "ok", "okay", "стоп", "он", "но", "ноль", "ап", "гоу"}
MIN_RMS = 100.0  # a window quieter than this (int16 scale) is a pause, not speech


def check_languages(langs, what: str, allowed=None) -> None:
    """One EdgelearnError naming the first of ``langs`` that is not a language of ``allowed`` (default
    every one of ``SPEAKERS``) and the ones to choose from."""
    from edge.errors import EdgelearnError

    allowed = SPEAKERS if allowed is None else allowed
    unknown = [lg for lg in langs if lg not in allowed]
    if unknown:
        raise EdgelearnError(f"{what} language {unknown[0]!r} has no prompts here",
                             fix=f"use some of {', '.join(sorted(allowed))}")


def missing(langs) -> str | None:
    """One sentence naming the packages to install, or None."""
    unpack = [SPEAKERS[lg][1] for lg in langs if lg in TRANSLATED and not folder(lg).is_dir()]
    if unpack:
        return (f"these speakers need Debian's {', '.join(unpack)} unpacked under {PROMPTS} (not installed: "
                "apt would remove asterisk-core-sounds-es and -fr): run scripts/unpack_prompts.sh")
    bad = [SPEAKERS[lg][1] for lg in langs if lg not in TRANSLATED and not folder(lg).is_dir()]
    if set(langs) & set(TRANSLATED) and not transcripts("en"):
        bad.append("asterisk-core-sounds-en")  # the meaning of their prompts
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

    where = folder(lang)
    out = []
    for name, text in sorted(transcripts("en" if lang in TRANSLATED else lang).items()):
        path = next((p for p in (where / f"{name}.wav", where / f"{name}.gsm") if p.is_file()), None)
        if path is not None and usable(text):
            pcm, rate = read_wav_file(path) if path.suffix == ".wav" else read_gsm(path)
            out.append((name, text, np.asarray(resample(pcm, rate, 16000), np.float32)))
    return out


def folder(lang: str) -> Path:
    """Where ``lang``'s prompts are: the installed core sounds, or an unpacked prompt package."""
    name, package = SPEAKERS[lang]
    return PROMPTS / package / "usr/share/asterisk/sounds" / name if lang in TRANSLATED else SOUNDS / name


def read_gsm(path) -> tuple[np.ndarray, int]:
    """A headerless GSM 06.10 prompt (8 kHz mono, as Asterisk stores them) -> (int16 samples, 8000)."""
    import soundfile  # librosa's dependency (the host extra); libsndfile decodes GSM 06.10

    return soundfile.read(str(path), format="RAW", subtype="GSM610", samplerate=8000, channels=1,
                          dtype="int16")[0], 8000


def windows(langs=("fr", "it"), hop_s: float = 1.0, seed: int = 0) -> list[np.ndarray]:
    """Every installed, usable prompt of ``langs`` cut into 1 s windows (``cut``)."""
    rng = np.random.default_rng(seed)
    return [w for lang in langs for _, _, x in prompts(lang) for w in cut(x, rng, hop_s)]


def cut(x: np.ndarray, rng, hop_s: float = 1.0) -> list[np.ndarray]:
    """Speech ``x`` (16 kHz) as 1 s int16 windows ``hop_s`` apart from a random start (padded to 1 s if
    shorter); windows under ``MIN_RMS`` are pauses and dropped."""
    hop = int(hop_s * 16000)
    if len(x) < 16000:
        x = np.pad(x, (0, 16000 - len(x)))
    out = []
    for a in range(int(rng.integers(0, min(hop, len(x) - 16000 + 1))), len(x) - 16000 + 1, hop):
        w = x[a:a + 16000]
        if np.sqrt(np.mean(w ** 2)) >= MIN_RMS:
            out.append(np.clip(w, -32768, 32767).astype(np.int16))
    return out
