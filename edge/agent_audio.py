"""Where ``edgelearn device run`` hears from: the microphone (``arecord``), a WAV file, raw 16 kHz
mono s16le PCM on stdin, nothing (``"none"``: a Wyoming server alone brings the audio) or, from
Python, any iterable of int16 chunks; read ``CHUNK`` samples (0.1 s) at a time.

Split from agent.py to keep each file about one thing; ``edge.agent`` imports its names from here.

    >>> for chunk in _chunks_of("kitchen.wav"):
    ...     events = det.push(chunk)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from edge.device import CHUNK
from edge.errors import EdgelearnError

SAMPLE_RATE = 16000


def _chunks_of(source):
    """int16 chunks of CHUNK samples from ``"mic"``, ``"stdin"``, a WAV path, or (from Python) any
    iterable of int16 chunks; closed at the end."""
    import numpy as np

    if not isinstance(source, (str, os.PathLike)):
        for chunk in source:
            yield np.asarray(chunk, np.int16)
        return
    if source == "none":  # no local audio (the Wyoming clients bring theirs): the loop still ticks
        while True:
            time.sleep(CHUNK / SAMPLE_RATE)
            yield np.zeros(0, np.int16)
    if source == "stdin":
        f = sys.stdin.buffer
        rest = b""
        while True:
            b = f.read(2 * CHUNK)
            if not b:
                break
            b = rest + b
            n = len(b) // 2 * 2
            rest = b[n:]
            if n:
                yield np.frombuffer(b[:n], "<i2")
        return
    if source == "mic":
        import shutil

        if shutil.which("arecord") is None:
            raise EdgelearnError("--mic needs `arecord` (ALSA utils), which is not installed",
                                 fix="apt install alsa-utils, or pass --wav FILE or --stdin")
        proc = subprocess.Popen(["arecord", "-q", "-f", "S16_LE", "-r", str(SAMPLE_RATE), "-c", "1", "-t", "raw"],
                                stdout=subprocess.PIPE)
        try:
            while b := proc.stdout.read(2 * CHUNK):
                yield np.frombuffer(b[: len(b) // 2 * 2], "<i2")
        finally:
            proc.terminate()
        return
    from edge.audio import open_wav

    with open_wav(source, min_samples=1) as wav:
        yield from wav.chunks(CHUNK)
