"""Export a custom wake word for ESPHome's ``micro_wake_word``: a streaming int8 TFLite model and
its v2 JSON manifest, trained on the host's CPU from the synthetic corpus plus the user's clips.

The format is the one microWakeWord's released models have (checked against ``okay_nabu`` and
``hey_jarvis`` as ``pymicro-wakeword`` ships them): int8 input ``[1, STRIDE, 40]`` of the TFLite
Micro front end's features (``host/export/frontend.py``, input scale 26/255, zero point -128),
uint8 output ``[1, 1]`` (scale 1/256), the streaming state in resource variables (``VAR_HANDLE``,
``READ_VARIABLE``, ``ASSIGN_VARIABLE``, initialised by ``CALL_ONCE``), and only ops ESPHome's
``StreamingModel::register_streaming_ops_`` registers (``MWW_OPS``).

The network: a strided convolution (5 frames, stride 3, 40 -> 64 channels) and four depthwise
separable blocks (9-tap depthwise over time, 1x1 to 64, ReLU), then one logistic unit: ~32 k int8
weights, a receptive field of ``WINDOW`` = 101 frames (1.03 s). It is trained non-streaming on
101-frame windows; the streaming model keeps, per layer, the frames its kernel still needs in a
resource variable and computes one new output per stride (equal to the non-streaming model on the
window ending there; ``tests/test_export_esphome.py``).

Training data (``build_training_set``): positives are the phrase rendered by the corpus's training
voices (espeak-ng, 4 renders each, and Festival, 30 each with pitch up to 1.4 for higher voices) and
the user's clips (20 augmented copies each), each placed after a second of background, sped up or
slowed down, reverberated, at random level and 5-30 dB of noise or babble; windows end 0-250 ms
after the phrase. Negatives: the same renders cut off halfway through (so it fires only on the whole
phrase) and scrambled or reversed (the positives' own voice and channel without their content: the
user's clips are the only recordings of that voice), runs of the corpus's training-split words
(commands, fillers, other custom phrases), espeak-ng sentences of those words (continuous speech),
near misses of the phrase (each word alone, a word swapped for a filler), and noise alone. After
training, fresh runs and sentences of the training voices are scored and the windows above
``mine_min`` join the set for a short fine-tune (hard negatives). The cutoff is chosen on the
corpus's validation voices (never on a benchmark's): the highest sliding-window mean on their
speech plus 0.05, within 0.9-0.97 (the model's outputs are confident: a high cutoff costs little
recall, and synthetic validation speech understates real false accepts). About 4 CPU minutes in all on one x86 core.
Two more sources of negatives are options, off by default because they cost recall on development
data (docs/edge-runtime.md, "ESPHome"): other speakers' real prompts from Debian (``real_speech``)
and voices outside the corpus saying the phrase and its words (``other_voices``); a third, the
user's clips with their halves swapped (``user_swapped``), is off here and on in ``export voices``.

Here: the model, its training, the manifest and the recipe (``export_esphome``); the streaming
conversion and the format checks are in ``host/export/esphome_tflite.py``, the training data is
built in ``host/export/esphome_data.py`` (each context's audio in ``esphome_audio.py``), and the
format's constants and ``ExportConfig`` are in ``host/export/esphome_config.py`` (all importable
from here too).

    >>> res = export_esphome("hey jarvis", ["a.wav", "b.wav", ...], "out/")
    >>> res.model_path, res.manifest["micro"]["probability_cutoff"]
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edge.errors import EdgelearnError
from host.export import frontend as FE
# the format, the geometry and the recipe's knobs (host/export/esphome_config.py), the training data
# (host/export/esphome_data.py), each context's audio (esphome_audio.py) and the streaming conversion
# and format checks (esphome_tflite.py) have modules of their own; every name stays importable from here
from host.export.esphome_config import (  # noqa: F401 (those not used here: re-exported)
    CHANNELS, DW_K, FEATURE_STEP_MS, IN_SCALE, K1, MANIFEST_VERSION, MIN_CLIPS, MINIMUM_ESPHOME_VERSION, MWW_OPS,
    N_BLOCKS, SLIDING_WINDOW, STREAMING_OPS, STRIDE, WINDOW, ExportConfig, _say)
from host.export.esphome_audio import _floor, scrambled, swapped, telephone_band, utt_speech_end  # noqa: F401
from host.export.esphome_data import (  # noqa: F401 (those not called here: re-exported)
    _training_voices, _vocab, build_training_set, mine_negatives, other_voices, real_speech, render_phrase)
from host.export.esphome_tflite import (  # noqa: F401 (those not called here: re-exported)
    arena_for, check_format, convert, run_tflm, streaming_module, tflite_info)


@dataclass
class ExportResult:
    model_path: Path
    manifest_path: Path
    manifest: dict
    model_bytes: int
    arena_bytes: int          # smallest arena TFLite Micro ran it in
    ops: list
    train_cpu_s: float        # CPU seconds of the whole recipe (data, training, conversion)
    n_windows: dict
    keras_model: object = field(default=None, repr=False)   # the float, non-streaming model it came from


def slug(phrase: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "_", phrase.lower()).strip("_")
    if not s:
        raise EdgelearnError(f"keyword {phrase!r} has no letters or digits", fix="pass --keyword \"hey edge\"")
    return s


# ----------------------------------------------------------------------------- user clips

def read_clips(paths) -> list[np.ndarray]:
    """The user's WAVs (16 kHz mono 16-bit, 0.2-4 s each), trimmed of silence; at least MIN_CLIPS."""
    from edge.audio import read_wav
    from host.data.synth import trim

    paths = [Path(p) for p in paths]
    if len(paths) < MIN_CLIPS:
        raise EdgelearnError(f"{len(paths)} clip(s) of the phrase given, {MIN_CLIPS} or more are needed",
                             fix=f"record the phrase {MIN_CLIPS} times or more and pass them all: --wav a.wav b.wav ...")
    out = []
    for p in paths:
        pcm = read_wav(p, min_samples=FE.SAMPLE_RATE // 5, max_samples=4 * FE.SAMPLE_RATE)
        t = trim(pcm.astype(np.float32))
        if t.size < FE.SAMPLE_RATE // 10 or float(np.abs(t).max()) < 30:
            raise EdgelearnError(f"{p}: no speech found (silent or nearly so)",
                                 fix="record the phrase again, closer to the microphone")
        out.append(t.astype(np.float32))
    return out


# ----------------------------------------------------------------------------- model

def build_model():
    """The non-streaming Keras model: (B, T, 1, 40) features -> (B, (T - WINDOW) // STRIDE + 1, 1) logits."""
    import tensorflow as tf

    L = tf.keras.layers
    inp = L.Input((None, 1, FE.CHANNELS))
    x = L.Rescaling(IN_SCALE)(inp)
    x = L.Conv2D(CHANNELS, (K1, 1), strides=(STRIDE, 1), activation="relu", name="conv1")(x)
    for i in range(N_BLOCKS):
        x = L.DepthwiseConv2D((DW_K, 1), name=f"dw{i}")(x)
        x = L.Conv2D(CHANNELS, 1, activation="relu", name=f"pw{i}")(x)
    x = L.Reshape((-1, CHANNELS))(x)
    out = L.Dense(1, name="head")(x)
    return tf.keras.Model(inp, out)


def train_model(X: np.ndarray, y: np.ndarray, cfg: ExportConfig, model=None, epochs: int | None = None,
                lr: float | None = None):
    """Train (or, given ``model``, fine-tune) on windows X (N, WINDOW, 40) with labels y."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(cfg.seed)
    model = model or build_model()
    epochs = cfg.epochs if epochs is None else epochs
    steps = max(1, int(np.ceil(len(X) / cfg.batch))) * epochs
    sched = tf.keras.optimizers.schedules.CosineDecay(cfg.lr if lr is None else lr, steps, alpha=0.05)
    model.compile(optimizer=tf.keras.optimizers.Adam(sched),
                  loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
    pos = max(float(y.sum()), 1.0)
    neg = max(float(len(y) - y.sum()), 1.0)
    w = np.where(y > 0.5, 0.35 * len(y) / pos, 0.65 * len(y) / neg).astype(np.float32)
    model.fit(X[:, :, None, :], y[:, None, None], sample_weight=w, batch_size=cfg.batch,
              epochs=epochs, shuffle=True, verbose=0)
    return model


def stream_probabilities(model, feats: np.ndarray) -> np.ndarray:
    """The non-streaming model over a whole feature sequence, one probability per stride, aligned
    as the streaming model's calls (output k: the window ending at frame STRIDE * k + STRIDE - 1);
    calls before the first full window are 0."""
    pad = np.concatenate([np.zeros((K1 - STRIDE, FE.CHANNELS), np.float32), feats], 0)
    n_calls = len(feats) // STRIDE
    out = np.zeros(n_calls, np.float32)
    if len(pad) < WINDOW:
        return out
    logits = model.predict(pad[None, :, None, :], verbose=0)[0, :, 0]
    p = 1.0 / (1.0 + np.exp(-logits))
    first = (WINDOW - K1) // STRIDE
    m = min(len(p), n_calls - first)
    out[first:first + m] = p[:m]
    return out


def choose_cutoff(model, corpus, cfg: ExportConfig, voices_split: str = "val") -> float:
    """The cutoff from the corpus's validation voices' speech: above their highest sliding-window
    mean by a margin, within cfg.cutoff_range (the midpoint when there is no corpus)."""
    lo, hi = cfg.cutoff_range
    if corpus is None:
        return round((lo + hi) / 2, 2)
    rng = np.random.default_rng([cfg.seed, 3])
    idx = corpus.select(voices_split, kinds=("keyword", "filler", "custom"))
    if len(idx) == 0:
        return round((lo + hi) / 2, 2)
    order = rng.permutation(idx)
    parts = []
    for i in order:
        parts += [corpus.utterance(i).astype(np.float32), np.zeros(int(rng.uniform(0.05, 0.5) * FE.SAMPLE_RATE), np.float32)]
    pcm = np.concatenate(parts)
    pcm = np.clip(pcm + _floor(rng, len(pcm)), -32768, 32767).astype(np.int16)
    p = stream_probabilities(model, FE.features(pcm))
    k = cfg.sliding_window
    mean = np.convolve(p, np.ones(k) / k, mode="valid") if len(p) >= k else p
    top = float(mean.max()) if len(mean) else 0.0
    return float(np.clip(np.ceil((top + 0.05) * 100) / 100, lo, hi))


def manifest(phrase: str, model_file: str, cutoff: float, arena: int, cfg: ExportConfig) -> dict:
    """The v2 manifest, fields as microWakeWord's released models have them."""
    m = {"type": "micro", "wake_word": phrase.title(), "author": cfg.author}
    if cfg.website:
        m["website"] = cfg.website
    m.update({"model": model_file, "trained_languages": list(cfg.languages), "version": MANIFEST_VERSION,
              "micro": {"probability_cutoff": round(float(cutoff), 2), "sliding_window_size": int(cfg.sliding_window),
                        "feature_step_size": FEATURE_STEP_MS, "tensor_arena_size": int(arena),
                        "minimum_esphome_version": MINIMUM_ESPHOME_VERSION}})
    return m


def write_export(out_dir, phrase: str, data: bytes, cutoff: float, cfg: ExportConfig):
    """Write DIR/<slug>.tflite and DIR/<slug>.json (atomically); (model path, manifest path, manifest, arena)."""
    from edge.atomic import atomic_write

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = slug(phrase)
    mpath, jpath = out / f"{name}.tflite", out / f"{name}.json"
    atomic_write(mpath, data, mode=None)
    need, arena = arena_for(mpath)
    man = manifest(phrase, mpath.name, cutoff, arena, cfg)
    atomic_write(jpath, (json.dumps(man, indent=2) + "\n").encode(), mode=None)
    return mpath, jpath, man, need


def export_esphome(phrase: str, wavs, out_dir, cfg: ExportConfig | None = None, corpus="cached",
                   voices=None, clips=None, min_clips: int = MIN_CLIPS) -> ExportResult:
    """The whole recipe: read the clips, build the data, train, convert, check, write model + manifest.

    ``corpus``: "cached" (default) is the synthetic corpus (``edgelearn data synth``, rendered on
    first use), None trains on the clips and noise alone (tests); ``clips`` (int16/float arrays)
    may replace ``wavs``; ``min_clips``: 0 trains from the corpus's voices alone (the bundle's phrase
    models of the base commands, ``scripts/build_phrase_stage.py``)."""
    cfg = cfg or ExportConfig()
    phrase = " ".join(phrase.lower().split())
    slug(phrase)
    user = read_clips(wavs) if clips is None else [np.asarray(c, np.float32) for c in clips]
    if clips is not None and len(user) < min_clips:
        raise EdgelearnError(f"{len(user)} clip(s) of the phrase given, {min_clips} or more are needed")
    t_cpu = time.process_time()
    if isinstance(corpus, str):
        from host.data.corpus import build_corpus
        corpus = build_corpus(progress=True)
    _say(cfg, f"export esphome: building training windows for {phrase!r} ({len(user)} clips of yours)")
    real = real_speech(cfg) if corpus is not None else []
    others = other_voices(phrase, cfg) if corpus is not None else ([], [])
    X, y, counts = build_training_set(phrase, user, corpus, cfg, voices=voices, real=real, others=others)
    counts["other_voice_renders"] = len(others[0]) + len(others[1])
    _say(cfg, f"export esphome: {len(y)} windows ({int(y.sum())} positive); training {cfg.epochs} epochs on CPU")
    model = train_model(X, y, cfg)
    if corpus is not None and cfg.mine_contexts:
        hard = mine_negatives(model, phrase, corpus, cfg, voices, real=real, other_words=others[1])
        counts["mined"] = len(hard)
        _say(cfg, f"export esphome: {len(hard)} hard negatives mined; fine-tuning {cfg.mine_epochs} epochs")
        if len(hard):
            X = np.concatenate([X, hard])
            y = np.concatenate([y, np.zeros(len(hard), np.float32)])
            model = train_model(X, y, cfg, model=model, epochs=cfg.mine_epochs, lr=cfg.lr / 4)
    cutoff = choose_cutoff(model, corpus, cfg)
    rng = np.random.default_rng([cfg.seed, 5])
    calib = [X[i] for i in rng.choice(len(X), size=min(len(X), 200), replace=False)]
    data = convert(model, calib)
    info = check_format(data)
    train_cpu = time.process_time() - t_cpu
    mpath, jpath, man, need = write_export(out_dir, phrase, data, cutoff, cfg)
    run_tflm(mpath, X[0], man["micro"]["tensor_arena_size"])   # runs in the manifest's arena
    _say(cfg, f"export esphome: wrote {mpath} ({len(data)} bytes, arena {man['micro']['tensor_arena_size']} B) "
              f"and {jpath} (cutoff {man['micro']['probability_cutoff']})")
    return ExportResult(mpath, jpath, man, len(data), need, info["ops"], train_cpu, counts, model)
