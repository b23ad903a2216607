"""``edgelearn train``: train the DS-CNN keyword encoder on the synthetic corpus.

Writes ``OUT/model.keras``, ``OUT/frontend.json`` (the per-coefficient feature scale),
``OUT/metrics.json`` and a training-curve PNG; the work is ``host.train.train``.

    $ edgelearn train --out build/kws --epochs 40
    $ edgelearn train --out build/no-festival --synths espeak     # leave Festival out
"""

from __future__ import annotations

import json
from pathlib import Path

from host.train import train


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


def run(args) -> int:
    result = train(out=args.out, epochs=args.epochs, batch=args.batch, lr=args.lr,
                   seed=args.seed, synths=tuple(args.synths.split(",")),
                   max_minutes=args.max_minutes, threads=args.threads)
    print(json.dumps(result["metrics"], indent=1))
    return 0
