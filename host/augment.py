"""On-the-fly training augmentation, in numpy, one fresh draw per epoch.

Waveform: speed perturbation (resampling by 0.85-1.15, which moves pitch and
formants together, as Kaldi's speed perturbation), random placement (time
shift) in the 1 s window, gain, spectral tilt (first-order pre/de-emphasis),
reverberation with synthetic rooms, and noise (white/pink/brown/babble) at a
random SNR. Features: vocal tract length perturbation (a warped mel
filterbank per clip) and SpecAugment time and coefficient masks. The issue's note
on why: the corpus and augmentation matter more than the network for voices
the model never heard.

    >>> aug = Augmenter(utterances, labels, babble_pool, seed=0)
    >>> x, y = aug.epoch()          # (N, 49, 10) normalised features, label ids
"""

from __future__ import annotations

from math import gcd

import numpy as np

from edge import features as F
from host.data import noise as N
from host.data.corpus import add_background

SPEEDS = (0.85, 0.9, 0.95, 1.0, 1.0, 1.05, 1.1, 1.15)


def speed_perturb(utt: np.ndarray, factor: float) -> np.ndarray:
    if factor == 1.0:
        return utt.astype(np.float32)
    from scipy.signal import resample_poly

    up, down = 100, int(round(100 * factor))
    g = gcd(up, down)
    return resample_poly(utt.astype(np.float32), up // g, down // g).astype(np.float32)


def tilt(x: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """y[n] = x[n] - c x[n-1] per row: c > 0 brightens, c < 0 darkens."""
    y = x.copy()
    y[:, 1:] -= coef[:, None] * x[:, :-1]
    return y


def reverb(rng, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    from scipy.signal import fftconvolve

    out = x.copy()
    for r in rows:
        h = N.room_impulse(rng, rt60=rng.uniform(0.15, 0.7))
        wet = fftconvolve(x[r], h)[: x.shape[1]]
        out[r] = wet * (np.abs(x[r]).max() / max(np.abs(wet).max(), 1e-6))
    return out


def spec_augment(rng, feats: np.ndarray, time_masks=2, max_t=6, coef_masks=1, max_c=2) -> np.ndarray:
    out = feats.copy()
    n, T, C = out.shape
    for _ in range(time_masks):
        w = rng.integers(0, max_t + 1, n)
        s = rng.integers(0, T, n)
        t = np.arange(T)[None, :]
        out[(t >= s[:, None]) & (t < (s + w)[:, None])] = 0.0
    for _ in range(coef_masks):
        w = rng.integers(0, max_c + 1, n)
        s = rng.integers(1, C, n)
        c = np.arange(C)[None, :]
        m = (c >= s[:, None]) & (c < (s + w)[:, None])
        out[np.broadcast_to(m[:, None, :], out.shape)] = 0.0
    return out


def features_for(clips: np.ndarray, scale, batch: int = 2048, warps=None) -> np.ndarray:
    """(N, 16000) float/int16 clips -> (N, 49, 10) normalised float32 model inputs.

    ``warps``: optional per-clip frequency-warp factors (VTLP, training only).
    """
    out = np.empty((len(clips), F.N_FRAMES, F.N_MFCC), np.float32)
    if warps is None:
        for a in range(0, len(clips), batch):
            c = clips[a:a + batch].astype(np.float32) / 32768.0  # int16 scale in, either dtype
            out[a:a + batch] = F.normalize(F.mfcc(c), scale)
        return out
    warps = np.asarray(warps)
    for w in np.unique(warps):
        rows = np.nonzero(warps == w)[0]
        fb = F.mel_matrix(float(w))
        for a in range(0, len(rows), batch):
            r = rows[a:a + batch]
            out[r] = F.normalize(F.mfcc(clips[r].astype(np.float32) / 32768.0, fb), scale)
    return out


class Augmenter:
    def __init__(self, utterances: list, labels: np.ndarray, babble_pool: list, scale,
                 silence_label: int, silence_share: float = 1 / 37, seed: int = 0,
                 reverb_share: float = 0.3, clean_share: float = 0.15, specaug: bool = True,
                 vtlp_share: float = 0.8):
        self.utts, self.labels, self.pool = utterances, np.asarray(labels), babble_pool
        self.scale, self.silence_label = scale, silence_label
        self.n_sil = max(1, int(len(utterances) * silence_share))
        self.rng = np.random.default_rng(seed)
        self.reverb_share, self.clean_share, self.specaug = reverb_share, clean_share, specaug
        self.vtlp_share = vtlp_share

    def epoch(self, rows: bool = False):
        """One epoch's (features, labels); with ``rows`` also each example's source row (an index
        into the utterances, or ``len(utterances)`` and up for the silence examples)."""
        rng = self.rng
        n_sp = len(self.utts)
        x = np.zeros((n_sp + self.n_sil, 16000), np.float32)
        for i, u in enumerate(self.utts):
            x[i] = N.place(rng, speed_perturb(u, SPEEDS[rng.integers(len(SPEEDS))]))
        sp_rows = np.arange(n_sp)
        x[:n_sp] *= (10 ** (rng.uniform(-12, 6, n_sp) / 20))[:, None]
        x[:n_sp] = tilt(x[:n_sp], rng.uniform(-0.6, 0.9, n_sp).astype(np.float32))
        rv = sp_rows[rng.random(n_sp) < self.reverb_share]
        x = reverb(rng, x, rv)
        x = add_background(rng, x, self.pool, speech_rows=n_sp, clean_share=self.clean_share,
                           snr=(0.0, 30.0))
        x = np.clip(x, -32768, 32767)
        y = np.concatenate([self.labels, np.full(self.n_sil, self.silence_label)])
        # VTLP: warp the mel axis per clip (9 factors, 0.88-1.12) so the model
        # sees vocal tracts between the few voices each synthesizer has.
        warps = np.where(rng.random(len(y)) < self.vtlp_share,
                         rng.choice(np.linspace(0.88, 1.12, 9), len(y)), 1.0)
        feats = features_for(x, self.scale, warps=warps)
        if self.specaug:
            feats = spec_augment(rng, feats)
        perm = rng.permutation(len(y))
        return (feats[perm], y[perm], perm) if rows else (feats[perm], y[perm])
