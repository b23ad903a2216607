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
    "keep_versions": ("--keep-versions", True, lambda v: v >= 1, "not a number of versions to keep (1 or more)",
                      "pass e.g. --keep-versions 10 (the default; the current and previous versions are kept too)"),
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
    # `device sensitivity --max-fa-per-hour` / Device.sensitivity(max_fa_h=): 0 or inf would switch the level
    # on a rate no keyword can meet or every one meets, -1 and nan read as "allow more" (as --sensitivity)
    "max_fa_h": ("--max-fa-per-hour", False, lambda v: _finite(v) and v > 0,
                 "not a positive finite rate of false accepts per hour", "pass e.g. --max-fa-per-hour 1"),
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


# -- the Python API's other arguments (edge.Device): a wrong type is one sentence naming the argument,
# never a numpy / pathlib / AttributeError traceback from deep inside (README "Python API")

MAX_CHANNELS = 8  # a 2-D array this narrow is (frames, channels), as soundfile returns it; never chunks


def check_text(value, what: str, fix: str) -> str:
    """``value`` if it is text (str), else one EdgelearnError: "``what`` must be text ..."."""
    if not isinstance(value, str):
        raise EdgelearnError(f"{what} must be text, not {type(value).__name__} {_short(value)}", fix=fix)
    return value


def check_keyword_name(name) -> str:
    return check_text(name, "keyword name", "pass the phrase as a str, e.g. 'hey edge'")


def check_context(context, none_ok: bool = False):
    """An adapted context's name (None too where ``none_ok``: the base model)."""
    if context is None and none_ok:
        return None
    return check_text(context, "context", "a context must be a name (text), e.g. context='kitchen'"
                      + (" (None: the base model)" if none_ok else ""))


def check_path(value, what: str, fix: str, none_ok: bool = False):
    """``value`` if it is a path (str or os.PathLike; None where ``none_ok``), else one EdgelearnError."""
    import os

    if (value is None and none_ok) or isinstance(value, (str, os.PathLike)):
        return value
    raise EdgelearnError(f"{what} must be a path, not {type(value).__name__} {_short(value)}", fix=fix)


def check_paths(value, what: str, fix: str) -> list:
    """One path or a non-empty list of them -> the list; anything else one EdgelearnError."""
    import os

    if isinstance(value, (str, os.PathLike)):
        return [value]
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, (str, os.PathLike)) for v in value):
        raise EdgelearnError(f"{what}, not {type(value).__name__} {_short(value)}", fix=fix)
    return list(value)


def check_device(state_dir, bundle) -> None:
    """``Device(state_dir, bundle)``'s types (a loaded bundle has a manifest)."""
    check_path(state_dir, "state_dir", "pass the device's state directory, e.g. Device('state/')")
    if not hasattr(bundle, "manifest"):
        check_path(bundle, "bundle", "pass a bundle directory, .zip or shipped name (None: the installed or "
                   "shipped model)", none_ok=True)


def check_adapt_input(data, context) -> None:
    """``Device.adapt``'s data (5, a list, an array were pathlib's TypeError) and context ([1, 2, 3]
    was "unhashable", an array "ambiguous truth value")."""
    if not (isinstance(data, tuple) and len(data) == 2):
        check_path(data, "data", "pass a directory DIR/<label>/*.wav, or (clips, labels)")
    check_context(context)


def refuse_channels(a, what: str = "audio") -> None:
    """A (frames, channels) array (soundfile's stereo) is refused: it would be read as garbage mono."""
    if getattr(a, "ndim", 1) == 2 and a.shape[1] <= MAX_CHANNELS:
        raise EdgelearnError(f"{what} must be mono samples, shape (N,), not {a.shape}",
                             fix="mix or pick a channel first, e.g. x.mean(axis=1) or x[:, 0]")


def samples(x, what: str = "audio"):
    """``x`` as mono samples detection and enrolment read alike (``edge.features.to_float``): int16 as
    is, float in [-1, 1] (soundfile's default) as is, other whole numbers within int16 as int16.
    Anything else (not 1-D, text, None, float outside [-1, 1]) is one EdgelearnError."""
    import numpy as np

    fix = "pass 16 kHz mono int16 samples, or float samples in [-1, 1], shape (N,)"
    a = np.asarray(x) if isinstance(x, (np.ndarray, list, tuple)) else None
    if a is None or a.dtype.kind not in "iuf" or a.dtype == bool:
        raise EdgelearnError(f"{what} must be an array of samples, not {type(x).__name__} {_short(x)}", fix=fix)
    refuse_channels(a, what)
    if a.ndim != 1:
        raise EdgelearnError(f"{what} must be mono samples, shape (N,), not {a.shape}", fix=fix)
    if a.dtype == np.int16 or not a.size:
        return a
    if a.dtype.kind == "f":
        if not np.all(np.isfinite(a)) or float(np.abs(a).max()) > 1.0:
            raise EdgelearnError(f"{what} is float samples outside [-1, 1]",
                                 fix="scale them into [-1, 1] (int16-valued floats: divide by 32768), or pass int16")
        return a
    if int(a.min()) < -32768 or int(a.max()) > 32767:
        raise EdgelearnError(f"{what} has values outside int16", fix=fix)
    return a.astype(np.int16)


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."
