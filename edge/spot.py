"""``edgelearn spot``: classify WAV clips (about 1 s each) with a verified bundle.

    $ edgelearn spot clip1.wav clip2.wav --bundle models/kws-dscnn-s
    clip1.wav  yes        0.97

A clip is one keyword: the model hears the centre second of it. A clip longer than
``MAX_CLIP_SECONDS`` is refused with one sentence (it would be a recording, and
classifying its centre second says nothing about the rest): `edgelearn device
detect --wav` finds keywords anywhere in a recording of any length.
"""

from __future__ import annotations

import json
from pathlib import Path

MAX_CLIP_SECONDS = 5
_LONG_FIX = ("spot classifies one keyword clip of about 1 s: cut the word out (`sox IN.wav OUT.wav trim START 1`), "
             "or find keywords in a long recording with `edgelearn device detect --state DIR --wav FILE`")


def add_arguments(p) -> None:
    p.add_argument("wav", nargs="+", type=Path, help="16 kHz mono 16-bit WAV clips")
    p.add_argument("--bundle", type=Path, default=None, help="bundle dir or .zip (default: shipped model)")
    p.add_argument("--pubkey", type=Path, default=None, help="trusted public key file or directory")
    p.add_argument("--backend", default="auto", help="litert | tflite_runtime | onnxruntime | auto")
    p.add_argument("--json", action="store_true", help="one JSON object per clip")


def classify(wavs, bundle=None, *, backend: str = "auto", trusted_keys=None):
    """(path, label, probability) for each clip in ``wavs`` (WAV paths, one keyword each), as each
    is classified; ``bundle``: a loaded bundle or its path (None: the shipped model, checked with
    ``trusted_keys`` or the device's default keys). A clip longer than ``MAX_CLIP_SECONDS`` is an
    ``AudioError``. The bundle and model are loaded when this is called."""
    from edge.device import open_bundle
    from edge.kws import KeywordModel

    km = KeywordModel(open_bundle(bundle, trusted_keys), backend=backend)
    return _classified(km, [wavs] if isinstance(wavs, (str, Path)) else list(wavs))


def _classified(km, wavs):
    from edge.audio import read_wav

    for path in wavs:
        pcm = read_wav(path, min_samples=1600, max_samples=MAX_CLIP_SECONDS * 16000, long_fix=_LONG_FIX)
        label, p = km.classify(pcm)
        yield path, label, p


def run(args) -> int:
    for path, label, p in classify(args.wav, args.bundle, backend=args.backend, trusted_keys=args.pubkey):
        if args.json:
            print(json.dumps({"file": str(path), "label": label, "score": round(p, 4)}))
        else:
            print(f"{path}  {label:<10} {p:.2f}")
    return 0
