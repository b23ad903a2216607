"""``edgelearn quantize``: full-integer int8 TFLite and int8 ONNX (QDQ) from a trained model.

Each int8 model is scored beside fp32 on the same clips; if one loses more than ``--max-drop``
points, the layers with the largest quantisation error are kept in float, one at a time, until it
does not. The work is ``host.quantize.quantize``.

    $ edgelearn quantize --model build/kws --out build/kws
"""

from __future__ import annotations

import json
from pathlib import Path

from host.quantize import quantize


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, type=Path, help="directory written by `edgelearn train`")
    p.add_argument("--out", type=Path, help="output directory (default: the model directory)")
    p.add_argument("--max-drop", type=float, default=1.0, help="allowed int8 loss, accuracy points")


def run(args) -> int:
    res = quantize(args.model, args.out or args.model, max_drop=args.max_drop)
    print(json.dumps(res["metrics"], indent=1))
    return 0
