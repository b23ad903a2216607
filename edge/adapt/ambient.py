"""Negatives for adaptation from the place's own audio, and more from a few clips (numpy only).

Speaker adaptation from 3 clips per command with nothing else teaches the tail that
everything is a command (issue 17: 916-1,430 false accepts per hour on real speech after
``device adapt --strategy full``). A device has heard its room: the audio ``device
calibrate`` reads (TV, conversation, that says none of the commands) is also the best
``_unknown_`` set there is, because it is the speech the detector must stay quiet on.

- ``ambient_windows(paths)``: 1 s windows every ``hop_s`` of long 16 kHz WAVs, read in
  chunks (one file is never held whole), at most ``max_windows`` kept by reservoir sampling
  (deterministic), so hours of audio cost a bounded few MB;
- ``augment(clips, n, rng, noise=...)``: each clip ``n`` times more: shifted in its window,
  sped up or slowed down (pitch and tempo together, linear interpolation), louder or
  softer, and mixed with a random ambient window (or the microphone floor) at a random SNR,
  so three recordings cover the offsets, rates and rooms the detector will meet.

    >>> neg = ambient_windows(["everyday.wav"])             # (N, 16000) int16
    >>> pos = augment(windows, 8, np.random.default_rng(0), noise=neg)
"""

from __future__ import annotations

import numpy as np

from edge.errors import EdgelearnError

SR = 16000
WINDOW = SR


def ambient_windows(paths, hop_s: float = 0.5, max_windows: int = 2000, seed: int = 0,
                    min_rms: float = 0.0) -> np.ndarray:
    """(N, 16000) int16 windows of the WAVs, one every ``hop_s``; at most ``max_windows`` (a
    uniform sample of all of them); windows quieter than ``min_rms`` (int16 units) are left out."""
    from edge.audio import open_wav

    if hop_s <= 0 or max_windows < 1:
        raise EdgelearnError(f"ambient hop {hop_s} s / {max_windows} windows", fix="pass hop_s > 0, max_windows >= 1")
    hop = max(1, int(round(hop_s * SR)))
    rng = np.random.default_rng(seed)
    kept = np.zeros((max_windows, WINDOW), np.int16)
    seen = 0
    for p in paths:
        buf = np.zeros(0, np.int16)
        with open_wav(p, min_samples=WINDOW) as wav:
            for chunk in wav.chunks(SR * 10):
                buf = np.concatenate([buf, np.asarray(chunk, np.int16)])
                starts = range(0, len(buf) - WINDOW + 1, hop)
                for a in starts:
                    w = buf[a:a + WINDOW]
                    if min_rms > 0 and float(np.sqrt(np.mean(w.astype(np.float32) ** 2))) < min_rms:
                        continue
                    if seen < max_windows:
                        kept[seen] = w
                    else:
                        j = int(rng.integers(0, seen + 1))
                        if j < max_windows:
                            kept[j] = w
                    seen += 1
                nxt = (len(buf) - WINDOW) // hop * hop + hop if len(buf) >= WINDOW else 0
                buf = buf[nxt:]
    if seen == 0:
        raise EdgelearnError("the ambient audio holds no 1 s window", fix="pass WAVs of a few minutes or more")
    return kept[:min(seen, max_windows)].copy()


def _speech_rms(x: np.ndarray) -> float:
    """RMS of the clip's louder half of 10 ms blocks (the speech, not the padding around it)."""
    n = len(x) // 160
    e = (x[: n * 160].astype(np.float64).reshape(n, 160) ** 2).mean(axis=1)
    top = np.sort(e)[n // 2:]
    return float(np.sqrt(top.mean())) if len(top) else 0.0


def _converted(c: np.ndarray, rng, f0, fm) -> tuple[np.ndarray, float]:
    """``c`` voice-converted at a pitch and a formant factor drawn from ``f0`` and ``fm`` (int16, the
    clip's length and peak) and its speech level."""
    from edge.adapt.vocoder import convert

    y = convert(np.asarray(c, np.float32), f0_scale=float(rng.uniform(*f0)), formant_scale=float(rng.uniform(*fm)),
                buzz=True, rng=rng)
    y = np.clip(np.rint(y), -32768, 32767).astype(np.int16)
    return y, _speech_rms(y)


def _speed(x: np.ndarray, r: float) -> np.ndarray:
    """``x`` played ``r`` times faster (pitch and tempo), re-centred in its window."""
    n = len(x)
    m = max(2, int(round(n / r)))
    y = np.interp(np.arange(m) * (n - 1) / (m - 1), np.arange(n), x.astype(np.float32))
    out = np.zeros(n, np.float32)
    if m >= n:
        a = (m - n) // 2
        out[:] = y[a:a + n]
    else:
        a = (n - m) // 2
        out[a:a + m] = y
    return out


def _shift(x: np.ndarray, k: int) -> np.ndarray:
    out = np.zeros_like(x)
    if k >= 0:
        out[k:] = x[: len(x) - k]
    else:
        out[:k] = x[-k:]
    return out


COLOURS = ("white", "pink", "brown")
BABBLE = 4    # talkers in augment's "babble" (host.data.noise.babble mixes 3-6)


def coloured_noise(rng: np.random.Generator, colour: str, shape) -> np.ndarray:
    """Unit-RMS noise of a colour (white: flat, pink: 1/f power, brown: 1/f^2), float32, shape
    (..., n), shaped in the frequency domain. The one implementation: the host's corpus and
    benchmarks use it as ``host.data.noise.coloured_noise``."""
    n = shape[-1]
    white = rng.standard_normal(shape).astype(np.float32)
    if colour == "white":
        out = white
    else:
        spec = np.fft.rfft(white, axis=-1)
        f = np.fft.rfftfreq(n)
        f[0] = f[1]
        exponent = {"pink": 0.5, "brown": 1.0}[colour]
        spec = spec / f ** exponent
        out = np.fft.irfft(spec, n=n, axis=-1).astype(np.float32)
    rms = np.sqrt((out ** 2).mean(axis=-1, keepdims=True)) + 1e-12
    return out / rms


def augment(clips, n: int, rng, noise=None, shift_s: float = 0.15, speed=(0.9, 1.12),
            gain_db=(-6.0, 6.0), snr_db=(5.0, 30.0), clean_share: float = 0.25,
            with_clip: bool = True, colours=None, convert=None) -> np.ndarray:
    """(len(clips) * n, 16000) int16: every clip ``n`` times, in clip order (clip i's copies are
    rows i*n .. i*n + n - 1). The first copy of each clip is the clip itself (``with_clip``; else
    all n are changed copies, drawn as copies 1.. would be); of the others a
    ``clean_share`` get no added noise, the rest a random ``noise`` window (int16, e.g. from
    ``ambient_windows``; else white noise) at an SNR drawn from ``snr_db`` on the clip's speech.
    ``colours``: each noisy copy's noise drawn from these instead: "white", "pink", "brown"
    (``coloured_noise``), "talker" (one random ``noise`` window) or "babble" (the sum of ``BABBLE``
    random ``noise`` windows at random levels: a room of talkers, from the place's own speech).
    ``convert``: ``(share, (f0_low, f0_high), (formant_low, formant_high))``: that share of the changed
    copies starts from the clip voice-converted (``edge.adapt.vocoder``, a pulse excitation; pitch and
    formants scaled by factors drawn from the ranges) instead of the clip itself (None: never; the
    copies to the bit as without it)."""
    clips = np.asarray(clips)
    if clips.ndim != 2 or clips.shape[1] != WINDOW:
        raise EdgelearnError(f"augment needs (N, {WINDOW}) windows, got {clips.shape}", fix="fit clips to 1 s first")
    if n < 1:
        raise EdgelearnError(f"{n} copies per clip", fix="pass n >= 1")
    if colours is not None:
        colours = tuple(colours)
        known = set(COLOURS) | ({"talker", "babble"} if noise is not None and len(noise) else set())
        if not colours or set(colours) - known:
            raise EdgelearnError(f"noise colours {list(colours)}" + ("" if noise is not None else " without noise windows"),
                                 fix=f"pass one or more of {sorted(known)}")
    if convert is not None:
        try:
            share, f0, fm = float(convert[0]), tuple(map(float, convert[1])), tuple(map(float, convert[2]))
        except (TypeError, ValueError, IndexError):
            share, f0, fm = -1.0, (), ()
        if not 0.0 <= share <= 1.0 or len(f0) != 2 or len(fm) != 2 or min(f0 + fm) <= 0 or f0[0] > f0[1] \
                or fm[0] > fm[1]:
            raise EdgelearnError(f"voice conversion {convert}", fix="pass (share in [0, 1], (f0 low, high), "
                                                                     "(formant low, high)) with 0 < low <= high")
    out = np.empty((len(clips) * n, WINDOW), np.int16)
    smax = int(round(shift_s * SR))
    first = 1 if with_clip else 0
    for i, c in enumerate(clips):
        if with_clip:
            out[i * n] = c
        clip_level = _speech_rms(c)
        for j in range(first, n):
            src, level = (c, clip_level) if convert is None or rng.random() >= share else _converted(c, rng, f0, fm)
            x = _speed(src, float(rng.uniform(*speed)))
            x = _shift(x, int(rng.integers(-smax, smax + 1)))
            g = 10 ** (float(rng.uniform(*gain_db)) / 20)
            x *= g
            if rng.random() >= clean_share and level > 0:
                if colours is None:     # (no draw for a colour: the copies augment always made)
                    kind = "talker" if noise is not None and len(noise) else "white"
                else:
                    kind = colours[0] if len(colours) == 1 else colours[int(rng.integers(0, len(colours)))]
                if kind == "talker":
                    nz = np.asarray(noise[int(rng.integers(0, len(noise)))], np.float32)
                elif kind == "babble":
                    nz = sum(np.asarray(noise[int(k)], np.float32) * float(rng.uniform(0.3, 1.0))
                             for k in rng.integers(0, len(noise), BABBLE))
                elif kind == "white":   # (not scaled to unit RMS: the default's copies to the bit)
                    nz = rng.standard_normal(WINDOW).astype(np.float32)
                else:
                    nz = coloured_noise(rng, kind, (WINDOW,))
                p = float(np.sqrt(np.mean(nz ** 2)))
                if p > 0:
                    x += nz * (g * level * 10 ** (-float(rng.uniform(*snr_db)) / 20) / p)
            out[i * n + j] = np.clip(np.rint(x), -32768, 32767).astype(np.int16)
    return out
