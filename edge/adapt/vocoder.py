"""Voice conversion by LPC analysis and resynthesis, numpy only, so a device can make it.

A federated device hears one voice; its word copies through this vocoder also sound like a shorter
or longer vocal tract with another pitch, so a round's update reaches voices outside the fleet
(``edge.fl.local.FL_CONVERT``, issue 18). Each 20 ms frame (10 ms hop) gets an order-18 all-pole
envelope (autocorrelation and Levinson-Durbin, as a speech codec's analysis); the envelope is warped
on the frequency axis (formants x ``formant_scale``) and the frame is resynthesised from either
- its own LPC residual (``buzz=False``: the voice's excitation kept, only the formants move), or
- a pulse train at the frame's pitch x ``f0_scale`` in voiced frames and white noise in unvoiced
  ones (``buzz=True``: the excitation of a parametric synthesizer such as Flite's clustergen
  voices or HTS).
Frames are overlap-added with a Hann window at 50 % overlap. The filters run in the frequency domain
(``SYN_FFT`` points, every frame at once) instead of scipy's ``lfilter``: the device tier has numpy
and no scipy, and an all-pole filter a sample at a time in Python would cost ~0.1 s a clip. The
all-pole responses have decayed by then (formant bandwidths of tens of Hz ring for a few ms), so the
circular tail is negligible. ``host.data.lpc_vocoder`` re-exports this module.

    >>> y = convert(x, f0_scale=1.7, formant_scale=1.15, buzz=True)   # float 16 kHz in and out
"""

from __future__ import annotations

import numpy as np

SR = 16000
FRAME = 320
HOP = 160
ORDER = 18
NFFT = 512          # the envelope's warping grid
SYN_FFT = 1024      # the synthesis filters' (frame + warm-up + the response's ring)
F0_MIN, F0_MAX = 60.0, 400.0
VOICED = 0.35       # normalised autocorrelation peak of the residual above which a frame is voiced


def _frames(x: np.ndarray) -> np.ndarray:
    n = 1 + max(0, int(np.ceil((len(x) - FRAME) / HOP)))
    pad = np.zeros((n - 1) * HOP + FRAME, np.float64)
    pad[: len(x)] = x
    idx = np.arange(FRAME)[None, :] + HOP * np.arange(n)[:, None]
    return pad[idx]


def levinson(r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Autocorrelations (F, ORDER + 1) -> (A (F, ORDER + 1) with A[:, 0] = 1, prediction error power
    (F,)), Levinson-Durbin over every frame at once; a silent frame gives A = [1, 0, ...]."""
    r = np.array(r, np.float64, ndmin=2)
    r[:, 0] *= 1.0 + 1e-6            # white-noise correction: a well-conditioned system on near-silence
    silent = r[:, 0] <= 1e-12
    a = np.zeros_like(r)
    a[:, 0] = 1.0
    err = np.where(silent, 1.0, r[:, 0])
    for i in range(1, r.shape[1]):
        acc = r[:, i] + (a[:, 1:i] * r[:, i - 1:0:-1]).sum(axis=1)
        k = np.where(silent, 0.0, -acc / err)
        a[:, 1:i] = a[:, 1:i] + k[:, None] * a[:, i - 1:0:-1]
        a[:, i] = k
        err = err * (1.0 - k * k)
    return a, np.where(silent, 0.0, np.maximum(err, 1e-12))


def _warp(a: np.ndarray, err: np.ndarray, scale: float) -> np.ndarray:
    """Autocorrelations (F, ORDER + 1) of the envelopes err / |A|^2 with their frequency axis
    stretched by ``scale``."""
    env = err[:, None] / np.maximum(np.abs(np.fft.rfft(a, NFFT, axis=1)) ** 2, 1e-12)
    grid = np.arange(env.shape[1])
    warped = np.stack([np.interp(grid / scale, grid, e, right=e[-1]) for e in env])
    return np.fft.irfft(warped, NFFT, axis=1)[:, : ORDER + 1]


def _pitch(res: np.ndarray) -> np.ndarray:
    """F0 (Hz) of each frame's residual (F, FRAME), 0 where unvoiced."""
    r = np.fft.irfft(np.abs(np.fft.rfft(res, SYN_FFT, axis=1)) ** 2, SYN_FFT, axis=1)
    lo, hi = int(SR / F0_MAX), int(SR / F0_MIN)
    lag = lo + np.argmax(r[:, lo:hi], axis=1)
    peak = r[np.arange(len(r)), lag]
    voiced = (r[:, 0] > 0) & (peak > VOICED * np.maximum(r[:, 0], 1e-30))
    return np.where(voiced, SR / lag, 0.0)


def convert(x: np.ndarray, f0_scale: float = 1.0, formant_scale: float = 1.0, buzz: bool = True,
            rng=None) -> np.ndarray:
    """``x`` (16 kHz) resynthesised with formants x ``formant_scale`` (and, with ``buzz``, a pulse
    excitation at F0 x ``f0_scale``); float32 out, the same length and peak as ``x``."""
    rng = np.random.default_rng(0) if rng is None else rng
    x = np.asarray(x, np.float64)
    if len(x) < FRAME:
        return x.astype(np.float32)
    win = np.hanning(FRAME + 1)[:-1]            # periodic Hann: sums to 1 at 50 % overlap
    frames = _frames(np.r_[np.zeros(HOP), x, np.zeros(HOP)]) * win   # every sample under two frames
    n_out = (len(frames) - 1) * HOP + FRAME
    acs = np.fft.irfft(np.abs(np.fft.rfft(frames, NFFT, axis=1)) ** 2, NFFT, axis=1)[:, : ORDER + 1]
    a, err = levinson(acs)
    a2, err2 = levinson(_warp(a, err, formant_scale)) if formant_scale != 1.0 else (a, err)
    keep = err > 1e-12                          # a silent frame is left as it is
    a2[~keep], err2[~keep] = a[~keep], err[~keep]
    A = np.fft.rfft(a, SYN_FFT, axis=1)
    A2 = np.fft.rfft(a2, SYN_FFT, axis=1)
    X = np.fft.rfft(frames, SYN_FFT, axis=1)
    if buzz:
        res = np.fft.irfft(X * A, SYN_FFT, axis=1)[:, :FRAME]
        f0s = _pitch(res) * f0_scale
        # one excitation for the whole clip, so overlapping frames share their pulses: a pulse
        # train (unit power) where the frame centred there is voiced, white noise where it is not
        f0 = f0s[np.clip((np.arange(n_out + HOP) - HOP // 2) // HOP, 0, len(f0s) - 1)]  # the nearest frame centre
        voiced = f0 > 0
        ph = np.cumsum(np.where(voiced, f0, 0.0) / SR)
        pulses = np.diff(np.floor(np.r_[0.0, ph])) > 0
        exc = np.where(voiced, 0.05 * rng.standard_normal(len(f0)), rng.standard_normal(len(f0)))
        exc[pulses & voiced] += np.sqrt(SR / f0[pulses & voiced])
        exc = np.r_[np.zeros(HOP), exc]         # HOP samples of warm-up before the first frame
        seg = exc[np.arange(HOP + FRAME)[None, :] + HOP * np.arange(len(frames))[:, None]]
        y = np.fft.irfft(np.fft.rfft(seg, SYN_FFT, axis=1) * np.sqrt(err2 / FRAME)[:, None] / A2,
                         SYN_FFT, axis=1)[:, HOP:HOP + FRAME] * win
    else:
        gain = np.sqrt(err2 / np.maximum(err, 1e-12))
        y = np.fft.irfft(X * A * gain[:, None] / A2, SYN_FFT, axis=1)[:, :FRAME]
    out = np.zeros(n_out, np.float64)
    for k in range(len(frames)):
        out[k * HOP: k * HOP + FRAME] += y[k]
    out = out[HOP: HOP + len(x)]
    peak = float(np.abs(out).max())
    scale = float(np.abs(x).max()) / peak if peak > 0 else 1.0
    return (out * scale).astype(np.float32)


def random_convert(rng, x: np.ndarray, buzz_share: float = 0.7) -> np.ndarray:
    """One random conversion: formants x0.88-1.15, pitch x0.75-1.35, a pulse excitation with
    probability ``buzz_share``."""
    return convert(x, f0_scale=float(rng.uniform(0.75, 1.35)), formant_scale=float(rng.uniform(0.88, 1.15)),
                   buzz=bool(rng.random() < buzz_share), rng=rng)
