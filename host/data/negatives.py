"""Keyword-free speech the host can make: word pairs by the corpus's training voices.

For operating points (``edge.operating``): bench ``kws_base`` calibrates on it, and an aggregator
publishing a federated version matches each word's threshold on it (``host/aggregator/models.py``,
``ModelRegistry.operating``): audio no device and no benchmark speaks, in voices the model trained
on, so what it measures is the model's own tendency to fire on everyday words.

    >>> pcm = word_pairs(900, seed=3)                 # ~24 min of 16 kHz int16
    >>> neg = stream_negatives(KeywordModel(bundle), pcm, keywords)  # init_state(..., negatives=neg)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def phrase_words() -> list[str]:
    """The phone model's word list less the commands: words no keyword is made of."""
    from host.data import synth as S
    from host.data.words import COMMANDS10

    return [w for w in (Path(S.__file__).parent / "phone_words.txt").read_text().split() if w not in COMMANDS10]


def training_voices(start: int = 0, step: int = 6) -> list:
    """Every ``step``-th espeak-ng training voice from ``start``."""
    from host.data import synth as S
    from host.data.corpus import CorpusConfig, assign_splits

    splits = assign_splits(S.all_voices(), CorpusConfig())
    return [v for v in S.espeak_voices() if splits[v.id] == "train"][start::step]


def word_pairs(n: int = 900, seed: int = 3, voices=None, words=None) -> np.ndarray:
    """~n two-word phrases from ``words`` (default ``phrase_words``) by ``voices`` (default every
    sixth espeak-ng training voice), with 0.3-1.2 s pauses: about 24 minutes for n = 900."""
    from host.data import synth as S

    rng = np.random.default_rng(seed)
    words = phrase_words() if words is None else words
    voices = training_voices() if voices is None else voices
    parts = []
    for v in voices:
        jobs = [(f"{rng.choice(words)} {rng.choice(words)}", float(rng.uniform(0.85, 1.2)), 1.0)
                for _ in range(n // len(voices))]
        for p in S.render(v, jobs):
            parts += [p, np.zeros(int(rng.uniform(0.3, 1.2) * S.SR), np.int16)]
    return np.concatenate(parts).astype(np.int16)


def stream_negatives(km, pcm: np.ndarray, keywords) -> dict:
    """``pcm`` as the Detector's windows: ``host.aggregator.setup.init_state``'s ``negatives`` (the
    encoder's embeddings in stream order, their end times, the keywords' label ids, hours)."""
    from edge.detect import Detector
    from edge.operating import stream_scores

    det = Detector(km, keywords=list(keywords))
    _, ends, hours, emb = stream_scores(det, pcm, embeddings=True)
    return {"X": emb, "ends": ends, "keywords": [list(km.labels).index(w) for w in keywords], "hours": hours}
