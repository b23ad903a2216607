"""The custom-voices tests' taught state (tests/test_custom_voices.py, tests/test_custom_voices_levels.py)."""

from __future__ import annotations

import json

NAME = "buzz word"


def teach_buzz_word(root) -> dict:
    """A state with NAME enrolled from 5 buzz clips, then taught voices (a test-size recipe: one
    espeak-ng voice, no corpus, 8 epochs)."""
    from devstate_helpers import make_keyword_clips
    from edge.device import Device
    from host.custom_voices import teach
    from host.data import synth as S
    from host.export import esphome as E

    clips = make_keyword_clips(root / "clips")
    Device(root / "st").enroll(NAME, clips)
    before = json.loads((root / "st" / "keywords.json").read_text())["keywords"][0]
    cfg = E.ExportConfig(user_copies=6, noise_contexts=40, epochs=8, batch=32, log=lambda m: None)
    rep = teach(root / "st", None, NAME, cfg=cfg, corpus=None, voices=[S.Voice("espeak", "en-us")])
    return {"root": root, "state": root / "st", "clips": clips, "before": before, "report": rep}


def entry(state) -> dict:
    return json.loads((state / "keywords.json").read_text())["keywords"][0]
