"""The audio of one ESPHome training context (``host/export/esphome_data.py`` builds the windows from
them): an utterance augmented and placed after a second of background, noise or babble at 5-30 dB,
a random level, optionally band-limited like the telephone prompts (``_positive_context``), and the
user's clip turned into negatives in its own voice: scrambled or reversed (``scrambled``), its two
halves swapped (``swapped``).
"""

from __future__ import annotations

import numpy as np

from host.export import frontend as FE


def _floor(rng, n: int) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32) * 3.0


def _background(rng, n: int, speech_power: float, pool, babble_snr=None) -> np.ndarray:
    """Noise for an n-sample context: 20 % none, else coloured noise or babble at 5-30 dB SNR; with
    ``babble_snr`` (lo, hi) and a babble pool, babble at lo-hi dB always."""
    from host.data import noise as N

    if babble_snr is not None and pool:
        noise = N.babble(rng, pool, 1, n=n)[0]
        snr = rng.uniform(*babble_snr)
        return noise * np.float32(np.sqrt(speech_power / 10 ** (snr / 10)))
    if rng.random() < 0.2:
        return np.zeros(n, np.float32)
    kind = rng.integers(4) if pool else rng.integers(3)
    if kind == 3:
        noise = N.babble(rng, pool, 1, n=n)[0]
    else:
        noise = N.coloured_noise(rng, ("white", "pink", "brown")[kind], (1, n))[0]
    snr = rng.uniform(5.0, 30.0)
    return noise * np.float32(np.sqrt(speech_power / 10 ** (snr / 10)))


def telephone_band(x: np.ndarray) -> np.ndarray:
    """x (16 kHz) through 8 kHz and back: nothing above 4 kHz, as the real-speech prompts."""
    from scipy.signal import resample_poly

    return resample_poly(resample_poly(x, 1, 2), 2, 1)[: len(x)].astype(np.float32)


def _channel(rng, x: np.ndarray, telephone: float) -> np.ndarray:
    """The speech of one context, band-limited to 4 kHz with probability ``telephone``."""
    return telephone_band(x) if telephone and rng.random() < telephone else x


def _augment_utt(rng, utt: np.ndarray) -> np.ndarray:
    from host import augment as A
    from host.data import noise as N

    x = A.speed_perturb(utt, float(rng.choice(A.SPEEDS)))
    if rng.random() < 0.3:
        from scipy.signal import fftconvolve
        h = N.room_impulse(rng, rt60=rng.uniform(0.15, 0.6))
        wet = fftconvolve(x, h)[: len(x) + int(0.1 * FE.SAMPLE_RATE)]
        x = (wet * (np.abs(x).max() / max(np.abs(wet).max(), 1e-6))).astype(np.float32)
    return x


def _power(x: np.ndarray) -> float:
    a = np.abs(x) > 0.05 * max(float(np.abs(x).max()), 1e-6)
    return float((x[a] ** 2).mean()) if a.any() else 1.0


def _level(rng, ctx: np.ndarray) -> np.ndarray:
    """A random peak level (the front end's PCAN evens most of it out)."""
    peak = float(np.abs(ctx).max()) or 1.0
    return np.clip(ctx * (rng.uniform(0.05, 0.8) * 32767 / peak), -32768, 32767).astype(np.int16)


def _positive_context(rng, utt: np.ndarray, pool, telephone: float = 0.0, babble_snr=None):
    """(int16 context, end sample of the phrase, start sample) with ~1-1.3 s of background first
    (``_background``'s, ``babble_snr`` passed on)."""
    x = _channel(rng, _augment_utt(rng, utt), telephone)
    lead = int(rng.uniform(1.05, 1.3) * FE.SAMPLE_RATE)
    tail = int(0.35 * FE.SAMPLE_RATE)
    n = lead + len(x) + tail
    ctx = np.zeros(n, np.float32)
    ctx[lead:lead + len(x)] = x
    ctx += _background(rng, n, _power(x), pool, babble_snr) + _floor(rng, n)
    return _level(rng, ctx), lead + len(utt_speech_end(x)), lead


def utt_speech_end(x: np.ndarray) -> np.ndarray:
    """The utterance up to its last 10 ms block within 30 dB of its loudest (reverb tails excluded)."""
    block = 160
    nb = len(x) // block
    if nb == 0:
        return x
    e = (x[: nb * block].reshape(nb, block).astype(np.float64) ** 2).mean(axis=1)
    idx = np.nonzero(e > e.max() * 1e-3)[0]
    return x[: (idx[-1] + 1) * block]


def scrambled(rng, x: np.ndarray) -> np.ndarray:
    """The clip with its content destroyed and its voice kept: reversed, or cut into 60-160 ms
    pieces put back in random order (a negative in the positives' own voice and channel)."""
    if rng.random() < 0.3:
        return x[::-1].copy()
    cuts, at = [], 0
    while at < len(x):
        n = int(rng.uniform(0.06, 0.16) * FE.SAMPLE_RATE)
        cuts.append(x[at:at + n])
        at += n
    order = rng.permutation(len(cuts))
    if len(order) > 1 and (order == np.arange(len(order))).all():
        order = order[::-1]
    return np.concatenate([cuts[i] for i in order]).astype(np.float32)


def swapped(x: np.ndarray) -> np.ndarray:
    """The clip's two halves swapped, cut at its quietest 10 ms block in the middle 30-70 % (between
    its words, where it has two): its own sounds, whole, in the wrong order (a negative in the
    positives' own voice and channel)."""
    block = 160
    nb = len(x) // block
    if nb < 5:
        return x[::-1].copy()
    e = (x[: nb * block].reshape(nb, block).astype(np.float64) ** 2).mean(axis=1)
    lo, hi = int(0.3 * nb), max(int(0.3 * nb) + 1, int(0.7 * nb))
    cut = (lo + int(np.argmin(e[lo:hi]))) * block
    return np.concatenate([x[cut:], x[:cut]]).astype(np.float32)
