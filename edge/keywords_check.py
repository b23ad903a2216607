"""The rules of a custom keyword's entry in keywords.json, and the check of each entry.

What an entry may hold (its name, sensitivities, speaker heads, verifier) and ``check_keywords``,
which detection, enrolment and status run on the file as they read it; ``at_sensitivity`` gives an
entry the thresholds of its chosen sensitivity. Split out of ``edge.keywords`` (the state file and
the scorer), which re-exports every name here.
"""

from __future__ import annotations

import re

import numpy as np

from edge.errors import EdgelearnError

# The first stage's bank false-accept rate and (edge.verify.PASS_TARGETS) the second stage's pass
# rate on distorted enrolment clips per noise level, chosen together on the kws_fewshot main set
# (the stronger stage takes more of the rejection); docs/edge-runtime.md.
FAR_TARGET = 0.004
# A keyword's sensitivities (`device enroll --sensitivity`, `device sensitivity`): per level, the
# first stage's bank false-accept rate and the second stage's pass rate on the distorted enrolment
# clips (levels at 20 dB and above, levels under 20 dB; None: edge.verify's PASS_TARGETS and
# NOISY_PASS of the version). "medium" is the default the targets above were chosen for; "low" and
# "high" were set beforehand, 4x fewer / more bank false accepts, not tuned on any benchmark, and
# bench/kws_custom measures all three.
SENSITIVITIES = {"low": (0.001, 0.5, 0.8), "medium": (FAR_TARGET, None, None), "high": (0.016, 0.8, 0.97)}
DEFAULT_SENSITIVITY = "medium"
# A keyword name: ASCII only. The model and its phone stage are English, and names reach C and
# MicroPython firmware, file names and other tools, where one Unicode phrase could be spelled two ways
# (composed or decomposed accents) or take 4 bytes a letter.
_NAME = re.compile(r"^[a-z0-9][a-z0-9 _'-]{0,31}$")
NAME_RULE = "use 1-32 ASCII letters (a-z), digits, spaces, ' _ or -, starting with a letter or digit"


def _real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)


def _vector(v, what: str, n: int | None = None) -> int:
    if not (isinstance(v, list) and v and all(_real(x) for x in v)):
        raise ValueError(f"{what} is not a list of finite numbers")
    if n is not None and len(v) != n:
        raise ValueError(f"{what} has {len(v)} values, the others have {n}")
    return len(v)


def check_keywords(kws) -> list[dict]:
    """The ``keywords`` list of keywords.json, checked entry by entry (what detection, enrolment and
    status read); raises ValueError saying which entry and field is wrong."""
    if not isinstance(kws, list):
        raise ValueError(f"'keywords' is {type(kws).__name__}, not a list")
    dim, names = None, set()
    for i, e in enumerate(kws):
        where = f"keyword {i + 1}"
        if not isinstance(e, dict):
            raise ValueError(f"{where} is {type(e).__name__}, not an object")
        name = e.get("name")
        if not isinstance(name, str) or not _NAME.match(name) or name in names:
            raise ValueError(f"{where} has name {name!r} (not a usable, unique keyword name)")
        names.add(name)
        where = f"keyword {name!r}"
        dim = _vector(e.get("w"), f"{where} 'w'", dim)
        if "prototype" in e:  # enrolment keeps it (hand-made entries may lack it; detection does not need it)
            _vector(e["prototype"], f"{where} 'prototype'", dim)
        for k in ("b", "threshold"):
            if not _real(e.get(k)):
                raise ValueError(f"{where} {k!r} is {e.get(k)!r}, not a finite number")
        _check_sensitivity(e, where)
        _check_speaker_heads(e, where, dim)
        if "voices" in e:  # other voices' path (edgelearn export voices)
            from edge.custom_voices import check

            check(e["voices"], where)
        if "verify" in e:
            v = e["verify"]
            if not isinstance(v, dict):
                raise ValueError(f"{where} 'verify' is {type(v).__name__}, not an object")
            ver = v.get("version", 1)
            if isinstance(ver, bool) or not isinstance(ver, int):
                raise ValueError(f"{where} verifier version {ver!r} is not a number")
            if not _real(v.get("threshold")):
                raise ValueError(f"{where} verifier threshold {v.get('threshold')!r} is not a finite number")
            q = v.get("qparams", [])
            if not (isinstance(q, list) and all(_real(x) for x in q)):
                raise ValueError(f"{where} verifier qparams {q!r} are not numbers")
            from edge import verify as V

            try:  # templates, steps and levels, as the detector will read them
                V.unpack(v)
                V.levels_of(v)
            except EdgelearnError as err:
                raise ValueError(f"{where}: {err.problem}") from None
    return kws


def _check_speaker_heads(e: dict, where: str, dim) -> None:
    heads = e.get("speaker_heads", [])
    if not isinstance(heads, list):
        raise ValueError(f"{where} 'speaker_heads' is not a list")
    for h in heads:
        if not isinstance(h, dict) or not _real(h.get("b")) or not _real(h.get("threshold")):
            raise ValueError(f"{where} has a speaker head without a finite 'b' and 'threshold'")
        _vector(h.get("w"), f"{where} speaker head 'w'", dim)
        lv = h.get("sensitivities", {})
        if not isinstance(lv, dict) or not all(k in SENSITIVITIES and _real(v) for k, v in lv.items()):
            raise ValueError(f"{where} speaker head 'sensitivities' is not a table of thresholds")
        if set(lv) != set(e.get("sensitivities", {})):
            raise ValueError(f"{where} speaker heads and the keyword have different sensitivity levels")


def _check_sensitivity(e: dict, where: str) -> None:
    level, table = e.get("sensitivity", DEFAULT_SENSITIVITY), e.get("sensitivities", {})
    if level not in SENSITIVITIES:
        raise ValueError(f"{where} sensitivity {level!r} is not one of {', '.join(SENSITIVITIES)}")
    if not isinstance(table, dict) or any(k not in SENSITIVITIES or not isinstance(v, dict) or not _real(
            v.get("threshold")) for k, v in table.items()):
        raise ValueError(f"{where} 'sensitivities' is not a table of levels with thresholds")
    for k, v in table.items():
        lv = v.get("verify_levels")
        if lv is not None and not (isinstance(lv, list) and lv and all(
                isinstance(p, list) and len(p) == 2 and all(_real(x) for x in p) for p in lv)):
            raise ValueError(f"{where} sensitivity {k!r} verifier levels are not (range, threshold) pairs")
    if level != DEFAULT_SENSITIVITY and level not in table:
        raise ValueError(f"{where} is set to sensitivity {level!r}, which its entry has no thresholds for")
    fa = e.get("fa_per_hour", {})
    if not isinstance(fa, dict) or not all(k in SENSITIVITIES and _real(v) and v >= 0 for k, v in fa.items()):
        raise ValueError(f"{where} 'fa_per_hour' is not a table of measured rates by level")


def at_sensitivity(e: dict) -> dict:
    """Entry ``e`` with the thresholds of its chosen sensitivity in the fields the detector reads
    (``threshold``; the verifier's ``levels`` and ``threshold``)."""
    level = e.get("sensitivity", DEFAULT_SENSITIVITY)
    if level == DEFAULT_SENSITIVITY:
        return e
    lv = e["sensitivities"][level]
    out = {**e, "threshold": lv["threshold"]}
    if "speaker_heads" in e:
        out["speaker_heads"] = [{**h, "threshold": h["sensitivities"][level]} for h in e["speaker_heads"]]
    if "verify" in e and lv.get("verify_levels"):
        out["verify"] = {**e["verify"], "levels": lv["verify_levels"],
                         "threshold": max(t for _, t in lv["verify_levels"])}
    return out
