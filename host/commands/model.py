"""``edgelearn model``: rebuild the shipped bundle from nothing but Debian's synthesizers.

Corpus (+ RHVoice's and SVOX Pico's voices and real speech of other languages as ``_unknown_``,
``host.data.supplement``; Debian non-free: scripts/model_deps.sh installs them) -> train -> int8
TFLite + ONNX -> the verifier's phone model -> negative bank -> model card -> signed bundle
(``host.recipe.rebuild``) -> the base commands' phrase models and their cutoffs, chosen on real
development speech (``host.phrase_stage``; skipped, with a word, where Debian's Allison prompts are
not installed, or with ``--no-phrase-models``). Intermediate products go to ``--work`` (default
``build/kws``); ``--reuse`` skips steps whose outputs are already there.

    $ edgelearn model --out models/kws-dscnn-s --key ~/.config/edgelearn/release.key
"""

from __future__ import annotations

from pathlib import Path

from host.recipe import DEFAULT_KEY, EPOCHS, MODEL_ID, VERSION, rebuild


def add_arguments(p) -> None:
    p.add_argument("--out", type=Path, default=Path("models") / MODEL_ID)
    p.add_argument("--work", type=Path, default=Path("build") / "kws")
    p.add_argument("--key", type=Path, default=DEFAULT_KEY,
                   help="Ed25519 private key to sign with (created if missing)")
    p.add_argument("--pubkey-out", type=Path, default=Path("models") / "keys",
                   help="where the matching public key is written")
    p.add_argument("--version", type=int, default=VERSION,
                   help=f"bundle version (monotonic; default {VERSION}, the shipped one's)")
    p.add_argument("--epochs", type=int, default=EPOCHS)
    p.add_argument("--threshold", default=None, metavar="T|FILE",
                   help="the commands' default operating point written to the manifest: one threshold, or a "
                        "JSON file of {command: threshold} (default: host/recipe.py's OPERATING, chosen on "
                        "development data for the shipped weights)")
    p.add_argument("--reuse", action="store_true", help="reuse training/quantisation outputs in --work")
    p.add_argument("--no-phrase-models", action="store_true",
                   help="do not train the base commands' phrase models (~30 min of CPU): the bundle then runs "
                        "its first stage alone by default")


def threshold_arg(text):
    """``--threshold``: None, a number, or a JSON file of {command: threshold}; one sentence if neither."""
    import json

    from edge.errors import EdgelearnError

    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        table = json.loads(Path(text).read_text())
    except (OSError, ValueError):
        raise EdgelearnError(f"--threshold {text!r} is neither a number nor a readable JSON file",
                             fix="give e.g. --threshold 0.8, or a file holding {\"yes\": 0.8, ...}") from None
    if not isinstance(table, dict):
        raise EdgelearnError(f"{text} holds no JSON object of {{command: threshold}}",
                             fix="write one threshold for each of the ten commands")
    return table


def run(args) -> int:
    key = rebuild(args.out, args.work, args.key, args.pubkey_out, version=args.version, epochs=args.epochs,
                  reuse=args.reuse, threshold=threshold_arg(args.threshold), phrase=not args.no_phrase_models)
    print(f"model: wrote {args.out} (version {args.version}), signed with {key}")
    return 0
