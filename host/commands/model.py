"""``edgelearn model``: rebuild the shipped bundle from nothing but Debian's synthesizers.

Corpus -> train -> int8 TFLite + ONNX -> the verifier's phone model -> negative bank -> model card
-> signed bundle (``host.recipe.rebuild``). Intermediate products go to ``--work`` (default
``build/kws``); ``--reuse`` skips steps whose outputs are already there.

    $ edgelearn model --out models/kws-dscnn-s --key ~/.config/edgelearn/release.key
"""

from __future__ import annotations

from pathlib import Path

from host.recipe import DEFAULT_KEY, MODEL_ID, rebuild


def add_arguments(p) -> None:
    p.add_argument("--out", type=Path, default=Path("models") / MODEL_ID)
    p.add_argument("--work", type=Path, default=Path("build") / "kws")
    p.add_argument("--key", type=Path, default=DEFAULT_KEY,
                   help="Ed25519 private key to sign with (created if missing)")
    p.add_argument("--pubkey-out", type=Path, default=Path("models") / "keys",
                   help="where the matching public key is written")
    p.add_argument("--version", type=int, default=1, help="bundle version (monotonic)")
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--reuse", action="store_true", help="reuse training/quantisation outputs in --work")


def run(args) -> int:
    key = rebuild(args.out, args.work, args.key, args.pubkey_out, version=args.version, epochs=args.epochs,
                  reuse=args.reuse)
    print(f"model: wrote {args.out} (version {args.version}), signed with {key}")
    return 0
