"""scripts/curve_variants.py: models compared at matched false accepts on development data.

The comparison is only as good as its bookkeeping: each operating point's recall must be the
Detector's trigger on the positive streams, its false accepts the events on development prompts
that do not say the word, a calibrated point must come from the negative streams alone, and the
matched comparison must pick the best point inside each budget. A stand-in first stage (fixed
scores per stream) makes every figure known in advance.
"""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from bench import _base_streams as B
from bench import _realspeech as R
from host.data.words import COMMANDS10, LABELS, LABELS12

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("curve_variants", ROOT / "scripts" / "curve_variants.py")
cv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cv)

HOP = 0.04


def bump(seconds, at, height, word="yes"):
    """Scores (T, 10) that are 0 but for ``word`` at ``height`` around ``at`` s, and their ends."""
    t = np.arange(int(seconds / HOP)) * HOP
    sc = np.zeros((len(t), len(COMMANDS10)), np.float32)
    if at is not None:
        sc[np.abs(t - at) < 0.15, COMMANDS10.index(word)] = height
    return sc, np.stack([t, t], axis=1)


def test_points_recall_false_accepts_calibration_and_matched_budgets(monkeypatch):
    import edge.operating

    clip = B.Clip("awb", "yes", np.zeros(8000, np.int16))
    pos_pcm = np.zeros(3 * 16000, np.int16)
    streams = {(v, snr): (pos_pcm, [(1.0, 1.5)], [clip]) for v in B.VOICES for snr in B.SNRS}
    # the development half: a prompt that does not say "yes" but scores 0.6 for it, and one that says it
    dev = [R.Prompt("p1", "yesterday", ("yesterday",), "dev", np.zeros(16000 * 10, np.float32)),
           R.Prompt("p2", "yes", ("yes",), "dev", np.zeros(16000 * 10, np.float32))]
    dev_len = len(R.concat(dev)[0])
    syn = np.zeros(16000 * 20, np.int16)
    foreign = (np.zeros(16000 * 30, np.int16), 30 / 3600, "fr+it")   # "no" at 0.65 once
    others = (np.zeros(16000 * 25, np.int16), 25 / 3600, "es-co")    # "go" at 0.75 once: every event false
    fixed = {len(pos_pcm): bump(3, 1.2, 0.8), dev_len: bump(20.5, 5.0, 0.6), len(syn): bump(20, None, 0),
             len(foreign[0]): bump(30, 7.0, 0.65, "no"), len(others[0]): bump(25, 9.0, 0.75, "go")}
    # the second dev prompt says "yes" at 0.95: never a false accept
    fixed[dev_len][0][np.abs(fixed[dev_len][1][:, 0] - 15.0) < 0.15, 0] = 0.95

    def scores(det, audio, *a, **k):
        sc, ends = fixed[len(audio)]
        return sc, ends, len(audio) / 16000 / 3600

    monkeypatch.setattr(edge.operating, "stream_scores", scores)
    monkeypatch.setattr("bench.kws_base.stream_scores", scores)
    model = SimpleNamespace(labels=list(LABELS), bundle=SimpleNamespace(manifest={"extra": {"labels12": list(LABELS12)}}))
    pts = cv.model_curve(model, streams, dev, syn, (0.5, 0.7, 0.9), (1.0,), foreign, others)
    by = {p["point"]: p for p in pts}
    dev_hours = R.concat(dev)[1][-1][1] / 3600  # to the end of the last prompt, as bench kws_base counts
    assert by["0.5"]["recall"] == {"clean": 1.0, "20 dB": 1.0, "10 dB": 1.0}
    assert by["0.5"]["dev_fa_h"] == round(1 / dev_hours, 2)       # "yesterday", not "yes"
    assert by["0.5"]["foreign_fa_h"] == 120.0                        # one event in 30 s
    assert by["0.5"]["others_fa_h"] == 144.0                         # one event in 25 s
    assert by["0.5"]["real_fa_h"] == round(2 / (dev_hours + others[1]), 2)  # both real streams as one
    assert by["0.7"]["recall"]["clean"] == 1.0 and by["0.7"]["dev_fa_h"] == 0.0
    assert by["0.7"]["foreign_fa_h"] == 0.0
    assert by["0.7"]["real_fa_h"] == round(1 / (dev_hours + others[1]), 2)  # "go" by the other speaker
    assert by["0.9"]["recall"]["clean"] == 0.0 and by["0.9"]["synthetic_fa_h"] == 0.0
    cal = by["calibrated 1 FA/h"]
    assert 0.6 < cal["thresholds"]["yes"] <= 0.8                   # above the false accept, under the hit
    assert cal["thresholds"]["go"] > 0.75                          # the other speakers calibrate too
    assert cal["recall"]["clean"] == 1.0 and cal["real_fa_h"] == 0.0
    best = cv.best_at(pts, (0.0, 1e6))                             # budgets are on real_fa_h
    assert best["0"]["point"] == "calibrated 1 FA/h" and best["0"]["recall"]["clean"] == 1.0
    assert best["1e+06"]["recall"]["clean"] == 1.0
    assert cv.best_at([by["0.5"]], (1.0,)) == {"1": None}           # nothing inside the budget
    # the English half held to its own budget: 0.5 fires on "yesterday" there, so a wide pooled budget
    # alone takes it, with --english-max 0 the best point without that false accept
    assert cv.best_at(pts, (1e6,))["1e+06"]["point"] == "0.5"
    assert cv.best_at(pts, (1e6,), english_max=0.0)["1e+06"]["point"] == "0.7"


def test_bad_arguments_are_one_sentence(tmp_path, capsys):
    for argv in (["shipped", "--thresholds", "0.7,1.2"], ["shipped", "--targets", "x"],
                 ["shipped", "--budgets", "-1"], ["shipped", "--english-max", "-2"],
                 ["shipped", "--english-max", "many"], [str(tmp_path)]):
        with pytest.raises(SystemExit) as e:
            cv.main(argv)
        msg = str(e.value)
        assert msg.startswith("curve_variants: ") and msg.replace("e.g.", "eg").count(". ") == 0 and "\n" not in msg
    assert cv.floats("0.6,0.7", "--thresholds", 0.0, 1.0, "0.6") == (0.6, 0.7)


def test_an_ensemble_averages_posteriors_each_on_its_own_scale():
    """``a+b``: the mean of the members' posteriors; each member sees its own normalisation (features
    are divided by the scale, so multiplying the first member's input by scale0 / scale_i is exact)."""
    from bench.kws_base import Ensemble

    class Member:
        def __init__(self, scale, k, labels=LABELS):
            self.scale, self.k, self.labels = np.asarray(scale, np.float32), k, list(labels)
            self.bundle = SimpleNamespace(manifest={"extra": {"labels12": list(LABELS12)}})
            self.seen = None

        def infer(self, feats):
            self.seen = feats
            probs = np.zeros((len(feats), len(self.labels)), np.float32)
            probs[:, self.k] = 1.0
            return np.full((len(feats), 4), self.k, np.float32), probs

    a, b = Member([2.0, 4.0], 0), Member([1.0, 8.0], 3)
    ens = Ensemble([a, b])
    raw = np.asarray([[[6.0, 8.0]]], np.float32)          # (1 window, 1 frame, 2 coefficients), unscaled
    emb, probs = ens.infer(raw / a.scale)                   # the Detector normalises with ens.scale (a's)
    np.testing.assert_allclose(a.seen, raw / a.scale)
    np.testing.assert_allclose(b.seen, raw / b.scale, rtol=1e-6)  # as if b had been given its own input
    assert probs[0, 0] == probs[0, 3] == 0.5 and probs.sum() == 1.0
    assert emb[0, 0] == 0                                   # the first member's embedding
    with pytest.raises(SystemExit, match="^ensemble: its models name different labels"):
        Ensemble([a, Member([1.0, 1.0], 0, labels=list(reversed(LABELS)))])
