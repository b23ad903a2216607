"""``edgelearn spot``: classify WAV clips (about 1 s each) with a verified bundle.

    $ edgelearn spot clip1.wav clip2.wav --bundle models/kws-dscnn-s
    clip1.wav  yes        0.97
"""

from __future__ import annotations

import json
from pathlib import Path


def add_arguments(p) -> None:
    p.add_argument("wav", nargs="+", type=Path, help="16 kHz mono 16-bit WAV clips")
    p.add_argument("--bundle", type=Path, default=None, help="bundle dir or .zip (default: shipped model)")
    p.add_argument("--pubkey", type=Path, default=None, help="trusted public key file or directory")
    p.add_argument("--backend", default="auto", help="litert | tflite_runtime | onnxruntime | auto")
    p.add_argument("--json", action="store_true", help="one JSON object per clip")


def run(args) -> int:
    from edge.audio import read_wav
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys

    bundle = load_bundle(args.bundle or DEFAULT_BUNDLE, trusted_keys=args.pubkey or default_trusted_keys())
    km = KeywordModel(bundle, backend=args.backend)
    for path in args.wav:
        label, p = km.classify(read_wav(path, min_samples=1600))
        if args.json:
            print(json.dumps({"file": str(path), "label": label, "score": round(p, 4)}))
        else:
            print(f"{path}  {label:<10} {p:.2f}")
    return 0
