"""Classify WAV clips (about 1 s each) with a verified bundle: what ``edgelearn spot``
(``edge/commands/spot.py``) runs.

    >>> for path, label, p in classify(["clip1.wav"], "models/kws-dscnn-s"):
    ...     print(path, label, p)

A clip is one keyword: the model hears the centre second of it. A clip longer than
``MAX_CLIP_SECONDS`` is refused with one sentence (it would be a recording, and
classifying its centre second says nothing about the rest): `edgelearn device
detect --wav` finds keywords anywhere in a recording of any length.
"""

from __future__ import annotations

from pathlib import Path

MAX_CLIP_SECONDS = 5
_LONG_FIX = ("spot classifies one keyword clip of about 1 s: cut the word out (`sox IN.wav OUT.wav trim START 1`), "
             "or find keywords in a long recording with `edgelearn device detect --state DIR --wav FILE`")


def classify(wavs, bundle=None, *, backend: str = "auto", trusted_keys=None, on_bad=None):
    """(path, label, probability) for each clip in ``wavs`` (WAV paths, one keyword each), as each
    is classified; ``bundle``: a loaded bundle or its path (None: the shipped model, checked with
    ``trusted_keys`` or the device's default keys). A clip that cannot be read (missing, not 16 kHz
    mono 16-bit, longer than ``MAX_CLIP_SECONDS``...) is an ``AudioError``: raised, or with
    ``on_bad`` given, passed to ``on_bad(path, error)`` and the next clip classified. The bundle and
    model are loaded when this is called."""
    from edge.device import open_bundle
    from edge.kws import KeywordModel

    km = KeywordModel(open_bundle(bundle, trusted_keys), backend=backend)
    return _classified(km, [wavs] if isinstance(wavs, (str, Path)) else list(wavs), on_bad)


def _classified(km, wavs, on_bad=None):
    from edge.audio import read_wav
    from edge.errors import AudioError

    for path in wavs:
        try:
            pcm = read_wav(path, min_samples=1600, max_samples=MAX_CLIP_SECONDS * 16000, long_fix=_LONG_FIX)
        except AudioError as e:
            if on_bad is None:
                raise
            on_bad(path, e)
            continue
        label, p = km.classify(pcm)
        yield path, label, p
