"""bench ``kws_base --variant``: a trained build (``scripts/train_variant.py``) streamed beside the
shipped model at several thresholds. Moved out of bench/kws_base.py unchanged (it re-exports every name).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from bench import _base_streams as B
from bench import _realspeech as R
from bench.common import row
from edge.detect import Detector, trigger
from edge.operating import stream_scores


class KerasVariant:
    """A trained build directory (``scripts/train_variant.py OUT``: model.keras, frontend.json) in
    the KeywordModel interface, so a variant is streamed exactly as the shipped model is."""

    def __init__(self, build_dir):
        from tensorflow import keras

        from host.data.words import LABELS, LABELS12

        build_dir = Path(build_dir)
        self.model = keras.models.load_model(build_dir / "model.keras")
        self.scale = np.asarray(json.loads((build_dir / "frontend.json").read_text())["scale"], np.float32)
        self.labels = list(LABELS)
        # the Detector reads which words to watch from a bundle's labels12: the ten commands
        self.bundle = SimpleNamespace(manifest={"extra": {"labels12": list(LABELS12)}})

    def infer(self, feats):
        emb, probs = self.model(np.asarray(feats, np.float32)[..., None], training=False)  # predict(): ~10x slower per call
        return np.asarray(emb), np.asarray(probs)


class Ensemble:
    """Several models as one, in the same interface: the mean of their posteriors, each model on its
    own input scale (``features.normalize`` divides by it, so rescaling the first model's input is
    exact); the embedding is the first model's. For judging whether averaging seeds or recipes helps
    at low false accepts (scripts/curve_variants.py ``a+b``); nothing ships one."""

    def __init__(self, members):
        first = members[0]
        if any(list(m.labels) != list(first.labels) for m in members):
            raise SystemExit("ensemble: its models name different labels; join models of one label set")
        self.members, self.scale, self.labels, self.bundle = members, first.scale, first.labels, first.bundle

    def infer(self, feats):
        outs = [m.infer(np.asarray(feats, np.float32) * (self.scale / m.scale)) for m in self.members]
        return outs[0][0], np.mean([probs for _, probs in outs], axis=0)


VARIANT_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9)


def curve(model, streams, dev, test, other, thresholds=VARIANT_THRESHOLDS) -> dict:
    """{threshold: recall per condition and false accepts per hour} for one model: each stream's
    first-stage scores once (``edge.operating.stream_scores``), then the Detector's trigger at every
    threshold (``edge.detect.trigger``, the Detector's events run for run: tests/test_detect.py)."""
    from bench.kws_base import summarise

    det = Detector(model)
    cached = {key: stream_scores(det, pcm)[:2] for key, (pcm, _, _) in streams.items()}
    halves = {}
    for half, prompts in (("dev", dev), ("test", test)):
        pcm, spans = R.concat(prompts)
        halves[half] = (*stream_scores(det, pcm)[:2], spans, prompts)
    oth = stream_scores(det, other[0])[:2] if other is not None else None
    out = {}
    for t in thresholds:
        res = {key: B.score_positives(trigger(*cached[key], t, det.names), spans, clips)
               for key, (_, spans, clips) in streams.items()}
        fa = {half: B.false_accepts(trigger(sc, ends, t, det.names), spans, prompts)
              for half, (sc, ends, spans, prompts) in halves.items()}
        out[t] = {"positives": summarise(res), "real": fa,
                  "other_fa_h": None if oth is None else len(trigger(*oth, t, det.names)) / other[1]}
    return out


def variant(build_dir, streams, dev, test, ours) -> list[dict]:
    """A variant beside the shipped model (fp32 both) at several thresholds, on the same streams:
    dev FA/h is for choosing, the test half and the other speakers for reporting."""
    from bench.kws_base import other_real_stream

    rows, other = [], other_real_stream()
    for name, model in (("shipped fp32", ours), (f"variant {Path(build_dir).name}", KerasVariant(build_dir))):
        for t, r in curve(model, streams, dev, test, other).items():
            pos = r["positives"]
            rows.append(row(f"{name} at {t:g}: Flite awb/rms/slt, clean", "streaming command recall (class-balanced)",
                            round(pos["clean"]["balanced"], 4), "fraction", "goal", 0.8, ratio=None,
                            at_20db=round(pos["20 dB"]["balanced"], 4), at_10db=round(pos["10 dB"]["balanced"], 4),
                            per_voice=pos["clean"]["per_voice"],
                            real_dev_fa_h=round(r["real"]["dev"]["fa_per_hour"], 2),
                            real_test_fa_h=round(r["real"]["test"]["fa_per_hour"], 2),
                            in_sentence_test=f"{r['real']['test']['in_sentence_found']}/{r['real']['test']['in_sentence_said']}",
                            other_real_fa_h=None if r["other_fa_h"] is None else round(r["other_fa_h"], 2),
                            other_real=None if other is None else f"{other[2]}, {other[1] * 60:.0f} min"))
    return rows
