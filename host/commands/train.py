"""``edgelearn train``: train the DS-CNN keyword encoder on the synthetic corpus.

Writes ``OUT/model.keras``, ``OUT/frontend.json`` (the per-coefficient feature scale),
``OUT/metrics.json`` and a training-curve PNG; the work is ``host.train.train``.

    $ edgelearn train --out build/kws --epochs 40
    $ edgelearn train --out build/no-festival --synths espeak     # leave Festival out
"""

from __future__ import annotations

import json
from pathlib import Path



def add_arguments(p) -> None:
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--synths", default="espeak,festival",
                   help="synthesizers to train on (comma list); the rest are only evaluated")
    p.add_argument("--max-minutes", type=float, default=28.0,
                   help="stop after this much training time (keeps the best epoch so far)")
    p.add_argument("--threads", type=int, default=2)


TRAIN_SYNTHS = ("espeak", "festival")  # the corpus's synthesizers with a training split (Flite is held out)


def check_options(args) -> tuple:
    """The --synths list; one EdgelearnError naming the first bad option, before the corpus is rendered."""
    import math

    from edge.errors import EdgelearnError

    synths = tuple(x.strip() for x in args.synths.split(",") if x.strip())
    bad = [x for x in synths if x not in TRAIN_SYNTHS]
    if bad or not synths:
        raise EdgelearnError(f"--synths {args.synths!r}: {', '.join(bad) or 'no synthesizer'} cannot be trained on",
                             fix=f"give a comma list of {', '.join(TRAIN_SYNTHS)} (Flite is held out for evaluation)")
    for name, v, what in (("--epochs", args.epochs, "a number of epochs"), ("--batch", args.batch, "a batch size"),
                          ("--threads", args.threads, "a number of threads"), ("--lr", args.lr, "a learning rate"),
                          ("--max-minutes", args.max_minutes, "minutes of training")):
        if not (math.isfinite(v) and v > 0):
            raise EdgelearnError(f"{name} {v} must be above 0", fix=f"give {what} above 0")
    if args.out.exists() and not args.out.is_dir():
        raise EdgelearnError(f"--out {args.out} is a file", fix="give a directory for the trained model")
    return synths


def run(args) -> int:
    from host.train import train

    synths = check_options(args)
    result = train(out=args.out, epochs=args.epochs, batch=args.batch, lr=args.lr,
                   seed=args.seed, synths=synths,
                   max_minutes=args.max_minutes, threads=args.threads)
    print(json.dumps(result["metrics"], indent=1))
    return 0
