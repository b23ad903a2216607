"""A frame-level phone model for the custom-keyword verifier (issue 4).

Why: the verifier (``edge/verify.py``) compares a candidate window with the enrolment clips
step by step. The backbone's features were trained to name 35 words and the MFCC frames move
with noise, so one wrong phoneme ("bandana" for "banana", "commuter" for "computer") moves the
mean distance little. Query-by-example spoken term detection has long matched *phone
posteriorgrams* instead (Hazen et al. 2009; Zhang & Glass 2009): a per-frame distribution over
phones, trained to ignore the voice and the noise and to keep what was said. This module trains
one on the corpus's training voices alone and exports it int8; the verifier (entry version 5)
adds its posteriors to every step.

Corpus: ``host/data/phone_words.txt`` (8,000 frequent English words, none that the
``kws_fewshot`` bench speaks, see ``scripts/phone_words.py``) plus 2,000 two-word phrases drawn
from its 2,000 most frequent, each rendered by three of the corpus's *training-split* espeak-ng
voices and, for every other text, one of its training Festival voices (rate and pitch drawn as
the corpus draws them). Labels are espeak-ng's own phonemes for the voice's accent
(``espeak-ng -x --sep=_``; Festival renders get en-us), stress marks dropped and allophones
folded (``PHONE_MAP``); phones seen fewer than ``MIN_COUNT`` times are left out. No alignment is
needed: the model is trained with CTC.

Model: the bundle's front end (49 normalised MFCC frames per 1 s window), four 1-D
convolutions over time (dilations 1, 2, 4, 1; receptive field 31 frames), batch norm, ReLU,
spatial dropout, a 1x1 convolution to the phones and the CTC blank. The exported model's
output is the softmax over the phones *without* the blank at every frame: CTC posteriors
are peaky (the blank wins most frames), which a frame-by-frame distance cannot use.

    $ edgelearn model ...            # runs this as one step (``train_phones``)
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from edge.atomic import atomic_file, atomic_write

WORDS_FILE = Path(__file__).parent / "data" / "phone_words.txt"
N_PAIRS, PAIR_POOL = 2000, 2000
ESPEAK_RENDERS, FESTIVAL_SHARE = 3, 0.5
MIN_COUNT = 30
# espeak-ng allophones and variants folded into one phone each; ";" (palatalised) dropped.
PHONE_MAP = {"@-": "@", "r-": "r", "i@3": "i@", "O2": "O:", "aI2": "aI", "t#": "t", "t2": "t",
             "t[": "t", "I#": "I", "I2": "I", "a#": "a", ";": None}
CHANNELS, EPOCHS, COPIES = 96, 15, 2
CORPUS_FORMAT = 1


def texts(seed: int = 0) -> list[str]:
    words = WORDS_FILE.read_text().split()
    rng = np.random.default_rng(seed)
    pairs = [f"{words[i]} {words[j]}" for i, j in rng.integers(0, min(PAIR_POOL, len(words)), (N_PAIRS, 2))]
    return words + pairs


def phonemise(voice: str, items: list[str]) -> list[list[str]]:
    """espeak-ng's phonemes for each text in ``voice`` (an espeak-ng voice name), folded."""
    out = subprocess.run(["espeak-ng", "-q", "-x", "--sep=_", "-v", voice],
                         input="\n\n".join(t + "." for t in items), capture_output=True, text=True,
                         check=True, timeout=600).stdout
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    if len(lines) != len(items):
        raise RuntimeError(f"espeak-ng gave {len(lines)} phoneme lines for {len(items)} texts ({voice})")
    res = []
    for line in lines:
        toks = (re.sub(r"[',]", "", p) for p in re.split(r"[_ ]+", line))
        res.append([PHONE_MAP.get(t, t) for t in toks if t and PHONE_MAP.get(t, t)])
    return res


def render_corpus(cache_dir: Path, seed: int = 0) -> dict:
    """{"audio": int16 concatenated, "offsets", "labels": phone strings, "text": text index}, cached."""
    from host.data import synth
    from host.data.corpus import CorpusConfig, assign_splits

    all_t = texts(seed)
    key = hashlib.sha256(json.dumps([CORPUS_FORMAT, seed, all_t, ESPEAK_RENDERS, FESTIVAL_SHARE])
                         .encode()).hexdigest()[:12]
    path = Path(cache_dir) / f"phones-{key}.npz"
    if path.exists():
        with np.load(path) as d:
            return {k: d[k] for k in d.files}
    synth.check_installed({"espeak", "festival"})  # one clear sentence, not a subprocess traceback
    voices = synth.all_voices()
    split = assign_splits(voices, CorpusConfig())
    esp = [v for v in voices if split[v.id] == "train" and v.synth == "espeak"]
    fes = [v for v in voices if split[v.id] == "train" and v.synth == "festival"]
    rng = np.random.default_rng(seed)
    jobs = []
    for i, t in enumerate(all_t):
        chosen = [esp[k] for k in rng.choice(len(esp), ESPEAK_RENDERS, replace=False)]
        if fes and rng.random() < FESTIVAL_SHARE:
            chosen.append(fes[int(rng.integers(len(fes)))])
        for k, v in enumerate(chosen):
            jobs.append((v, t, float(rng.uniform(0.8, 1.25)), float(rng.uniform(0.8, 1.25)), f"{i}|{v.id}|{k}"))
    audio = synth.render_jobs(jobs, "phone corpus")
    accent = {v.id: (v.name.split("+")[0] if v.synth == "espeak" else "en-us") for v, *_ in jobs}
    phones = {a: phonemise(a, all_t) for a in sorted(set(accent.values()))}
    keys = sorted(audio, key=lambda k: (int(k.split("|")[0]), k))
    pcm = [audio[k] for k in keys]
    out = {"audio": np.concatenate(pcm).astype(np.int16),
           "offsets": np.concatenate([[0], np.cumsum([len(x) for x in pcm])]).astype(np.int64),
           "labels": np.array([" ".join(phones[accent[k.split("|")[1]]][int(k.split("|")[0])]) for k in keys]),
           "text": np.array([int(k.split("|")[0]) for k in keys], np.int32)}
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, mode=None) as f:
        np.savez(f, **out)
    return out


def inventory(labels) -> list[str]:
    counts = Counter(t for line in labels for t in str(line).split())
    return sorted(t for t, c in counts.items() if c >= MIN_COUNT)


def examples(corpus: dict, phones: list[str], scale, rng, copies: int, held_texts: np.ndarray):
    """Augmented 1 s windows -> (normalised features, labels padded with -1, held-out mask)."""
    from scipy.signal import fftconvolve

    from edge import features as F
    from host.data.noise import coloured_noise, mix_at_snr, room_impulse

    idx = {p: i for i, p in enumerate(phones)}
    audio, off = corpus["audio"], corpus["offsets"]
    xs, ys, held = [], [], []
    for i, line in enumerate(corpus["labels"]):
        u = audio[off[i]:off[i + 1]].astype(np.float32)
        lab = [idx[t] for t in str(line).split() if t in idx]
        if len(u) > 15200 or not lab or len(lab) > 30:
            continue
        h = bool(np.isin(corpus["text"][i], held_texts))
        for _ in range(1 if h else copies):
            x = np.zeros(16000, np.float32)
            s = int(rng.integers(0, 16000 - len(u) + 1))
            x[s:s + len(u)] = u * np.float32(rng.uniform(0.3, 1.5))
            if rng.random() < 0.25:
                x = fftconvolve(x, room_impulse(rng, float(rng.uniform(0.2, 0.7))))[:16000].astype(np.float32)
            if rng.random() < 0.8:
                noise = coloured_noise(rng, str(rng.choice(["white", "pink", "brown"])), (16000,))
                x = mix_at_snr(x, noise, float(rng.uniform(0, 35)))
            xs.append(np.clip(x, -32768, 32767).astype(np.int16))
            ys.append(lab)
            held.append(h)
    x = np.asarray(xs)
    feats = np.concatenate([F.normalize(F.mfcc(x[a:a + 2000]), scale) for a in range(0, len(x), 2000)])
    y = np.full((len(ys), max(len(v) for v in ys)), -1, np.int32)
    for i, v in enumerate(ys):
        y[i, :len(v)] = v
    return feats.astype(np.float32), y, np.asarray(held)


def build(n_phones: int, channels: int = CHANNELS, dropout: float = 0.1):
    from tensorflow import keras

    from edge import features as F

    inp = keras.Input((F.N_FRAMES, F.N_MFCC), name="features")
    x = inp
    for k, dil in ((5, 1), (5, 2), (5, 4), (3, 1)):
        x = keras.layers.Conv1D(channels, k, dilation_rate=dil, padding="same", use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.ReLU()(x)
        x = keras.layers.SpatialDropout1D(dropout)(x)
    return keras.Model(inp, keras.layers.Conv1D(n_phones + 1, 1, name="logits")(x))


def ctc_loss(n_phones: int):
    import tensorflow as tf

    from edge import features as F

    def loss(y, logits):
        y = tf.cast(y, tf.int32)
        lengths = tf.reduce_sum(tf.cast(y >= 0, tf.int32), 1)
        return tf.reduce_mean(tf.nn.ctc_loss(tf.maximum(y, 0), logits, lengths,
                                             tf.fill([tf.shape(logits)[0]], F.N_FRAMES),
                                             logits_time_major=False, blank_index=n_phones))
    return loss


def phone_error_rate(logits: np.ndarray, labels: np.ndarray) -> float:
    """Greedy CTC decoding against the references: edit distance / reference length."""
    n_blank = logits.shape[-1] - 1
    errors = total = 0
    for lg, ref in zip(logits, labels):
        best = lg.argmax(-1)
        hyp = [int(p) for k, p in enumerate(best) if p != n_blank and (k == 0 or p != best[k - 1])]
        ref = [int(p) for p in ref if p >= 0]
        errors += _edit_distance(ref, hyp)
        total += len(ref)
    return errors / max(total, 1)


def _edit_distance(a: list, b: list) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def export_int8(model, calib: np.ndarray, path: Path) -> None:
    """int8 TFLite: features (N, 49, 10) int8 -> softmax over the non-blank phones, int8."""
    import tensorflow as tf

    keras = tf.keras
    inp = keras.Input(model.input_shape[1:], name="features")
    logits = model(inp, training=False)
    out = keras.layers.Softmax(name="phones")(logits[..., :-1])
    wrapped = keras.Model(inp, out)
    conv = tf.lite.TFLiteConverter.from_keras_model(wrapped)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([calib[i:i + 1]] for i in range(len(calib)))
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = tf.int8
    conv.inference_output_type = tf.int8
    atomic_write(path, conv.convert(), mode=None)


def train_phones(work: Path, scale, cache_dir: Path, epochs: int = EPOCHS, seed: int = 0) -> dict:
    """Render (cached), train, export ``work/phones_int8.tflite``; returns the metrics it also writes."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(seed)
    corpus = render_corpus(cache_dir, seed)
    phones = inventory(corpus["labels"])
    rng = np.random.default_rng(seed)
    n_texts = int(corpus["text"].max()) + 1
    held_texts = rng.choice(n_texts, n_texts // 20, replace=False)
    feats, labels, held = examples(corpus, phones, scale, rng, COPIES, held_texts)
    sys.stderr.write(f"phones: {len(phones)} phones, {int((~held).sum())} training windows, "
                     f"{int(held.sum())} held-out (words never trained on)\n")
    model = build(len(phones))
    steps = epochs * (int((~held).sum()) // 64 + 1)
    model.compile(tf.keras.optimizers.Adam(tf.keras.optimizers.schedules.CosineDecay(2e-3, steps)),
                  ctc_loss(len(phones)))
    best = work / "phones_best.weights.h5"
    model.fit(feats[~held], labels[~held], batch_size=64, epochs=epochs, verbose=2,
              validation_data=(feats[held], labels[held]),
              callbacks=[tf.keras.callbacks.ModelCheckpoint(str(best), save_best_only=True,
                                                            save_weights_only=True)])
    model.load_weights(str(best))
    model.save(work / "phones.keras")
    calib = feats[~held][rng.choice(int((~held).sum()), 400, replace=False)]
    export_int8(model, calib, work / "phones_int8.tflite")
    metrics = {"phones": phones, "per_heldout_words": phone_error_rate(model.predict(feats[held], verbose=0),
                                                                       labels[held]),
               "train_windows": int((~held).sum()), "heldout_windows": int(held.sum()),
               "texts": n_texts, "epochs": epochs, "bytes": (work / "phones_int8.tflite").stat().st_size}
    (work / "phones_metrics.json").write_text(json.dumps(metrics, indent=1))
    return metrics
