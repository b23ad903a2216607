"""Experiment (issue 17, 2026-12-07, session 50): do phrase models lean on the band above 4 kHz?

Every real-speech negative this project has is 8 kHz telephone audio (Debian's Asterisk prompts), and
the synthetic positives are 16 kHz. A model trained with real prompts among its negatives can learn
"no energy above 4 kHz: not the phrase", which would lower its false accepts on the prompts without
saying anything about a full-band talker. This scores the same positives twice, as they are and
band-limited to 4 kHz (resampled to 8 kHz and back, as the prompts are), with the peak the device's
phrase stage takes (``edge.phrase_stage.snippet_peak``):

- ``base SET [SET ...]``: the base commands' phrase models, ``shipped`` (the bundle's) or directories
  of trained ones (``DIR,DIR``: two seeds averaged, ``DIR/<command>/<command>.tflite`` as
  ``scripts/base_phrase_dev.py`` writes them; one directory: that model alone) on each command's renders by Flite awb/rms/slt of the development
  seeds (``scripts/curve_variants.py``'s), clean;
- ``custom``: bench ``kws_custom``'s `export voices` phrase models (its cached taught state) on its
  positives, the enrolling voice and the other voices apart.

    $ .venv/bin/python scripts/band_check.py base shipped build/base_phrase_s0_ovreal,build/base_phrase_s1_ovreal
    $ .venv/bin/python scripts/band_check.py custom
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SR = 16000


def band_limited(x: np.ndarray) -> np.ndarray:
    """``x`` (int16, 16 kHz) through 8 kHz and back: nothing above 4 kHz, as the prompts."""
    from scipy.signal import resample_poly

    y = resample_poly(resample_poly(x.astype(np.float64), 1, 2), 2, 1)
    return np.clip(y, -32768, 32767).astype(np.int16)


def summary(peaks: list[float], cut: float) -> dict:
    p = np.asarray(peaks)
    return {"n": len(p), "mean_peak": round(float(p.mean()), 3), f"at_least_{cut:g}": round(float((p >= cut).mean()), 3)}


def base(sets: list[str]) -> dict:
    from bench import _base_streams as B
    from edge.phrase_stage import PhraseModel, snippet_peak
    from host.data.words import COMMANDS10
    from scripts.curve_variants import DEV_SEEDS

    streams = B.voice_streams(seed=DEV_SEEDS[0], stream_seed=DEV_SEEDS[1])
    out = {}
    for spec in sets:
        if spec == "shipped":   # the shipped bundle's own ensembles
            from edge.bundle import load_bundle
            from edge.kws import DEFAULT_BUNDLE, REPO_KEYS
            from edge.phrase_stage import PhraseConfirm

            models = PhraseConfirm(load_bundle(DEFAULT_BUNDLE, trusted_keys=REPO_KEYS)).models
        else:
            models = {c: PhraseModel([(Path(d) / c / f"{c}.tflite").read_bytes() for d in spec.split(",")], c)
                      for c in COMMANDS10}
        for band in ("full", "4k"):
            peaks = []
            for (_v, snr), (pcm, spans, clips) in streams.items():
                if snr is not None:
                    continue
                x = pcm if band == "full" else band_limited(pcm)
                for (_a, b), c in zip(spans, clips):
                    if b >= 2.0:   # the snippet the stage judges: 2 s before the keyword's end to 0.3 s after
                        peaks.append(snippet_peak(models[c.word], x[int((b - 2.0) * SR):int((b + 0.3) * SR)], 2.0, 0.3))
            out[f"{spec} {band}"] = summary(peaks, 0.5)
    return out


def custom() -> dict:
    from bench import kws_custom as K
    from edge.phrase_stage import snippet_peak

    audio = K.render_audio()
    det, _ = K.voices_system(audio).detector(keywords=[], replay=False)
    models = {n: v for n, v in zip(det.custom.names, det.custom.voices) if v is not None}
    rng, res = np.random.default_rng(0), {}
    for key, clip in audio.items():
        if not key.startswith("pos/"):
            continue
        _, voice, phrase, _i = key.split("/")
        clip = np.asarray(clip, np.int16)
        pad = max(0, int(2.0 * SR) - len(clip))
        snip = np.concatenate([np.zeros(pad, np.int16), clip, np.zeros(int(0.3 * SR), np.int16)])
        snip = np.clip(snip + rng.normal(0, 30, len(snip)), -32768, 32767).astype(np.int16)   # a noise floor
        who = "enrolling voice" if voice == f"{K.USER[0]}:{K.USER[1]}" else "other voices"
        for band, x in (("full", snip), ("4k", band_limited(snip))):
            res.setdefault(f"{who} {band}", []).append(snippet_peak(models[phrase].model, x, (pad + len(clip)) / SR, 0.3))
    cut = next(iter(models.values())).cutoff
    return {k: summary(v, cut) for k, v in sorted(res.items())}


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "base" and len(sys.argv) > 2:
        print(json.dumps(base(sys.argv[2:]), indent=1))
    elif what == "custom":
        print(json.dumps(custom(), indent=1))
    else:
        raise SystemExit(__doc__)
