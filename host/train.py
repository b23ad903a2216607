"""Train the DS-CNN keyword encoder on the synthetic corpus (``train``); ``edgelearn train``
(``host/commands/train.py``) runs it.

Augmentation is drawn fresh every epoch (:mod:`host.augment`) in a background
thread while Keras trains the previous epoch. The checkpoint with the best
validation accuracy is kept. Writes ``OUT/model.keras``, ``OUT/frontend.json``
(the per-coefficient feature scale), ``OUT/metrics.json`` and a training-curve
PNG.

    >>> train("build/kws", epochs=40)["metrics"]
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np


def feature_scale(clips: np.ndarray) -> list[float]:
    """Per-coefficient std of mean-removed MFCC over clips: the fixed input scale."""
    from edge import features as F

    f = F.mfcc(clips.astype(np.float32) / 32768.0)
    f = f - f.mean(axis=-2, keepdims=True)
    return [float(v) for v in np.maximum(f.reshape(-1, F.N_MFCC).std(0), 1e-3)]


def evaluate_model(predict, corpus, scale, synths_trained) -> dict:
    """Accuracy per split and per synthesizer, plus few-shot separability."""
    from host.augment import features_for
    from host.evaluate import accuracy12, accuracy35, balanced12, command_recall, fewshot_accuracy

    out: dict = {}
    for split in ("val", "test", "unseen"):
        try:
            x, y, voices = corpus.eval_clips(split)
        except ValueError:
            continue
        emb, probs = predict(features_for(x, scale))
        synth_of = np.array([v.split(":")[0] for v in voices])
        row = {"acc12": accuracy12(probs, y), "bal12": balanced12(probs, y), "cmd": command_recall(probs, y),
               "acc35": accuracy35(probs, y), "n": int(len(y))}
        for s in sorted(set(synth_of) - {"noise"}):
            m = (synth_of == s) | (synth_of == "noise")
            row[f"acc12_{s}"] = accuracy12(probs[m], y[m])
            row[f"bal12_{s}"] = balanced12(probs[m], y[m])
            row[f"cmd_{s}"] = command_recall(probs[m], y[m])
        out[split] = row
    x, phrase, _voices = corpus.custom_clips(("test", "unseen"))
    emb, _ = predict(features_for(x, scale))
    out["fewshot5_custom_phrases"] = fewshot_accuracy(emb, phrase, shots=5)
    out["fewshot_n_phrases"] = int(len(np.unique(phrase)))
    out["synths_trained"] = list(synths_trained)
    return out


def train(out, epochs=40, batch=128, lr=3e-3, seed=0, synths=("espeak", "festival"),
          max_minutes=28.0, threads=2, corpus=None, progress=True, build=None, distill=None) -> dict:
    """Train and evaluate; ``build(num_classes) -> keras.Model`` picks the architecture.

    The model must have outputs ``[embedding, probs]`` (see host.model.build_dscnn,
    the default). Returns {"model", "scale", "metrics", "history"}.

    ``distill`` (an experiment, scripts/train_variant.py ``--distill``): {"targets": fn(utterances)
    -> (N, D) float32 teacher embeddings of the clean utterances, "weight": w}. A linear map of the
    embedding (trained with the model, not saved) is fitted to the standardised targets by mean
    squared error, weighted w beside the cross-entropy; silence examples are left out of it.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from tensorflow import keras

    from host.augment import Augmenter, features_for
    from host.data.corpus import build_corpus
    from host.data.words import LABELS, SILENCE
    from host.model import build_dscnn, count_macs

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    corpus = corpus or build_corpus(progress=progress)
    tr = corpus.select("train", synths=synths)
    if tr.size == 0:
        from edge.errors import EdgelearnError

        raise EdgelearnError(f"no training utterances for synthesizers {', '.join(synths)}",
                             fix="choose from espeak, festival (Flite is kept for evaluation only)")
    utts = [corpus.utterance(i) for i in tr]
    labels = np.array([corpus.label_of(i) for i in tr])
    pool = [corpus.utterance(i) for i in corpus.select("train", kinds=("filler",), synths=synths)]
    rng = np.random.default_rng(seed)
    from host.data import noise as N
    sample = rng.choice(len(utts), min(2000, len(utts)), replace=False)
    scale = feature_scale(np.stack([N.place(rng, utts[i]) for i in sample]))
    xv, yv, _ = corpus.eval_clips("val", synths=None)
    fv = features_for(xv, scale)[..., None]

    model = (build or build_dscnn)(len(LABELS))
    aug = Augmenter(utts, labels, pool, scale, LABELS.index(SILENCE), seed=seed)
    steps_per_epoch = int(np.ceil((len(utts) + aug.n_sil) / batch))
    sched = keras.optimizers.schedules.CosineDecay(lr, steps_per_epoch * epochs, alpha=0.02)
    ce = keras.losses.CategoricalCrossentropy(label_smoothing=0.1)
    if distill is None:
        train_model = keras.Model(model.input, model.outputs[1])
        train_model.compile(optimizer=keras.optimizers.Adam(sched), loss=ce, metrics=["accuracy"])
    else:
        t = np.asarray(distill["targets"](utts), np.float32)
        t = (t - t.mean(0)) / (t.std(0) + 1e-6)
        teacher = np.concatenate([t, np.zeros((aug.n_sil, t.shape[1]), np.float32)])
        keep = np.concatenate([np.ones(len(utts), np.float32), np.zeros(aug.n_sil, np.float32)])
        proj = keras.layers.Dense(t.shape[1], name="distill")(model.outputs[0])
        train_model = keras.Model(model.input, [model.outputs[1], proj])
        train_model.compile(optimizer=keras.optimizers.Adam(sched), loss=[ce, "mse"],
                            loss_weights=[1.0, float(distill.get("weight", 1.0))],
                            metrics=[["accuracy"], []])
    from host.evaluate import accuracy12

    nxt: dict = {}

    def prefetch():
        nxt["data"] = aug.epoch() if distill is None else aug.epoch(rows=True)

    th = threading.Thread(target=prefetch)
    th.start()
    history, best, best_w, t0 = [], -1.0, None, time.time()
    for ep in range(epochs):
        th.join()
        x, y, *src = nxt.pop("data")
        th = threading.Thread(target=prefetch)
        th.start()
        onehot = keras.utils.to_categorical(y, len(LABELS))
        if distill is None:
            h = train_model.fit(x[..., None], onehot, batch_size=batch, epochs=1, verbose=0)
        else:  # the silence rows' teacher term weighs 0
            h = train_model.fit(x[..., None], [onehot, teacher[src[0]]], batch_size=batch, epochs=1, verbose=0,
                                sample_weight=[np.ones(len(y), np.float32), keep[src[0]]])
        probs = model.predict(fv, batch_size=1024, verbose=0)[1]
        acc = accuracy12(probs, yv)
        hist = {k: float(v[0]) for k, v in h.history.items()}
        history.append({"epoch": ep + 1, "loss": hist["loss"],
                        "train_acc": next(v for k, v in hist.items() if k.endswith("accuracy")), "val_acc12": acc,
                        "minutes": (time.time() - t0) / 60,
                        **({"distill_loss": next((v for k, v in hist.items() if k.startswith("distill")), None)}
                           if distill is not None else {})})
        if acc > best:
            best, best_w = acc, model.get_weights()
        if progress:
            sys.stderr.write(f"epoch {ep + 1}/{epochs}: loss {history[-1]['loss']:.3f} "
                             f"train {history[-1]['train_acc']:.3f} val12 {acc:.4f} "
                             f"({history[-1]['minutes']:.1f} min)\n")
        if (time.time() - t0) / 60 > max_minutes:
            sys.stderr.write(f"stopping: {max_minutes} min budget reached\n")
            break
    th.join()
    model.set_weights(best_w)
    train_minutes = (time.time() - t0) / 60

    def predict(feats):
        emb, probs = model.predict(feats[..., None], batch_size=1024, verbose=0)
        return emb, probs

    metrics = evaluate_model(predict, corpus, scale, synths)
    metrics.update({"params": int(model.count_params()), "macs": count_macs(model),
                    "epochs_run": len(history), "train_minutes": round(train_minutes, 2),
                    "best_val_acc12": best, "train_utterances": int(len(utts)),
                    "corpus_seed": corpus.config.get("seed", 0)})
    model.save(out / "model.keras")
    (out / "frontend.json").write_text(json.dumps({"scale": scale}, indent=1))
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    (out / "history.json").write_text(json.dumps(history, indent=1))
    plot_history(history, out / "training.png")
    return {"model": model, "scale": scale, "metrics": metrics, "history": history}


def plot_history(history, path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    ep = [h["epoch"] for h in history]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.2))
    ax[0].plot(ep, [h["loss"] for h in history])
    ax[0].set(xlabel="epoch", ylabel="training loss")
    ax[1].plot(ep, [h["train_acc"] for h in history], label="train (37-way, augmented)")
    ax[1].plot(ep, [h["val_acc12"] for h in history], label="val (12-class)")
    ax[1].set(xlabel="epoch", ylabel="accuracy", ylim=(0, 1))
    ax[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
