"""The TFLite Micro audio front end ESPHome's micro_wake_word runs, via ``pymicro-features``.

30 ms window, 10 ms step, 40 channels (125-7500 Hz), noise reduction and PCAN as ESPHome
configures them: ``pymicro-features`` wraps that same C code (it is what ``pymicro-wakeword``
runs), so the features a model is trained on here are the ones it sees on the board. Each
feature is the front end's uint16 output / 25.6, in [0, 26]; the model's int8 input is
``round(feature / INPUT_SCALE) + INPUT_ZERO_POINT``, the fixed mapping ESPHome applies
(``(value * 256 + 333) / 666 - 128``), so every export must carry exactly this quantisation.

    >>> feats = features(pcm)          # (frames, 40) float32, one row per 10 ms after the first 30 ms
"""

from __future__ import annotations

import numpy as np

SAMPLE_RATE = 16000
STEP_SAMPLES = 160          # 10 ms
WINDOW_SAMPLES = 480        # 30 ms
CHANNELS = 40
FEATURE_MAX = 26.0
INPUT_SCALE = FEATURE_MAX / 255.0    # 0.10196078..., microWakeWord's released models' input scale
INPUT_ZERO_POINT = -128


def features(pcm: np.ndarray) -> np.ndarray:
    """Front-end features of 16 kHz int16 audio from a fresh front end: (frames, 40) float32.

    Fed 10 ms at a time, as ``pymicro_wakeword.MicroWakeWordFeatures`` feeds it; the device's
    phrase second stage computes them with the same function (``edge.phrase_stage.features``)."""
    from edge.phrase_stage import features as device_features

    return device_features(pcm)


def frame_of_sample(n: int) -> int:
    """Index of the first feature frame whose 30 ms window ends at or after sample ``n``."""
    return max(0, -(-(n - WINDOW_SAMPLES) // STEP_SAMPLES))


def quantize(feats: np.ndarray) -> np.ndarray:
    """Features as the model's int8 input (ESPHome's mapping; ``edge.phrase_stage.quantize``)."""
    from edge.phrase_stage import quantize as device_quantize

    return device_quantize(feats)
