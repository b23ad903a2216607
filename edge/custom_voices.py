"""Other voices for an enrolled keyword: its phrase models as a second path past the first stage.

An enrolled keyword's two stages hear the voice that enrolled it and almost no other (the verifier
compares against the enrolment clips; bench ``kws_custom``: other voices 100 % missed). ``edgelearn
export voices`` (``host/custom_voices.py``) teaches it other voices from its typed phrase: a second
first-stage head trained on the phrase said by the corpus's training voices (a ``speaker_heads``
entry marked ``"voices"``), and two phrase models of the phrase (the ESPHome export's recipe, seeds 0
and 1, the user's clips among their positives), stored beside the state. The entry's ``voices``
field::

    "voices": {"version": 1, "models": ["voices/hey_jarvis-<digest>_0.tflite", "voices/hey_jarvis-<digest>_1.tflite"],
               "cutoff": 0.97, "lower": 0.0}

Detection (``edge.detect.Detector``): the keyword's candidate opens at its threshold lowered by
``lower`` in logit (0 as shipped: where it opened before); a candidate that reaches the keyword's own threshold and passes its verifier is
an event as before; any other candidate is held until ``AFTER_S`` of audio past its keyword end has
come, then the mean of the phrase models' outputs (``edge.phrase_stage``: TFLite Micro's front end,
ESPHome's sliding window of 5) must reach ``cutoff`` somewhere from 0.3 s before the keyword end to
``AFTER_S`` after, on the audio from ``BEFORE_S`` before it. ``lower`` and ``cutoff`` were chosen on
development data (``scripts/custom_cascade_dev.py``; docs/edge-runtime.md, "Other voices for a
custom keyword"). Needs the ``phrase`` extra (pymicro-features) and LiteRT.
"""

from __future__ import annotations

import math
from pathlib import Path

from edge.errors import EdgelearnError

VERSION = 1
DIR = "voices"                      # under the state directory
# chosen on development data (scripts/custom_cascade_dev.py --integrated; docs/edge-runtime.md): the
# lowest cutoff at which the four development phrases stay at <= 0.5 false accepts per hour each on the
# development negatives. Opening the first stage lower hears more (1.0 lower and a cutoff of 0.995: other
# voices 64.6 / 58.3 % against 41.6 / 41.7 %) for twice the false accepts there (0.87 FA/h)
LOWER, CUTOFF = 0.0, 0.97
BEFORE_S, AFTER_S = 2.0, 0.3        # the snippet around a candidate (as the base commands' phrase stage)
SEEDS = (0, 1)


def check(v, where: str) -> None:
    """An entry's ``voices`` field, as detection reads it; ValueError saying what is wrong."""
    if not isinstance(v, dict):
        raise ValueError(f"{where} 'voices' is {type(v).__name__}, not an object")
    if v.get("version") != VERSION:
        raise ValueError(f"{where} voices version {v.get('version')!r}: this runtime reads version {VERSION}")
    models = v.get("models")
    if not (isinstance(models, list) and models and all(
            isinstance(m, str) and m.startswith(DIR + "/") and ".." not in m and "\\" not in m for m in models)):
        raise ValueError(f"{where} voices 'models' is not a list of files under {DIR}/")
    for k, lo, hi in (("cutoff", 0.0, 1.0), ("lower", 0.0, 10.0)):
        x = v.get(k)
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not (lo <= x <= hi) or math.isnan(x):
            raise ValueError(f"{where} voices {k!r} is {x!r}, not a number in [{lo:g}, {hi:g}]")


def lowered(threshold: float, lower: float) -> float:
    """``threshold`` lowered by ``lower`` in logit (where a candidate opens)."""
    p = min(max(float(threshold), 1e-6), 1 - 1e-6)
    return 1.0 / (1.0 + math.exp(-(math.log(p / (1 - p)) - float(lower))))


class Voices:
    """One keyword's phrase models (an ensemble) and cutoff, loaded from the state directory."""

    def __init__(self, v: dict, root: Path, name: str):
        from edge import phrase_stage as PS

        PS.require()
        datas = []
        for rel in v["models"]:
            path = Path(root) / rel
            try:
                datas.append(path.read_bytes())
            except OSError as e:
                raise EdgelearnError(f"keyword {name!r}'s voice model {path} is unreadable ({e.strerror or e})",
                                     fix=f"run `edgelearn export voices --state {root} --keyword {name!r}` again") \
                    from None
        self.model, self.cutoff, self.lower = PS.PhraseModel(datas, name), float(v["cutoff"]), float(v["lower"])
        self.before_s, self.after_s = BEFORE_S, AFTER_S
        self.judged, self.last = 0, None

    def says_at(self, pcm, keyword_end_s: float) -> bool:
        """Do the models reach the cutoff on ``pcm`` (int16), whose keyword ends ``keyword_end_s`` in?"""
        from edge.phrase_stage import snippet_peak

        self.judged += 1
        self.last = snippet_peak(self.model, pcm, keyword_end_s, self.after_s)
        return self.last >= self.cutoff
