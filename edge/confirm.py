"""A second stage for the base commands on a Pi: does a real-speech recogniser hear the word?

Why: the encoder is trained on synthetic voices only. On voices it never heard its posteriors for a
command peak around 0.3-0.5, under the default 0.7, while real speech reaches the same posteriors
on words that merely start like a command ("yes" in "yesterday", "on" in "hold time"). A
recogniser trained on real speech tells those apart: PocketSphinx's US-English acoustic model and
trigram language model (CMU, BSD-style licences; PyPI ``pocketsphinx``, ``pip install
'edgelearn[asr]'``), a well-kept library we do not rewrite. The first stage runs at
``FIRST_STAGE`` instead of 0.7; each base-keyword candidate's audio (``BEFORE_S`` before its
keyword end to ``AFTER_S`` after) is decoded with the full vocabulary, and the event stands only
if the decode is the command alone: a command said on its own, as the ten commands are meant to
be said ("yes" inside a sentence, or an English word heard in Spanish, is not one). The decoder's
beams are narrower than PocketSphinx's defaults (``DECODER``): a quarter of the CPU per
candidate, the same recall on the development data. Only on candidates, so the recogniser runs on a few
seconds of audio a minute of speech, not on the stream; an ESP32 has neither the memory nor the
CPU, so this is the Pi tier's.

The rule, the beams and ``FIRST_STAGE`` were chosen on development data only
(``scripts/asr_stage.py``: other renders of the Flite voices plus kal16, the Allison development
half, synthetic word pairs, French and Italian prompts; docs/edge-runtime.md, "A recogniser
trained on real speech"); ``bench/kws_confirm.py`` reports it on bench ``kws_base``'s streams.

    >>> det = Detector(km, threshold=FIRST_STAGE, asr=AsrConfirm())   # edge.detect
"""

from __future__ import annotations

import numpy as np

from edge.errors import EdgelearnError, importable

FIRST_STAGE = 0.3      # the base commands' first-stage threshold under this second stage
BEFORE_S, AFTER_S = 1.1, 0.4
# PocketSphinx's beams (its defaults: 1e-48, 7e-29, 1e-48, 1e-40): ~100 instead of ~450 ms per candidate
DECODER = {"beam": 1e-30, "wbeam": 1e-20, "pbeam": 1e-30, "lpbeam": 1e-25}
SAMPLE_RATE = 16000


def available() -> bool:
    return importable("pocketsphinx")


def require() -> None:
    """One sentence, before any model loads, where PocketSphinx is missing."""
    if not available():
        raise EdgelearnError("the recogniser second stage needs PocketSphinx, which is not installed",
                             fix="pip install 'edgelearn[asr]' (or run without --asr)")


class AsrConfirm:
    """``says(word, pcm) -> bool``: is PocketSphinx's full-vocabulary decode of ``pcm`` (int16,
    16 kHz) ``word`` alone? ``decoded`` and ``seconds`` count the snippets and their audio;
    ``last`` is the last decode. ``first_stage``: the threshold the first stage runs at under it."""

    first_stage = FIRST_STAGE

    def __init__(self, decoder=None):
        if decoder is None:
            require()
            from pocketsphinx import Decoder

            decoder = Decoder(samprate=SAMPLE_RATE, loglevel="FATAL", **DECODER)
        self.decoder = decoder
        self.decoded, self.seconds = 0, 0.0
        self.last = ""

    def words(self, pcm) -> list[str]:
        pcm = np.asarray(pcm, np.int16)
        self.decoded += 1
        self.seconds += len(pcm) / SAMPLE_RATE
        d = self.decoder
        d.start_utt()
        d.process_raw(pcm.tobytes(), False, True)
        d.end_utt()
        hyp = d.hyp()
        self.last = hyp.hypstr if hyp is not None else ""
        return self.last.split()

    def says(self, word: str, pcm) -> bool:
        return self.words(pcm) == [word.lower()]
