"""What every peer runner reads: a 16 kHz mono 16-bit WAV as raw bytes (stdlib only: the runners run
inside the peer virtualenv, never with edgelearn; each imports this from its own folder)."""

from __future__ import annotations

import wave

RATE = 16000


def read_wav(path: str, who: str) -> bytes:
    """The WAV's frames; anything but 16 kHz mono 16-bit ends the runner with one sentence."""
    with wave.open(path, "rb") as w:
        ch, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
        if (ch, width, rate) != (1, 2, RATE):
            raise SystemExit(f"{who}: {path} is {rate} Hz, {ch} channel(s), {8 * width}-bit; "
                             f"need 16000 Hz mono 16-bit (sox IN -r 16000 -c 1 -b 16 OUT.wav)")
        return w.readframes(w.getnframes())
