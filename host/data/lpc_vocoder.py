"""Voice conversion by LPC analysis and resynthesis, numpy and scipy only.

``voiceconv.py`` does this with the WORLD vocoder, but pyworld compiles on install, so it stays a
tool for experiments; this one runs inside ``edgelearn export esphome`` on any host. Each 20 ms
frame (10 ms hop) gets an order-18 all-pole envelope (autocorrelation and Levinson, as a speech
codec's analysis); the envelope is warped on the frequency axis (formants x ``formant_scale``: a
shorter or longer vocal tract) and the frame is resynthesised from either
- its own LPC residual (``buzz=False``: the voice's excitation kept, only the formants move), or
- a pulse train at the frame's pitch x ``f0_scale`` in voiced frames and white noise in unvoiced
  ones (``buzz=True``: the excitation of a parametric synthesizer such as Flite's clustergen
  voices or HTS, so that a vocoder's sound alone is not a cue for any one class).
Frames are overlap-added with a Hann window at 50 % overlap.

    >>> y = convert(x, f0_scale=1.2, formant_scale=1.08, buzz=True)   # float 16 kHz in and out
"""

from __future__ import annotations

import numpy as np

SR = 16000
FRAME = 320
HOP = 160
ORDER = 18
NFFT = 512
F0_MIN, F0_MAX = 60.0, 400.0
VOICED = 0.35            # normalised autocorrelation peak of the residual above which a frame is voiced


def _frames(x: np.ndarray) -> np.ndarray:
    n = 1 + max(0, int(np.ceil((len(x) - FRAME) / HOP)))
    pad = np.zeros((n - 1) * HOP + FRAME, np.float64)
    pad[: len(x)] = x
    idx = np.arange(FRAME)[None, :] + HOP * np.arange(n)[:, None]
    return pad[idx]


def _levinson(r: np.ndarray) -> tuple[np.ndarray, float]:
    """(a with a[0] = 1, prediction error power) from autocorrelation r[0..ORDER]."""
    from scipy.linalg import solve_toeplitz

    r = r.copy()
    r[0] *= 1.0 + 1e-6          # white-noise correction: a well-conditioned system on near-silence
    if r[0] <= 1e-12:
        return np.r_[1.0, np.zeros(ORDER)], 0.0
    coef = solve_toeplitz(r[:ORDER], r[1:ORDER + 1])
    err = float(r[0] - coef @ r[1:ORDER + 1])
    return np.r_[1.0, -coef], max(err, 1e-12)


def _warp_autocorr(a: np.ndarray, err: float, scale: float) -> np.ndarray:
    """Autocorrelation of the envelope err / |A|^2 with its frequency axis stretched by ``scale``."""
    env = err / np.maximum(np.abs(np.fft.rfft(a, NFFT)) ** 2, 1e-12)
    bins = np.arange(len(env)) / scale
    warped = np.interp(bins, np.arange(len(env)), env, right=env[-1])
    return np.fft.irfft(warped, NFFT)[: ORDER + 1]


def _pitch(res: np.ndarray) -> float:
    """F0 of a frame's residual (Hz), 0 when unvoiced."""
    r = np.correlate(res, res, "full")[len(res) - 1:]
    if r[0] <= 0:
        return 0.0
    lo, hi = int(SR / F0_MAX), int(SR / F0_MIN)
    lag = lo + int(np.argmax(r[lo:hi]))
    return SR / lag if r[lag] / r[0] > VOICED else 0.0


def convert(x: np.ndarray, f0_scale: float = 1.0, formant_scale: float = 1.0, buzz: bool = True,
            rng=None) -> np.ndarray:
    """``x`` (16 kHz) resynthesised with formants x ``formant_scale`` (and, with ``buzz``, a pulse
    excitation at F0 x ``f0_scale``); float32 out, the same length and peak as ``x``."""
    from scipy.signal import lfilter

    rng = np.random.default_rng(0) if rng is None else rng
    x = np.asarray(x, np.float64)
    if len(x) < FRAME:
        return x.astype(np.float32)
    win = np.hanning(FRAME + 1)[:-1]            # periodic Hann: sums to 1 at 50 % overlap
    frames = _frames(np.r_[np.zeros(HOP), x, np.zeros(HOP)])   # every sample under two frames
    spec = np.fft.rfft(frames * win, NFFT, axis=1)
    acs = np.fft.irfft(np.abs(spec) ** 2, NFFT, axis=1)[:, : ORDER + 1]
    n_out = (len(frames) - 1) * HOP + FRAME
    out = np.zeros(n_out, np.float64)
    params, f0s = [], np.zeros(len(frames))
    for k, (f, r) in enumerate(zip(frames, acs)):
        a, err = _levinson(r)
        res = lfilter(a, [1.0], f * win)
        a2, err2 = _levinson(_warp_autocorr(a, err, formant_scale)) if formant_scale != 1.0 and err > 1e-12 \
            else (a, err)
        params.append((a, err, a2, err2, res))
        if buzz:
            f0s[k] = _pitch(res) * f0_scale
    if buzz:
        # one excitation for the whole clip, so overlapping frames share their pulses: a pulse
        # train (unit power) where the frame centred there is voiced, white noise where it is not
        f0 = f0s[np.clip((np.arange(n_out + HOP) - HOP // 2) // HOP, 0, len(f0s) - 1)]  # the nearest frame centre
        voiced = f0 > 0
        ph = np.cumsum(np.where(voiced, f0, 0.0) / SR)
        pulses = np.diff(np.floor(np.r_[0.0, ph])) > 0
        exc = np.where(voiced, 0.05 * rng.standard_normal(len(f0)), rng.standard_normal(len(f0)))
        exc[pulses & voiced] += np.sqrt(SR / f0[pulses & voiced])
        exc = np.r_[np.zeros(HOP), exc]        # HOP samples of warm-up before the first frame
    for k, (a, err, a2, err2, res) in enumerate(params):
        if buzz:
            y = lfilter([np.sqrt(err2 / FRAME)], a2, exc[k * HOP: k * HOP + HOP + FRAME])[HOP:] * win
        else:
            y = lfilter([np.sqrt(err2 / max(err, 1e-12))], a2, res)
        out[k * HOP: k * HOP + FRAME] += y
    out = out[HOP: HOP + len(x)]
    peak = float(np.abs(out).max())
    scale = float(np.abs(x).max()) / peak if peak > 0 else 1.0
    return (out * scale).astype(np.float32)


def random_convert(rng, x: np.ndarray, buzz_share: float = 0.7) -> np.ndarray:
    """One random conversion: formants x0.88-1.15, pitch x0.75-1.35, a pulse excitation with
    probability ``buzz_share``."""
    return convert(x, f0_scale=float(rng.uniform(0.75, 1.35)), formant_scale=float(rng.uniform(0.88, 1.15)),
                   buzz=bool(rng.random() < buzz_share), rng=rng)
