"""``edgelearn quantize``: full-integer int8 TFLite and int8 ONNX (QDQ) from a trained model.

Each int8 model is scored beside fp32 on the same clips; if one loses more than ``--max-drop``
points, the layers with the largest quantisation error are kept in float, one at a time, until it
does not. The work is ``host.quantize.quantize``.

    $ edgelearn quantize --model build/kws --out build/kws
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager, redirect_stdout
from pathlib import Path

from host.quantize import quantize


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, type=Path, help="directory written by `edgelearn train`")
    p.add_argument("--out", type=Path, help="output directory (default: the model directory)")
    p.add_argument("--max-drop", type=float, default=1.0, help="allowed int8 loss, accuracy points")


@contextmanager
def stdout_to_stderr():
    """While the block runs, whatever is written to stdout goes to stderr: Python's ``print`` and the
    C-level writes to fd 1 alike (the TensorFlow/tf2onnx export prints ~100 lines of its own), so
    the command's stdout is its JSON only (``edgelearn quantize ... | jq`` works)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        _flush_c_stdio()  # C++ output still in libc's buffer goes to stderr too, not after the restore
        os.dup2(saved, 1)
        os.close(saved)


def _flush_c_stdio() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


def run(args) -> int:
    with stdout_to_stderr():
        res = quantize(args.model, args.out or args.model, max_drop=args.max_drop)
    print(json.dumps(res["metrics"], indent=1))
    return 0
