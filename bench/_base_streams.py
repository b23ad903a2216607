"""Streams for the base-command benchmark: unseen synthetic voices in noise, real speech.

Positives: the ten commands spoken by CMU Flite's awb, rms and slt (a synthesizer no model
trains on; slt is also the held-out Festival voice's speaker), each command by each voice in
``TEST_RENDERS`` fresh renders at random rate and pitch, placed one after another with
``GAP_S`` of silence between them, clean and with noise over the whole stream (white, pink
and babble of espeak-ng filler words, each a third of the clips) at 20 and 10 dB SNR
measured on the speech. ``ADAPT_RENDERS`` other renders per command and voice (fixed rates,
one pitch) are what a user would record to adapt the model to that voice.

A positive is heard when the Detector reports its command between the clip's start - 0.1 s
and its end + 1 s; any other event on a positive stream is a substitution.

    >>> clips = render_voice("awb", seed=1)
    >>> pcm, spans = positive_stream(clips, snr_db=20, seed=0)
"""

from __future__ import annotations

from dataclasses import dataclass

import hashlib
from pathlib import Path

import numpy as np

from host.data import noise as N
from host.data import synth as S
from host.data.words import COMMANDS10, FILLERS

VOICES = ("awb", "rms", "slt")
TEST_RENDERS = 6
ADAPT_RATES = (0.9, 1.0, 1.1)
GAP_S = 1.5
SNRS = (None, 20, 10)
COLOURS = ("white", "pink", "babble")


@dataclass
class Clip:
    voice: str
    word: str
    pcm: np.ndarray  # int16, 16 kHz


def render_voice(voice: str, seed: int) -> list[Clip]:
    """TEST_RENDERS renders of every command at rate U(0.8, 1.25), pitch U(0.85, 1.2)."""
    rng = np.random.default_rng(seed)
    jobs = [(w, float(rng.uniform(0.8, 1.25)), float(rng.uniform(0.85, 1.2)))
            for w in COMMANDS10 for _ in range(TEST_RENDERS)]
    return [Clip(voice, w, p) for (w, _, _), p in zip(jobs, S.render(S.Voice("flite", voice), jobs))]


def adapt_clips(voice: str, unknown: int = 0, silence: int = 0, seed: int = 2) -> list[Clip]:
    """Three recordings per command (rates 0.9 / 1.0 / 1.1 at the voice's own pitch), plus
    ``unknown`` recordings of other words (``_unknown_``: FILLERS the test never says) and
    ``silence`` seconds of room noise (``_silence_``), as a user would give ``device adapt``."""
    rng = np.random.default_rng(seed)
    jobs = [(w, r, 1.0) for w in COMMANDS10 for r in ADAPT_RATES]
    jobs += [(w, float(rng.uniform(0.9, 1.1)), 1.0) for w in FILLERS[20:20 + unknown]]
    pcms = S.render(S.Voice("flite", voice), jobs)
    out = [Clip(voice, w if w in COMMANDS10 else "_unknown_", p) for (w, _, _), p in zip(jobs, pcms)]
    for i in range(silence):
        colour = COLOURS[i % 2]
        noise = N.coloured_noise(rng, colour, (1, S.SR))[0] * float(rng.uniform(30, 300))
        out.append(Clip(voice, "_silence_", noise.astype(np.int16)))
    return out


def word_half(word: str) -> int:
    """0 or 1 from the word alone: the two halves of the phone model's word list never share a word."""
    return hashlib.sha1(("word:" + word).encode()).digest()[0] % 2


def other_speech(voice, n: int = 300, seed: int = 7, half: int | None = None, avoid=()) -> np.ndarray:
    """~n word pairs by ``voice`` itself that say no command (the phone model's word list), with
    0.3-1.2 s pauses over the microphone floor: the adapted speaker talking about other things.
    ``half``: words of one half of the list only (``word_half``): half 1 is what a device heard
    before adapting (ambient), half 0 what it is scored on, so no word is in both. ``voice``: a
    Flite voice name or an ``S.Voice``; ``avoid``: more words to leave out."""
    rng = np.random.default_rng(seed)
    words = [w for w in (Path(S.__file__).parent / "phone_words.txt").read_text().split()
             if w not in COMMANDS10 and w not in avoid and (half is None or word_half(w) == half)]
    jobs = [(f"{rng.choice(words)} {rng.choice(words)}", float(rng.uniform(0.85, 1.2)),
             float(rng.uniform(0.9, 1.1))) for _ in range(n)]
    parts = []
    for p in S.render(voice if isinstance(voice, S.Voice) else S.Voice("flite", voice), jobs):
        parts += [p, np.zeros(int(rng.uniform(0.3, 1.2) * S.SR), np.int16)]
    out = np.concatenate(parts).astype(np.float32) + with_floor(rng, sum(len(p) for p in parts))
    return np.clip(out, -32768, 32767).astype(np.int16)


def babble_pool() -> list[np.ndarray]:
    voices = [S.Voice("espeak", v) for v in ("en-us+m3", "en-gb+f2", "en-us+f4", "en-029+m1")]
    return [p for v in voices for p in S.render(v, [(w, 1.0, 1.0) for w in FILLERS[:20]])]


def voice_streams(voices=VOICES, seed: int = 11, stream_seed: int = 5, pool=None) -> dict:
    """{(voice, snr): (int16 stream, spans, clips)} for every voice and ``SNRS`` level: voice i's
    renders drawn with ``seed + i``, its streams with ``stream_seed``. The defaults are bench
    ``kws_base``'s streams; development scripts pass other seeds (``scripts/asr_stage.py``'s 101, 55)."""
    pool = babble_pool() if pool is None else pool
    clips = {v: render_voice(v, seed=seed + i) for i, v in enumerate(voices)}
    return {(v, snr): (*positive_stream(clips[v], snr, seed=stream_seed, pool=pool), clips[v])
            for v in voices for snr in SNRS}


def _noise(rng, i: int, n: int, pool) -> np.ndarray:
    """n samples of the i-th stretch's noise: white, pink and babble in turn."""
    colour = COLOURS[i % len(COLOURS)]
    if colour == "babble":
        return N.babble(rng, pool, 1, n=n)[0]
    return N.coloured_noise(rng, colour, (1, n))[0]


def positive_stream(clips: list[Clip], snr_db=None, seed: int = 0, pool=None):
    """(int16 stream, [(start_s, end_s)] per clip); noise over everything at ``snr_db``."""
    rng = np.random.default_rng(seed)
    gap = int(GAP_S * S.SR)
    total = sum(len(c.pcm) for c in clips) + gap * (len(clips) + 1)
    out = np.zeros(total, np.float32)
    spans, at = [], gap
    for c in clips:
        out[at:at + len(c.pcm)] = c.pcm
        spans.append((at / S.SR, (at + len(c.pcm)) / S.SR))
        at += len(c.pcm) + gap
    out += with_floor(rng, total)
    if snr_db is None:
        return np.clip(out, -32768, 32767).astype(np.int16), spans
    speech = np.concatenate([c.pcm.astype(np.float32) for c in clips])
    p_speech = float((speech ** 2).mean())
    for i, ((a, b), c) in enumerate(zip(spans, clips)):
        lo = int(a * S.SR) - gap if i else 0
        hi = int(b * S.SR) + (gap if i == len(clips) - 1 else 0)
        out[lo:hi] += _noise(rng, i, hi - lo, pool) * np.sqrt(p_speech / 10 ** (snr_db / 10))
    return np.clip(out, -32768, 32767).astype(np.int16), spans


def noisy_speech(pcm: np.ndarray, spans, snr_db: float, seed: int = 0, pool=None) -> np.ndarray:
    """A stream of speech (e.g. ``_realspeech.concat``'s prompts, ``spans`` in seconds) with noise over
    it as ``positive_stream`` mixes it: white, pink and babble in turn, one stretch per utterance
    (to the midpoints of the gaps), at ``snr_db`` below the utterances' mean speech power. Negative
    speech as noisy as the positives."""
    rng = np.random.default_rng(seed)
    x = pcm.astype(np.float32)
    cuts = [(int(a * S.SR), int(b * S.SR)) for a, b in spans]
    p_speech = float(np.mean(np.concatenate([x[a:b] for a, b in cuts]) ** 2))
    edges = [0] + [(cuts[i][1] + cuts[i + 1][0]) // 2 for i in range(len(cuts) - 1)] + [len(x)]
    for i in range(len(cuts)):
        lo, hi = edges[i], edges[i + 1]
        x[lo:hi] += _noise(rng, i, hi - lo, pool) * np.sqrt(p_speech / 10 ** (snr_db / 10))
    return np.clip(x, -32768, 32767).astype(np.int16)


def with_floor(rng, n: int, rms: float = 3.0) -> np.ndarray:
    """A microphone's own noise, ~-80 dBFS: no real input is digital zero, and PocketSphinx's
    keyphrase search fires on exact zeros (bench/peers/README.md)."""
    return rng.standard_normal(n).astype(np.float32) * rms


def refractory(events: list[dict], seconds: float = 1.0) -> list[dict]:
    """One event per utterance, as the Detector's refractory period gives: drop events within
    ``seconds`` after the last kept one (for peers that report every hit)."""
    kept = []
    for e in sorted(events, key=lambda e: e["time_s"]):
        if not kept or e["time_s"] - kept[-1]["time_s"] >= seconds:
            kept.append(e)
    return kept


def score_positives(events: list[dict], spans, clips: list[Clip], words=COMMANDS10, noisy: bool = False) -> dict:
    """Hits per clip and substitutions (events naming another command on a clip); ``balanced``:
    the mean over ``words`` of each word's recall. ``noisy`` (a ``positive_stream`` with noise,
    clip i under ``COLOURS[i % 3]``): also ``by_noise``, the recall of each noise's clips."""
    hits, subs = [], 0
    for (a, b), c in zip(spans, clips):
        near = [e for e in events if a - 0.1 <= e["time_s"] <= b + 1.0]
        hits.append(any(e["keyword"] == c.word for e in near))
        subs += sum(e["keyword"] != c.word for e in near)
    per_word = {w: float(np.mean([h for h, c in zip(hits, clips) if c.word == w])) for w in words
                if any(c.word == w for c in clips)}
    out = {"recall": float(np.mean(hits)), "balanced": float(np.mean(list(per_word.values()))),
           "per_word": per_word, "substitutions": subs, "n": len(clips)}
    if noisy:
        out["by_noise"] = {c: float(np.mean(hits[k::len(COLOURS)])) for k, c in enumerate(COLOURS)
                           if hits[k::len(COLOURS)]}
    return out


def false_accepts(events: list[dict], spans, prompts) -> dict:
    """Events on real speech outside the prompts that say that keyword; per hour of the stream."""
    fa, found, said = [], 0, 0
    for e in events:
        inside = [p for (a, b), p in zip(spans, prompts) if a - 0.3 <= e["time_s"] <= b + 1.0]
        if not any(p.says(e["keyword"]) for p in inside):
            fa.append({"keyword": e["keyword"], "time_s": e["time_s"],
                       "prompt": inside[0].name if inside else None})
    for (a, b), p in zip(spans, prompts):
        for w in COMMANDS10:
            if p.says(w):
                said += 1
                found += any(e["keyword"] == w and a - 0.3 <= e["time_s"] <= b + 1.0 for e in events)
    hours = (spans[-1][1] if spans else 0.0) / 3600
    return {"fa": len(fa), "hours": hours, "fa_per_hour": len(fa) / hours if hours else None,
            "in_sentence_found": found, "in_sentence_said": said, "examples": fa[:12]}
