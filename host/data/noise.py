"""Background noise and room acoustics for the corpus and for training augmentation.

Coloured noise is shaped in the frequency domain (white: flat, pink: 1/f power,
brown: 1/f^2); babble is a sum of other synthesised utterances; rooms are
synthetic impulse responses (exponentially decaying noise with a direct path).
Everything is vectorised over a batch and driven by an explicit Generator.

    >>> rng = np.random.default_rng(0)
    >>> noise = coloured_noise(rng, "pink", (8, 16000))
    >>> mixed = mix_at_snr(speech, noise, snr_db=rng.uniform(5, 30, 8))
"""

from __future__ import annotations

import numpy as np

# coloured noise is generated in one place, on the device side (a device adapting makes its own)
from edge.adapt.ambient import COLOURS, coloured_noise  # noqa: F401 (re-exported)


def babble(rng: np.random.Generator, pool: list[np.ndarray], count: int, n: int = 16000,
           talkers=(3, 7)) -> np.ndarray:
    """(count, n) unit-RMS babble, each row the sum of 3..6 utterances at random offsets."""
    out = np.zeros((count, n), dtype=np.float32)
    for row in out:
        for _ in range(rng.integers(*talkers)):
            u = pool[rng.integers(len(pool))].astype(np.float32)
            start = rng.integers(-len(u) // 2, n - len(u) // 2)
            a, b = max(0, start), min(n, start + len(u))
            row[a:b] += u[a - start:b - start] * rng.uniform(0.3, 1.0)
    rms = np.sqrt((out ** 2).mean(axis=-1, keepdims=True))
    return out / np.maximum(rms, 1e-6)


def room_impulse(rng: np.random.Generator, rt60: float, sr: int = 16000) -> np.ndarray:
    """A synthetic room response: direct path plus exponentially decaying diffuse tail."""
    length = int(min(rt60, 0.6) * sr)
    t = np.arange(length) / sr
    tail = rng.standard_normal(length) * np.exp(-6.9 * t / rt60)  # -60 dB at rt60
    pre = int(rng.uniform(0.002, 0.01) * sr)
    tail[:pre] = 0.0
    h = np.concatenate([[1.0], tail * rng.uniform(0.1, 0.5)])
    return (h / np.sqrt((h ** 2).sum())).astype(np.float32)


def mix_at_snr(speech: np.ndarray, noise: np.ndarray, snr_db) -> np.ndarray:
    """speech + noise scaled so that the speech-to-noise power ratio is snr_db (per row)."""
    snr = np.asarray(snr_db, dtype=np.float32)[..., None]
    p_s = (speech.astype(np.float32) ** 2).mean(axis=-1, keepdims=True)
    p_n = (noise ** 2).mean(axis=-1, keepdims=True) + 1e-12
    # Speech occupies part of the window; measure its power over the active part.
    active = (np.abs(speech) > 1e-4).mean(axis=-1, keepdims=True)
    p_s = p_s / np.maximum(active, 0.1)
    return speech + noise * np.sqrt(p_s / (p_n * 10 ** (snr / 10)))


def place(rng: np.random.Generator, utt: np.ndarray, n: int = 16000) -> np.ndarray:
    """Put an utterance at a random position inside an n-sample window (float32)."""
    out = np.zeros(n, dtype=np.float32)
    u = utt[:n].astype(np.float32)
    start = rng.integers(0, n - len(u) + 1)
    out[start:start + len(u)] = u
    return out
