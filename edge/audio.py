"""WAV input and output for 16 kHz mono 16-bit PCM, with errors a user can act on.

    >>> from edge.audio import read_wav, write_wav
    >>> pcm = read_wav("yes.wav")             # int16 ndarray, 16 kHz mono
    >>> write_wav("copy.wav", pcm)           # atomic: temp file + rename
"""

from __future__ import annotations

import os
import struct
import wave
from pathlib import Path

import numpy as np

from edge.errors import AudioError

SAMPLE_RATE = 16000
_FIX_FORMAT = "convert it with `sox IN.wav -r 16000 -c 1 -b 16 OUT.wav`"


def read_wav(path, *, min_samples: int = 1) -> np.ndarray:
    """Read a 16 kHz mono 16-bit PCM WAV as int16; reject anything else clearly."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise AudioError(f"{path}: no such file", fix="check the path") from None
    except IsADirectoryError:
        raise AudioError(f"{path}: is a directory, not a WAV file") from None
    if len(raw) == 0:
        raise AudioError(f"{path}: file is empty", fix="record or synthesise the clip again")
    if raw[:4] != b"RIFF" or raw[8:12] != b"WAVE":
        raise AudioError(f"{path}: not a WAV file (no RIFF/WAVE header)", fix=_FIX_FORMAT)
    try:
        with wave.open(str(path), "rb") as w:
            rate, channels, width, nframes = (
                w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes())
            data = w.readframes(nframes)
    except (wave.Error, EOFError, struct.error) as e:
        raise AudioError(f"{path}: unreadable WAV ({e})", fix=_FIX_FORMAT) from None
    if width != 2:
        raise AudioError(f"{path}: {8 * width}-bit samples, expected 16-bit PCM", fix=_FIX_FORMAT)
    if channels != 1:
        raise AudioError(f"{path}: {channels} channels, expected mono", fix=_FIX_FORMAT)
    if rate != SAMPLE_RATE:
        raise AudioError(f"{path}: sample rate {rate} Hz, expected 16000 Hz", fix=_FIX_FORMAT)
    got = len(data) // 2
    if got < nframes:
        raise AudioError(
            f"{path}: truncated: header promises {nframes} samples but only {got} are present",
            fix="copy or record the file again",
        )
    if got < min_samples:
        raise AudioError(
            f"{path}: only {got} samples ({got / SAMPLE_RATE:.3f} s), need at least "
            f"{min_samples} ({min_samples / SAMPLE_RATE:.3f} s)",
            fix="use a longer clip" if got else "record or synthesise the clip again",
        )
    return np.frombuffer(data[: got * 2], dtype="<i2").astype(np.int16)


def to_int16(samples) -> np.ndarray:
    a = np.asarray(samples)
    if a.dtype == np.int16:
        return a
    return np.clip(np.round(a * 32767.0), -32768, 32767).astype(np.int16)


def write_wav(path, samples, rate: int = SAMPLE_RATE) -> Path:
    """Write int16 (or float in [-1, 1]) mono PCM atomically."""
    path = Path(path)
    pcm = to_int16(samples)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with wave.open(str(tmp), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.astype("<i2").tobytes())
    os.replace(tmp, path)
    return path
