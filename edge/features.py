"""The audio front end: 16 kHz int16 audio -> 49x10 MFCC per 1 s window.

This is the one definition of the features (docs/design.md, "Contracts"):
frames of 30 ms (480 samples) every 20 ms (320), periodic Hann window, FFT 512,
power spectrum, 40 HTK-mel triangles from 20 to 4000 Hz (no area
normalisation, as ``tf.signal.linear_to_mel_weight_matrix``), natural log with
a floor of 1e-6, orthonormal DCT-II, first 10 coefficients. Frame ``k`` of a
stream covers samples ``[320 k, 320 k + 480)``; a 1 s clip has 49 frames.
librosa configured the same way is the oracle in the tests; the MicroPython
port is checked against this module.

    >>> from edge.features import mfcc, MfccStream
    >>> feats = mfcc(one_second_int16)            # (49, 10) float32
    >>> stream = MfccStream()
    >>> for chunk in chunks: new_frames = stream.push(chunk)   # (n, 10) per call
"""

from __future__ import annotations

import numpy as np

# The parameters are defined once, in the module that MicroPython also runs.
from edge.portable.mfcc import (FMAX, FMIN, FRAME_LENGTH, HOP_LENGTH, LOG_FLOOR, N_FFT, N_MELS,  # noqa: F401
                                N_MFCC, SAMPLE_RATE)

WINDOW_SAMPLES = SAMPLE_RATE  # 1 s analysis window
N_FRAMES = 1 + (WINDOW_SAMPLES - FRAME_LENGTH) // HOP_LENGTH  # 49

PARAMS = {
    "sample_rate": SAMPLE_RATE, "window_samples": WINDOW_SAMPLES,
    "frame_length": FRAME_LENGTH, "hop_length": HOP_LENGTH, "n_fft": N_FFT,
    "window": "hann-periodic", "spectrum": "power", "n_mels": N_MELS,
    "fmin": FMIN, "fmax": FMAX, "mel_scale": "htk", "mel_norm": None,
    "log": "ln", "log_floor": LOG_FLOOR, "dct": "II-ortho", "n_mfcc": N_MFCC,
    "n_frames": N_FRAMES,
}


def _hz_to_mel(hz):
    return 2595.0 * np.log10(1.0 + np.asarray(hz, dtype=np.float64) / 700.0)


def _mel_to_hz(mel):
    return 700.0 * (10.0 ** (np.asarray(mel, dtype=np.float64) / 2595.0) - 1.0)


def mel_matrix(warp: float = 1.0) -> np.ndarray:
    """(N_FFT//2+1, N_MELS) float32 triangular HTK-mel filterbank.

    ``warp`` != 1 scales every filter edge in Hz (vocal tract length
    perturbation); it exists for training augmentation only — the front end
    itself always uses 1.0.
    """
    fft_hz = np.linspace(0.0, SAMPLE_RATE / 2, N_FFT // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(FMIN), _hz_to_mel(FMAX), N_MELS + 2)) * warp
    lower, center, upper = edges[:-2], edges[1:-1], edges[2:]
    up = (fft_hz[:, None] - lower) / (center - lower)
    down = (upper - fft_hz[:, None]) / (upper - center)
    return np.maximum(0.0, np.minimum(up, down)).astype(np.float32)


def dct_matrix() -> np.ndarray:
    """(N_MELS, N_MFCC) float32 orthonormal DCT-II basis."""
    n = np.arange(N_MELS)[:, None]
    k = np.arange(N_MFCC)[None, :]
    basis = np.cos(np.pi / N_MELS * (n + 0.5) * k) * np.sqrt(2.0 / N_MELS)
    basis[:, 0] *= np.sqrt(0.5)
    return basis.astype(np.float32)


def hann_window() -> np.ndarray:
    """Periodic Hann of FRAME_LENGTH, the same as scipy.signal.get_window('hann')."""
    n = np.arange(FRAME_LENGTH)
    return (0.5 - 0.5 * np.cos(2.0 * np.pi * n / FRAME_LENGTH)).astype(np.float32)


_WINDOW = hann_window()
_MEL = mel_matrix()
_DCT = dct_matrix()


def to_float(samples) -> np.ndarray:
    """int16 PCM (or float already in [-1, 1]) -> float32 in [-1, 1]."""
    a = np.asarray(samples)
    if a.dtype == np.int16:
        return a.astype(np.float32) * (1.0 / 32768.0)
    if a.dtype.kind == "f":
        return a.astype(np.float32, copy=False)
    raise TypeError(f"audio must be int16 PCM or float in [-1, 1], got dtype {a.dtype}")


def frames_to_mel(frames: np.ndarray, mel_fb: np.ndarray | None = None) -> np.ndarray:
    """(..., FRAME_LENGTH) float32 frames -> (..., N_MELS) float32 mel energies (before the log)."""
    spec = np.fft.rfft(frames * _WINDOW, n=N_FFT, axis=-1)
    power = (spec.real * spec.real + spec.imag * spec.imag).astype(np.float32)
    return power @ (_MEL if mel_fb is None else mel_fb)


def mel_to_mfcc(mel: np.ndarray) -> np.ndarray:
    """(..., N_MELS) mel energies -> (..., N_MFCC) float32 MFCC: log with the floor, then the DCT."""
    return (np.log(np.maximum(mel, LOG_FLOOR)) @ _DCT).astype(np.float32)


def frames_to_mfcc(frames: np.ndarray, mel_fb: np.ndarray | None = None) -> np.ndarray:
    """(..., FRAME_LENGTH) float32 frames -> (..., N_MFCC) float32 MFCC."""
    return mel_to_mfcc(frames_to_mel(frames, mel_fb))


def frame(signal: np.ndarray) -> np.ndarray:
    """(..., n) -> (..., n_frames, FRAME_LENGTH) view, no copy."""
    n = signal.shape[-1]
    if n < FRAME_LENGTH:
        raise ValueError(f"need at least {FRAME_LENGTH} samples for one frame, got {n}")
    count = 1 + (n - FRAME_LENGTH) // HOP_LENGTH
    # as_strided, not sliding_window_view + a step slice: the same read-only view at a third of the
    # cost (the streaming front end frames every 0.1 s chunk)
    step = signal.strides[-1]
    shape, strides = signal.shape[:-1] + (count, FRAME_LENGTH), signal.strides[:-1] + (HOP_LENGTH * step, step)
    if signal.ndim == 1 and signal.flags.c_contiguous:  # the stream's case: the same view at a fifth of the cost
        view = np.ndarray(shape, signal.dtype, buffer=signal, strides=strides)
        view.flags.writeable = False
        return view
    return np.lib.stride_tricks.as_strided(signal, shape, strides, writeable=False)


def mfcc(samples, mel_fb: np.ndarray | None = None) -> np.ndarray:
    """One second (or a batch ``(N, 16000)``) of 16 kHz audio -> ``(..., 49, 10)`` float32.

    Accepts int16 PCM or float32 in [-1, 1]. Shorter input is an error (pad it
    yourself, e.g. with :func:`fit_to_window`); longer input is framed in full.
    """
    x = to_float(samples)
    if x.shape[-1] < WINDOW_SAMPLES:
        raise ValueError(
            f"mfcc needs {WINDOW_SAMPLES} samples (1 s at 16 kHz), got {x.shape[-1]}; "
            "pad with edge.features.fit_to_window"
        )
    return frames_to_mfcc(frame(x), mel_fb)


def fit_to_window(samples: np.ndarray, length: int = WINDOW_SAMPLES) -> np.ndarray:
    """Zero-pad (centred) or centre-crop a 1-D clip to exactly ``length`` samples."""
    n = len(samples)
    if n >= length:
        start = (n - length) // 2
        return samples[start : start + length]
    out = np.zeros(length, dtype=samples.dtype)
    start = (length - n) // 2
    out[start : start + n] = samples
    return out


def normalize(feats: np.ndarray, scale) -> np.ndarray:
    """Per-window cepstral mean removal, then a fixed per-coefficient scale.

    The model's input: ``(feats - mean over the window's frames) / scale``. The
    scale (one number per coefficient, from the training set) is stored in the
    bundle manifest so every runtime does the same.
    """
    f = np.asarray(feats, dtype=np.float32)
    # f.mean(axis=-2) as numpy computes it (the float32 sum, then / the count), without its checks:
    # the streaming detector normalises one window every 80 ms (bench kws_custom's CPU)
    out = f.sum(axis=-2, keepdims=True)
    out /= f.shape[-2]
    out = f - out
    out /= scale if isinstance(scale, np.ndarray) and scale.dtype == np.float32 else np.asarray(scale, np.float32)
    return out


class MfccStream:
    """Streaming front end: push audio in chunks of any size, get one frame per hop.

    The frames it emits are exactly those :func:`mfcc` computes on the same
    samples: frame ``k`` covers stream samples ``[320 k, 320 k + 480)``. Only
    the new frames are computed; the last 160 samples are carried over.
    """

    def __init__(self):
        self._tail = np.zeros(0, dtype=np.float32)
        self.frames_emitted = 0

    def push(self, chunk) -> np.ndarray:
        x = to_float(chunk).reshape(-1)
        buf = np.concatenate([self._tail, x]) if self._tail.size else x
        if buf.size < FRAME_LENGTH:
            self._tail = buf.copy()
            return np.zeros((0, N_MFCC), dtype=np.float32)
        out = frames_to_mfcc(frame(buf))
        consumed = out.shape[0] * HOP_LENGTH
        self._tail = buf[consumed:].copy()
        self.frames_emitted += out.shape[0]
        return out

    def reset(self) -> None:
        self._tail = np.zeros(0, dtype=np.float32)
        self.frames_emitted = 0
