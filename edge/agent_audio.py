"""Where ``edgelearn device run`` hears from: the microphone (``arecord``), a WAV file, raw 16 kHz
mono s16le PCM on stdin, nothing (``"none"``: a Wyoming server alone brings the audio) or, from
Python, any iterable of int16 chunks; read ``CHUNK`` samples (0.1 s) at a time.

Split from agent.py to keep each file about one thing; ``edge.agent`` imports its names from here.

    >>> for chunk in _chunks_of("kitchen.wav"):
    ...     events = det.push(chunk)
"""

from __future__ import annotations

import os
import sys
import time

from edge.device import CHUNK

SAMPLE_RATE = 16000


def _chunks_of(source, mic_device: str | None = None):
    """int16 chunks of CHUNK samples from ``"mic"`` (ALSA's ``mic_device``, None: the default),
    ``"stdin"``, a WAV path, or (from Python) any iterable of int16 chunks; closed at the end."""
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
    if source == "mic":  # a recorder that fails is a MicError: the agent ends non-zero (systemd restarts it)
        from edge.audio import mic_chunks

        yield from mic_chunks(CHUNK, mic_device, other="--wav FILE or --stdin")
        return
    from edge.audio import open_wav

    with open_wav(source, min_samples=1) as wav:
        yield from wav.chunks(CHUNK)


def _until_stopped(source, stop):
    """``source``'s chunks; a microphone that ends with an error while the agent is stopping (``stop``
    is set: systemd and Ctrl-C stop the recorder with the agent) is the end of the audio, not a failure."""
    from edge.audio import MicError

    try:
        yield from source
    except MicError:
        if not stop.is_set():
            raise
