"""``edgelearn spot``: classify WAV clips (about 1 s each) with a verified bundle.

    $ edgelearn spot clip1.wav clip2.wav --bundle models/kws-dscnn-s
    clip1.wav  yes        0.97

The work is ``edge.spot.classify`` (one keyword per clip; a recording is refused with one
sentence: `edgelearn device detect --wav` finds keywords in a recording of any length).
"""

from __future__ import annotations

import json
from pathlib import Path

from edge.spot import classify


def add_arguments(p) -> None:
    p.add_argument("wav", nargs="+", type=Path, help="16 kHz mono 16-bit WAV clips")
    p.add_argument("--bundle", type=Path, default=None, help="bundle dir or .zip (default: shipped model)")
    p.add_argument("--pubkey", type=Path, default=None, help="trusted public key file or directory")
    p.add_argument("--backend", default="auto", help="litert | tflite_runtime | onnxruntime | auto")
    p.add_argument("--json", action="store_true", help="one JSON object per clip")

def run(args) -> int:
    for path, label, p in classify(args.wav, args.bundle, backend=args.backend, trusted_keys=args.pubkey):
        if args.json:
            print(json.dumps({"file": str(path), "label": label, "score": round(p, 4)}))
        else:
            print(f"{path}  {label:<10} {p:.2f}")
    return 0
