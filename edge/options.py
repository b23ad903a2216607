"""The range of every numeric option of ``device adapt`` and ``device detect``, checked in one place.

The same rule refuses a bad value at argument parsing (``arg_type``, argparse's own error) and in
the Python API (``check_adapt`` at the start of ``Device.adapt``, ``check_detect`` at the start of
``Device.detect`` / ``Device.detector``): one sentence naming the option, its value and the fix.

    >>> check_adapt(lr=-1)
    EdgelearnError: --lr -1 is not a positive finite learning rate; pass e.g. --lr 0.01 ...
    >>> s.add_argument("--lr", type=arg_type("lr"))
"""

from __future__ import annotations

import argparse
import math
import numbers

from edge.errors import EdgelearnError


def _finite(v) -> bool:
    return math.isfinite(v)


# The detector scores 1 s windows (``edge.features.N_FRAMES`` = 49 hops of 20 ms) every ``stride``
# hops and averages the last 2 windows' scores (``Detector(smooth=2)``) before the threshold, so a
# word is found when two consecutive windows both hold it whole: one of at most 1 s - stride x 20 ms.
# At 16 hops that is 0.68 s, about a command's length; measured on 18 synthetic commands (3 voices,
# pink noise, the shipped model): every one found at strides 1-16, 15 at 20, 10 at 24, 1 at 30 and
# none from 40 on (over 49 some audio is in no window at all).
MAX_STRIDE = 16

# name: (flag, whole number?, in range?, what is wrong with a value out of range, fix)
RULES = {
    # adaptation (Device.adapt / `device adapt`)
    "lr": ("--lr", False, lambda v: _finite(v) and v > 0, "not a positive finite learning rate",
           "pass e.g. --lr 0.01 (default: 0.1 for sgd, 0.01 for adam)"),
    "steps": ("--steps", True, lambda v: v >= 1, "below 1 (no training step would run)", "pass e.g. --steps 200"),
    "rank": ("--rank", True, lambda v: v >= 1, "below 1 (the LoRA / adapter rank)", "pass e.g. --rank 4"),
    "replay_bytes": ("--replay-bytes", True, lambda v: v > 0, "not a positive number of bytes",
                     "pass e.g. --replay-bytes 1048576 (the default)"),
    "memory_budget": ("--memory-budget", True, lambda v: v > 0, "not a positive number of bytes",
                      "pass e.g. --memory-budget 262144 (the default)"),
    "augment": ("--augment", True, lambda v: v >= 0, "not a number of copies (0 or more)", "pass e.g. --augment 16"),
    "negative_share": ("--negative-share", False, lambda v: _finite(v) and 0 <= v < 1, "out of range (a share in [0, 1))",
                       "pass e.g. --negative-share 0.75"),
    "distill": ("--distill", False, lambda v: _finite(v) and 0 <= v <= 1, "outside 0..1",
                "pass a weight between 0 and 1"),
    "negative_distill": ("negative_distill", False, lambda v: _finite(v) and 0 <= v <= 1, "outside 0..1",
                         "pass a weight between 0 and 1"),
    "seed": ("seed", True, lambda v: v >= 0, "not a seed of 0 or more", "pass e.g. seed=0"),
    # detection (Device.detect / `device detect`, `device run`)
    "threshold": ("--threshold", False, lambda v: _finite(v) and 0 <= v <= 1, "not a score threshold in [0, 1]",
                  "pass e.g. --threshold 0.7 (scores are probabilities)"),
    "sensitivity": ("--sensitivity", False, lambda v: _finite(v) and v > 0,
                    "not a positive finite rate of false accepts per hour", "pass e.g. --sensitivity 1"),
    "stride": ("--stride", True, lambda v: 1 <= v <= MAX_STRIDE, f"not a stride of 1..{MAX_STRIDE} hops",
               f"pass e.g. --stride 4 (20 ms hops between encoder runs; over {MAX_STRIDE} a command no "
               "longer fits in the 2 windows the detector averages)"),
    "confirm": ("--confirm", False, lambda v: _finite(v) and 0 <= v <= 1, "not a score in [0, 1]",
                "pass e.g. --confirm 0.9 (detections at or above it feed the replay buffer)"),
}


def _show(v) -> str:
    if isinstance(v, numbers.Real) and not isinstance(v, (bool, numbers.Integral)):
        return f"{float(v):g}"
    return repr(v) if isinstance(v, str) else str(v)


def check(name: str, value):
    """``value`` if option ``name`` may take it (None passes: the default), else one EdgelearnError."""
    if value is None:
        return None
    flag, whole, ok, problem, fix = RULES[name]
    is_num = isinstance(value, numbers.Integral if whole else numbers.Real) and not isinstance(value, bool)
    if not is_num:
        raise EdgelearnError(f"{flag} {_show(value)} is not {'a whole number' if whole else 'a number'}",
                             fix=fix)
    if not ok(value):
        raise EdgelearnError(f"{flag} {_show(value)} is {problem}", fix=fix)
    return value


def check_adapt(**options) -> None:
    """Refuse any adaptation option out of its range (``RULES``); None means the default."""
    for name, value in options.items():
        check(name, value)


def check_detect(threshold=None, sensitivity=None, stride=None, confirm=None) -> None:
    """Refuse any detection option out of its range; ``threshold`` may be {keyword: threshold}."""
    if isinstance(threshold, dict):
        for v in threshold.values():
            check("threshold", v)
    else:
        check("threshold", threshold)
    check("sensitivity", sensitivity)
    check("stride", stride)
    check("confirm", confirm)


def arg_type(name: str):
    """An argparse ``type=`` for option ``name``: parses the text and applies its rule, so a bad
    value is argparse's own one-line error (exit status 2)."""
    whole = RULES[name][1]

    def parse(text: str):
        try:
            value = int(text) if whole else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'a whole number' if whole else 'a number'}") \
                from None
        try:
            return check(name, value)
        except EdgelearnError as e:  # argparse names the option itself ("argument --lr: -1 is ...")
            flag = RULES[name][0] + " "
            msg = str(e)
            raise argparse.ArgumentTypeError(msg[len(flag):] if msg.startswith(flag) else msg) from None

    parse.__name__ = "whole number" if whole else "number"
    return parse
