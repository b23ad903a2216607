"""``edgelearn spot``: classify WAV clips (about 1 s each) with a verified bundle.

    $ edgelearn spot clip1.wav clip2.wav --bundle models/kws-dscnn-s
    clip1.wav  yes        0.97

The work is ``edge.spot.classify`` (one keyword per clip; a recording is refused with one
sentence: `edgelearn device detect --wav` finds keywords in a recording of any length). A clip that
cannot be read is one sentence on stderr and the others are still classified; the exit status is
then 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from edge.errors import BundleError
from edge.spot import classify


def add_arguments(p) -> None:
    p.add_argument("wav", nargs="+", type=Path, help="16 kHz mono 16-bit WAV clips")
    p.add_argument("--bundle", type=Path, default=None, help="bundle dir or .zip (default: shipped model)")
    p.add_argument("--pubkey", type=Path, action="append", default=None,
                   help="trusted public key file or directory (repeatable; added to the shipped release keys)")
    p.add_argument("--backend", default="auto", help="litert | tflite_runtime | onnxruntime | auto")
    p.add_argument("--json", action="store_true", help="one JSON object per clip")

def _bundle_path(value):
    """--bundle as given, or the shipped bundle of that name (``edge.kws.named_bundle``)."""
    from edge.kws import named_bundle

    return None if value is None else named_bundle(value)


def _spot_bundle(bundle, pubkey):
    """The verified bundle, refused in one sentence when it has no encoder spot can run: a partition for
    this host (not the MCU) that names its embedding and probs outputs, as ``KeywordModel`` needs."""
    from edge.device_models import open_bundle

    b = open_bundle(bundle, pubkey)
    for part in b.manifest.get("partitions", []):
        roles = {o.get("role") for o in part.get("outputs", [])}
        if (part.get("role") == "encoder" and part.get("placement") != "mcu"
                and {"embedding", "probs"} <= roles):
            return b
    target = b.manifest.get("target")
    target = target.get("name", target) if isinstance(target, dict) else target
    raise BundleError(f"bundle {b.model_id} (target {target}) has no encoder partition spot can run "
                      "(one for this host whose outputs are an embedding and class probabilities)",
                      fix="run it on its board with `edgelearn flash`, or spot with the default bundle (omit --bundle)")


def run(args) -> int:
    """Every readable clip is classified; each bad one is one sentence on stderr as it comes (as
    ``data check`` lists every bad file), and the exit status is 2 when there was any."""
    bundle = _spot_bundle(_bundle_path(args.bundle), args.pubkey) if args.bundle is not None else None
    bad = []

    def on_bad(path, e):
        bad.append(path)
        print(f"edgelearn spot: {e}", file=sys.stderr, flush=True)

    for path, label, p in classify(args.wav, bundle, backend=args.backend, trusted_keys=args.pubkey,
                                   on_bad=on_bad):
        if args.json:
            print(json.dumps({"file": str(path), "label": label, "score": round(p, 4)}), flush=True)
        else:
            print(f"{path}  {label:<10} {p:.2f}", flush=True)
    return 2 if bad else 0
