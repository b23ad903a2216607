"""``edgelearn partition MODEL --target NAME --out BUNDLE --key KEY``: a signed,
target-specific bundle (model partitions with placement, trainable subset, plan,
and for MicroPython targets the flat int8 tensor blob of docs/partition.md).

    $ edgelearn partition build/kws/encoder_int8.tflite --target esp32 --out out/kws-esp32 \\
          --key keys/edgelearn.key --labels yes,no,up,down

The bundle is built by ``host.partition.build.build_target_bundle`` (the same from Python).
"""

from __future__ import annotations

from pathlib import Path


def positive_int(text: str) -> int:
    import argparse

    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return n


def add_arguments(p) -> None:
    p.add_argument("model", type=Path, help="int8 .tflite (or .onnx) model, or a bundle (or a shipped bundle's name)")
    p.add_argument("--target", required=True, help="profile name or path to your own profile .toml")
    p.add_argument("--out", required=True, type=Path, help="bundle directory to write")
    p.add_argument("--key", required=True, type=Path, help="Ed25519 private key (edgelearn bundle keygen)")
    p.add_argument("--model-id", default=None,
                   help="model id (default: the input bundle's, else kws-dscnn-s)")
    p.add_argument("--version", type=positive_int, default=None,
                   help="bundle version (default: the input bundle's, else 1)")
    p.add_argument("--labels", default="", help="comma-separated labels (default: from the input bundle)")
    p.add_argument("--objective", choices=("latency", "energy"), default="latency")
    p.add_argument("--cut", type=int, help="force a device/cloud cut before this layer (ONNX models)")
    p.add_argument("--force", action="store_true", help="write the bundle even if the plan does not fit")


def run(args) -> int:
    from host.bundle import bundle_arg
    from host.partition.build import build_target_bundle

    args.model = bundle_arg(args.model)  # a shipped bundle's name works too

    out, plan = build_target_bundle(args.model, args.target, args.out, args.key, model_id=args.model_id,
                                    version=args.version, labels=[x for x in args.labels.split(",") if x],
                                    objective=args.objective, cut=args.cut, force=args.force)
    print(plan.verdict)
    print(f"bundle: {out}")
    return 0
