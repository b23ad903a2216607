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
and voices outside the corpus saying the phrase and its words (``other_voices``).

    >>> res = export_esphome("hey jarvis", ["a.wav", "b.wav", ...], "out/")
    >>> res.model_path, res.manifest["micro"]["probability_cutoff"]
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edge.errors import EdgelearnError
from host.export import frontend as FE

# ESPHome micro_wake_word's op resolver (esphome/components/micro_wake_word/streaming_model.cpp,
# StreamingModel::register_streaming_ops_): a model with any other op fails to load on the board.
MWW_OPS = frozenset({
    "CALL_ONCE", "VAR_HANDLE", "RESHAPE", "READ_VARIABLE", "STRIDED_SLICE", "CONCATENATION",
    "ASSIGN_VARIABLE", "CONV_2D", "MUL", "ADD", "MEAN", "FULLY_CONNECTED", "LOGISTIC", "QUANTIZE",
    "DEPTHWISE_CONV_2D", "AVERAGE_POOL_2D", "MAX_POOL_2D", "PAD", "PACK", "SPLIT_V",
})
STREAMING_OPS = frozenset({"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE"})

STRIDE = 3            # feature frames per inference, as the released models
K1 = 5                # first convolution's taps (frames)
CHANNELS = 64
DW_K = 9              # depthwise taps (strides)
N_BLOCKS = 4
WINDOW = K1 + STRIDE * (DW_K - 1) * N_BLOCKS   # 101 frames: the receptive field
IN_SCALE = 0.1        # the Keras model's input rescaling, folded into the first conv on export
MIN_CLIPS = 5
MANIFEST_VERSION = 2
MINIMUM_ESPHOME_VERSION = "2024.7.0"   # as microWakeWord's released v2 models (stride-3 input)
SLIDING_WINDOW = 5
FEATURE_STEP_MS = 10


@dataclass
class ExportConfig:
    """Knobs of the recipe (the defaults are the recipe; tests shrink them)."""
    seed: int = 0
    espeak_renders: int = 4          # renders of the phrase per espeak-ng training voice
    festival_renders: int = 30       # per Festival training voice (pitch up to 1.4: higher voices)
    synth_copies: int = 2            # augmented contexts per synthetic render
    user_copies: int = 20            # augmented contexts per user clip
    scrambled_copies: int = 1        # negatives per positive context: the same clip scrambled or reversed
    run_contexts: int = 1500         # 3 s runs of corpus words (negatives)
    sentences: int = 400             # espeak-ng sentences of corpus words (continuous speech negatives)
    hop: int = 60                    # frames between the negative windows taken from speech
    user_scrambled: int = 1          # scrambled/reversed negatives per augmented user clip
    mine_contexts: int = 1500        # hard-negative mining: fresh 3 s runs scored after training
    mine_min: float = 0.01           # windows scored above this join the training set...
    mine_max: int = 4000             # ...at most this many
    mine_epochs: int = 6             # then fine-tuning on everything
    near_miss_voices: int = 16       # espeak-ng voices that speak the near misses
    noise_contexts: int = 300
    # Real human speech as negatives: Debian's asterisk-core-sounds prompts of these languages,
    # where installed (host/data/realneg.py; Spanish is left out: it is Allison, the benchmarks'
    # English real-speech speaker). Each prompt is placed over background ``real_copies`` times and
    # cut into windows every ``real_hop`` frames; a fresh copy of each joins the hard-negative mining.
    # Off by default: measured on development data it cost recall (docs/edge-runtime.md, "ESPHome"),
    # e.g. ("fr", "it", "ru").
    real_speech: tuple = ()
    real_copies: int = 1
    real_hop: int = 40
    # The prompts are 8 kHz telephone audio: this share of every synthetic context (positives
    # included) is band-limited to 4 kHz too, so that a missing top band does not mean "negative"
    telephone: float = 0.0
    # Voices outside the corpus ("synth:name") that say the phrase (``other_renders`` each) and the
    # corpus's words (``other_words`` renders of each), so that the user's clips are not the only
    # audio of their kind, e.g. ("flite:kal16", "flite:kal"), Flite's diphone voices (the corpus has
    # no Flite voice in training). Off by default: it cost recall on development data.
    other_voices: tuple = ()
    other_renders: int = 12
    other_words: int = 3
    epochs: int = 30
    batch: int = 128
    lr: float = 2e-3
    author: str = "edgelearn"
    website: str | None = None
    languages: tuple = ("en",)
    sliding_window: int = SLIDING_WINDOW
    cutoff_range: tuple = (0.9, 0.97)   # microWakeWord's released cutoffs are 0.85-0.97
    log: object = field(default=None, repr=False)   # callable(str) or None (stderr)


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


def _say(cfg: ExportConfig, msg: str) -> None:
    if cfg.log is not None:
        cfg.log(msg)
    else:
        print(msg, file=sys.stderr, flush=True)


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
                             fix=f"record the phrase {MIN_CLIPS} times or more and pass each with --wav")
    out = []
    for p in paths:
        pcm = read_wav(p, min_samples=FE.SAMPLE_RATE // 5, max_samples=4 * FE.SAMPLE_RATE)
        t = trim(pcm.astype(np.float32))
        if t.size < FE.SAMPLE_RATE // 10 or float(np.abs(t).max()) < 30:
            raise EdgelearnError(f"{p}: no speech found (silent or nearly so)",
                                 fix="record the phrase again, closer to the microphone")
        out.append(t.astype(np.float32))
    return out


# ----------------------------------------------------------------------------- data

def _floor(rng, n: int) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32) * 3.0


def _background(rng, n: int, speech_power: float, pool) -> np.ndarray:
    """Noise for an n-sample context: 20 % none, else coloured noise or babble at 5-30 dB SNR."""
    from host.data import noise as N

    if rng.random() < 0.2:
        return np.zeros(n, np.float32)
    kind = rng.integers(4) if pool else rng.integers(3)
    if kind == 3:
        noise = N.babble(rng, pool, 1, n=n)[0]
    else:
        noise = N.coloured_noise(rng, ("white", "pink", "brown")[kind], (1, n))[0]
    snr = rng.uniform(5.0, 30.0)
    return noise * np.float32(np.sqrt(speech_power / 10 ** (snr / 10)))


def telephone_band(x: np.ndarray) -> np.ndarray:
    """x (16 kHz) through 8 kHz and back: nothing above 4 kHz, as the real-speech prompts."""
    from scipy.signal import resample_poly

    return resample_poly(resample_poly(x, 1, 2), 2, 1)[: len(x)].astype(np.float32)


def _channel(rng, x: np.ndarray, telephone: float) -> np.ndarray:
    """The speech of one context, band-limited to 4 kHz with probability ``telephone``."""
    return telephone_band(x) if telephone and rng.random() < telephone else x


def _augment_utt(rng, utt: np.ndarray) -> np.ndarray:
    from host import augment as A
    from host.data import noise as N

    x = A.speed_perturb(utt, float(rng.choice(A.SPEEDS)))
    if rng.random() < 0.3:
        from scipy.signal import fftconvolve
        h = N.room_impulse(rng, rt60=rng.uniform(0.15, 0.6))
        wet = fftconvolve(x, h)[: len(x) + int(0.1 * FE.SAMPLE_RATE)]
        x = (wet * (np.abs(x).max() / max(np.abs(wet).max(), 1e-6))).astype(np.float32)
    return x


def _power(x: np.ndarray) -> float:
    a = np.abs(x) > 0.05 * max(float(np.abs(x).max()), 1e-6)
    return float((x[a] ** 2).mean()) if a.any() else 1.0


def _level(rng, ctx: np.ndarray) -> np.ndarray:
    """A random peak level (the front end's PCAN evens most of it out)."""
    peak = float(np.abs(ctx).max()) or 1.0
    return np.clip(ctx * (rng.uniform(0.05, 0.8) * 32767 / peak), -32768, 32767).astype(np.int16)


def _positive_context(rng, utt: np.ndarray, pool, telephone: float = 0.0):
    """(int16 context, end sample of the phrase, start sample) with ~1-1.3 s of background first."""
    x = _channel(rng, _augment_utt(rng, utt), telephone)
    lead = int(rng.uniform(1.05, 1.3) * FE.SAMPLE_RATE)
    tail = int(0.35 * FE.SAMPLE_RATE)
    n = lead + len(x) + tail
    ctx = np.zeros(n, np.float32)
    ctx[lead:lead + len(x)] = x
    ctx += _background(rng, n, _power(x), pool) + _floor(rng, n)
    return _level(rng, ctx), lead + len(utt_speech_end(x)), lead


def utt_speech_end(x: np.ndarray) -> np.ndarray:
    """The utterance up to its last 10 ms block within 30 dB of its loudest (reverb tails excluded)."""
    block = 160
    nb = len(x) // block
    if nb == 0:
        return x
    e = (x[: nb * block].reshape(nb, block).astype(np.float64) ** 2).mean(axis=1)
    idx = np.nonzero(e > e.max() * 1e-3)[0]
    return x[: (idx[-1] + 1) * block]


def scrambled(rng, x: np.ndarray) -> np.ndarray:
    """The clip with its content destroyed and its voice kept: reversed, or cut into 60-160 ms
    pieces put back in random order (a negative in the positives' own voice and channel)."""
    if rng.random() < 0.3:
        return x[::-1].copy()
    cuts, at = [], 0
    while at < len(x):
        n = int(rng.uniform(0.06, 0.16) * FE.SAMPLE_RATE)
        cuts.append(x[at:at + n])
        at += n
    order = rng.permutation(len(cuts))
    if len(order) > 1 and (order == np.arange(len(order))).all():
        order = order[::-1]
    return np.concatenate([cuts[i] for i in order]).astype(np.float32)


def _espeak_sentences(rng, voices, n: int, vocab) -> list[np.ndarray]:
    """n sentences of 4-9 words from ``vocab`` by espeak-ng voices, as continuous speech (not fitted
    to 1 s as corpus words are)."""
    import subprocess

    from host.data import synth

    esp = [v for v in voices if v.synth == "espeak"]
    out = []
    for k in range(n if esp else 0):
        v = esp[k % len(esp)]
        text = " ".join(str(w) for w in rng.choice(vocab, int(rng.integers(4, 10))))
        res = subprocess.run(["espeak-ng", "-v", v.name, "-s", str(int(175 * rng.uniform(0.85, 1.2))),
                              "-p", str(int(50 * rng.uniform(0.85, 1.2))), "--stdout", text],
                             capture_output=True, timeout=60)
        if res.returncode != 0:
            continue
        x = synth.trim(synth.resample(*synth.parse_wav_bytes(res.stdout)))
        if x.size and np.abs(x).max() > 1:
            out.append((x * (0.5 * 32767 / np.abs(x).max())).astype(np.float32))
    return out


def _windows(feats: np.ndarray, ends) -> list[np.ndarray]:
    out = []
    for e in ends:
        e = int(min(e, len(feats) - 1))
        if e - WINDOW + 1 >= 0:
            out.append(feats[e - WINDOW + 1:e + 1])
    return out


def _dense(f: np.ndarray, rng, hop: int) -> list[np.ndarray]:
    """Windows of f every ``hop`` frames from a random offset."""
    return _windows(f, range(WINDOW - 1 + int(rng.integers(hop)), len(f), hop))


def _run_context_feats(rng, runs, pool, seconds: float = 3.0, telephone: float = 0.0) -> np.ndarray:
    """Features of ``seconds`` of corpus words one after another (30-400 ms apart) over background."""
    n_ctx = int(seconds * FE.SAMPLE_RATE)
    ctx = np.zeros(n_ctx, np.float32)
    at = int(rng.uniform(0, 0.3) * FE.SAMPLE_RATE)
    while at < n_ctx:
        u = _augment_utt(rng, runs[rng.integers(len(runs))]) * rng.uniform(0.4, 1.0)
        m = min(len(u), n_ctx - at)
        ctx[at:at + m] += u[:m]
        at += len(u) + int(rng.uniform(0.03, 0.4) * FE.SAMPLE_RATE)
    ctx = _channel(rng, ctx, telephone)
    ctx += _background(rng, n_ctx, _power(ctx), pool) + _floor(rng, n_ctx)
    return FE.features(_level(rng, ctx))


def _sentence_feats(rng, u: np.ndarray, pool, telephone: float = 0.0) -> np.ndarray:
    a = _channel(rng, _augment_utt(rng, u), telephone)
    lead = int(1.0 * FE.SAMPLE_RATE)
    n = len(a) + lead + int(0.2 * FE.SAMPLE_RATE)
    ctx = np.zeros(n, np.float32)
    ctx[lead:lead + len(a)] = a
    ctx += _background(rng, n, _power(a), pool) + _floor(rng, n)
    return FE.features(_level(rng, ctx))


def _sources(phrase: str, corpus):
    """(corpus training-split utterances that are not the phrase, the babble pool)."""
    if corpus is None:
        return [], []
    idx = [i for i in corpus.select("train", kinds=("keyword", "filler", "custom")) if str(corpus.text[i]) != phrase]
    return ([corpus.utterance(i) for i in idx],
            [corpus.utterance(i) for i in corpus.select("train", kinds=("filler",))])


def _vocab(phrase: str) -> list[str]:
    from host.data.words import CUSTOM_PHRASES, FILLERS, SPEECH_COMMANDS

    return [w for w in SPEECH_COMMANDS + FILLERS + CUSTOM_PHRASES if w != phrase]


def real_speech(cfg: "ExportConfig") -> list[np.ndarray]:
    """The installed real-speech prompts of ``cfg.real_speech`` (16 kHz float32 at int16 scale);
    says once which packages would add more."""
    from host.data import realneg

    if not cfg.real_speech:
        return []
    if "es" in cfg.real_speech:
        raise EdgelearnError("real_speech includes 'es': the Spanish prompts are Allison, the "
                             "benchmarks' English real-speech speaker", fix="leave 'es' out")
    unknown = [lg for lg in cfg.real_speech if lg not in realneg.SPEAKERS]
    if unknown:
        raise EdgelearnError(f"real_speech language {unknown[0]!r} has no prompts here",
                             fix=f"use some of {', '.join(sorted(set(realneg.SPEAKERS) - {'es'}))}")
    lack = realneg.missing(cfg.real_speech)
    if lack:
        _say(cfg, f"export esphome: fewer real-speech negatives than the recipe's: {lack}")
    return [x for lang in cfg.real_speech for _n, _t, x in realneg.prompts(lang)]


def mine_negatives(model, phrase: str, corpus, cfg: "ExportConfig", voices=None, real=None,
                   other_words=None) -> np.ndarray:
    """Hard negatives: fresh runs of corpus words and sentences (new draws, training voices only)
    and fresh copies of the real-speech prompts ``real``, scored by the model; the windows it
    scores above cfg.mine_min, at most cfg.mine_max."""
    rng = np.random.default_rng([cfg.seed, 9])
    runs, pool = _sources(phrase, corpus)
    if not runs:
        return np.zeros((0, WINDOW, FE.CHANNELS), np.float16)
    runs = runs + list(other_words or [])
    if voices is None:
        voices = _training_voices(corpus)
    wins = []
    for _ in range(cfg.mine_contexts):
        wins += _dense(_run_context_feats(rng, runs, pool, telephone=cfg.telephone), rng, 10)
    for u in _espeak_sentences(rng, voices, cfg.mine_contexts // 4, _vocab(phrase)):
        wins += _dense(_sentence_feats(rng, u, pool, cfg.telephone), rng, 10)
    for u in real or []:
        wins += _dense(_sentence_feats(rng, u, pool), rng, 20)
    W = np.stack(wins).astype(np.float16)
    logits = np.concatenate([model.predict(W[a:a + 8192, :, None, :].astype(np.float32), batch_size=1024,
                                           verbose=0)[:, 0, 0] for a in range(0, len(W), 8192)])
    p = 1 / (1 + np.exp(-logits))
    keep = np.argsort(-p)[: cfg.mine_max]
    keep = keep[p[keep] > cfg.mine_min]
    return W[keep]


def _near_misses(phrase: str) -> list[str]:
    from host.data.words import FILLERS, NEAR_MISS

    words = phrase.split()
    out = list(NEAR_MISS.get(phrase, []))
    out += [w for w in words if len(words) > 1]
    rng = np.random.default_rng(len(phrase))
    if len(words) > 1:
        for i in range(len(words)):
            for f in rng.choice(FILLERS, 2, replace=False):
                out.append(" ".join(words[:i] + [str(f)] + words[i + 1:]))
    else:
        out += [phrase[: max(2, len(phrase) // 2)], phrase + " " + str(rng.choice(FILLERS))]
    seen, uniq = set(), []
    for t in out:
        if t != phrase and t not in seen:
            seen.add(t)
            uniq.append(t)
    return uniq


def _training_voices(corpus, split: str = "train"):
    from host.data.synth import Voice

    ids = sorted({str(v) for v, s in zip(corpus.voice, corpus.split) if s == split})
    return [Voice(*i.split(":", 1)) for i in ids]


def render_phrase(phrase: str, voices, cfg: ExportConfig, seed: int) -> list[np.ndarray]:
    from host.data import synth

    rng = np.random.default_rng(seed)
    jobs = []
    for v in voices:
        fest = v.synth == "festival"
        for k in range(cfg.festival_renders if fest else cfg.espeak_renders):
            pitch = float(rng.uniform(0.85, 1.4) if fest else rng.uniform(0.85, 1.2))
            jobs.append((v, phrase, float(rng.uniform(0.8, 1.2)), pitch, (v.id, k)))
    if not jobs:
        return []
    synth.check_installed({v.synth for v in voices})
    got = synth.render_jobs(jobs, f"rendering {phrase!r}")
    return [got[j[4]].astype(np.float32) for j in jobs if j[4] in got]


def other_voices(phrase: str, cfg: ExportConfig) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(renders of the phrase, renders of the corpus's other words) by ``cfg.other_voices``."""
    from host.data import synth
    from host.data.synth import Voice

    bad = [v for v in cfg.other_voices if v.count(":") != 1 or v.split(":")[0] not in synth.BINARIES]
    if bad:
        raise EdgelearnError(f"other_voices {bad[0]!r} is not a voice", fix='name each as "synth:name", '
                             'e.g. "flite:kal16" (synth: espeak, festival or flite)')
    voices = [Voice(*v.split(":", 1)) for v in cfg.other_voices]
    if not voices:
        return [], []
    synth.check_installed({v.synth for v in voices})
    rng = np.random.default_rng([cfg.seed, 13])
    jobs = []
    for v in voices:
        jobs += [(v, phrase, float(rng.uniform(0.8, 1.2)), float(rng.uniform(0.85, 1.3)), ("p", v.id, k))
                 for k in range(cfg.other_renders)]
        jobs += [(v, w, float(rng.uniform(0.8, 1.2)), float(rng.uniform(0.85, 1.3)), ("w", v.id, w, k))
                 for w in _vocab(phrase) for k in range(cfg.other_words)]
    got = synth.render_jobs(jobs, "rendering other voices")
    pos = [got[j[4]].astype(np.float32) for j in jobs if j[4] in got and j[4][0] == "p"]
    return pos, [got[j[4]].astype(np.float32) for j in jobs if j[4] in got and j[4][0] == "w"]


def build_training_set(phrase: str, user_clips, corpus, cfg: ExportConfig, voices=None, real=None,
                       others=None):
    """(X float32 (N, WINDOW, 40) features, y float32 (N,)) and counts by source.

    ``corpus``: a ``host.data.corpus.Corpus`` (its training split's words are negatives and its
    training voices speak the phrase) or None (tests: the user's clips and noise only).
    ``voices``: who speaks the phrase and the near misses (default: the corpus's training voices).
    ``real``: real-speech prompts (``real_speech(cfg)``), every window of them a negative.
    ``others``: ``other_voices(phrase, cfg)``: more positives, and more words for the runs."""
    rng = np.random.default_rng([cfg.seed, 1])
    if voices is None:
        voices = _training_voices(corpus) if corpus is not None else []
    words = phrase.split()
    runs, pool = _sources(phrase, corpus)
    synth_pos = render_phrase(phrase, voices, cfg, seed=cfg.seed * 7 + 11)
    if others:
        synth_pos, runs = synth_pos + others[0], runs + others[1]
    esp = [v for v in voices if v.synth == "espeak"][: cfg.near_miss_voices]
    near = []
    if esp:
        from host.data import synth
        nm_jobs = [(v, t, float(rng.uniform(0.85, 1.15)), 1.0, (v.id, t)) for v in esp for t in _near_misses(phrase)]
        got = synth.render_jobs(nm_jobs, "rendering near misses")
        near = [got[j[4]].astype(np.float32) for j in nm_jobs if j[4] in got]

    sentences = []
    if corpus is not None and cfg.sentences:
        sentences = _espeak_sentences(rng, voices, cfg.sentences, _vocab(phrase))

    X, y, counts = [], [], {"positive": 0, "partial": 0, "scrambled": 0, "speech": 0, "sentence": 0,
                            "real_speech": 0, "near_miss": 0, "noise": 0}
    tel = cfg.telephone

    def positive(utt, copies, n_scrambled):
        for _ in range(copies):
            for _ in range(n_scrambled):
                pcm, end, _start = _positive_context(rng, scrambled(rng, utt), pool, tel)
                f = FE.features(pcm)
                e = FE.frame_of_sample(end)
                for w in _windows(f, [e + int(rng.integers(0, 25))]):
                    X.append(w); y.append(0.0); counts["scrambled"] += 1
            pcm, end, start = _positive_context(rng, utt, pool, tel)
            f = FE.features(pcm)
            e = FE.frame_of_sample(end)
            for d in rng.integers(0, 25, size=3):
                for w in _windows(f, [e + d]):
                    X.append(w); y.append(1.0); counts["positive"] += 1
            cut = start + int(rng.uniform(0.3, 0.55) * (end - start))
            for w in _windows(f, [FE.frame_of_sample(cut)]):
                X.append(w); y.append(0.0); counts["partial"] += 1

    for u in synth_pos:
        positive(u, cfg.synth_copies, cfg.scrambled_copies)
    for u in user_clips:
        positive(np.asarray(u, np.float32), cfg.user_copies, cfg.user_scrambled)
    for _ in range(cfg.run_contexts if runs else 0):
        for w in _dense(_run_context_feats(rng, runs, pool, telephone=tel), rng, cfg.hop):
            X.append(w); y.append(0.0); counts["speech"] += 1
    for u in sentences:
        for w in _dense(_sentence_feats(rng, u, pool, tel), rng, cfg.hop):
            X.append(w); y.append(0.0); counts["sentence"] += 1
    for u in real or []:
        for _ in range(cfg.real_copies):
            for w in _dense(_sentence_feats(rng, u, pool), rng, cfg.real_hop):
                X.append(w); y.append(0.0); counts["real_speech"] += 1
    for u in near:
        for _ in range(2):
            pcm, end, _start = _positive_context(rng, u, pool, tel)
            f = FE.features(pcm)
            e = FE.frame_of_sample(end)
            for w in _windows(f, [e + int(rng.integers(0, 25)), e + int(rng.integers(-20, 0))]):
                X.append(w); y.append(0.0); counts["near_miss"] += 1
    for _ in range(cfg.noise_contexts):
        n = int(2.0 * FE.SAMPLE_RATE)
        from host.data import noise as N
        colour = ("white", "pink", "brown")[rng.integers(3)]
        ctx = N.coloured_noise(rng, colour, (1, n))[0] * rng.uniform(10, 3000)
        if pool and rng.random() < 0.5:
            ctx = N.babble(rng, pool, 1, n=n)[0] * rng.uniform(100, 3000)
        f = FE.features(np.clip(ctx + _floor(rng, n), -32768, 32767).astype(np.int16))
        for w in _windows(f, rng.integers(WINDOW, len(f), size=2)):
            X.append(w); y.append(0.0); counts["noise"] += 1
    if not X:
        raise EdgelearnError("no training windows could be made", fix="pass longer clips")
    counts["user_clips"] = len(user_clips)
    counts["synthetic_renders"] = len(synth_pos)
    return np.stack(X).astype(np.float16), np.asarray(y, np.float32), counts


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


def _folded_weights(model) -> dict:
    g = {l.name: l.get_weights() for l in model.layers if l.get_weights()}
    w1, b1 = g["conv1"]
    return {"w1": (w1 * IN_SCALE).astype(np.float32), "b1": b1,
            "dw": [g[f"dw{i}"] for i in range(N_BLOCKS)], "pw": [g[f"pw{i}"] for i in range(N_BLOCKS)],
            "head": g["head"]}


def streaming_module(model):
    """A tf.Module whose __call__ takes one stride [1, STRIDE, 40] of features and keeps every
    layer's past frames in variables: the model micro_wake_word runs."""
    import tensorflow as tf

    wts = _folded_weights(model)

    class Streaming(tf.Module):
        def __init__(self):
            super().__init__(name="edgelearn_streaming")
            self.s_in = tf.Variable(tf.zeros([1, K1 - STRIDE, 1, FE.CHANNELS]), trainable=False, name="state_in")
            self.s = [tf.Variable(tf.zeros([1, DW_K - 1, 1, CHANNELS]), trainable=False, name=f"state_{i}")
                      for i in range(N_BLOCKS)]
            self.w1 = tf.constant(wts["w1"])
            self.b1 = tf.constant(wts["b1"])
            self.dw = [(tf.constant(k), tf.constant(b)) for k, b in wts["dw"]]
            self.pw = [(tf.constant(k), tf.constant(b)) for k, b in wts["pw"]]
            self.hw, self.hb = tf.constant(wts["head"][0]), tf.constant(wts["head"][1])

        @tf.function(input_signature=[tf.TensorSpec([1, STRIDE, FE.CHANNELS], tf.float32, name="features")])
        def __call__(self, x):
            x = tf.reshape(x, [1, STRIDE, 1, FE.CHANNELS])
            buf = tf.concat([self.s_in, x], axis=1)
            self.s_in.assign(buf[:, STRIDE:])
            y = tf.nn.relu(tf.nn.conv2d(buf, self.w1, strides=[1, STRIDE, 1, 1], padding="VALID") + self.b1)
            for state, (dk, db), (pk, pb) in zip(self.s, self.dw, self.pw):
                buf = tf.concat([state, y], axis=1)
                state.assign(buf[:, 1:])
                y = tf.nn.depthwise_conv2d(buf, dk, strides=[1, 1, 1, 1], padding="VALID") + db
                y = tf.nn.relu(tf.nn.conv2d(y, pk, strides=[1, 1, 1, 1], padding="VALID") + pb)
            y = tf.reshape(y, [1, CHANNELS])
            return tf.sigmoid(tf.matmul(y, self.hw) + self.hb)

        def reset(self):
            self.s_in.assign(tf.zeros_like(self.s_in))
            for s in self.s:
                s.assign(tf.zeros_like(s))

    return Streaming()


def convert(model, calib_feats: list[np.ndarray]) -> bytes:
    """Full-integer TFLite of the streaming model: int8 input, uint8 output, resource variables.

    ``calib_feats``: feature sequences (frames, 40) streamed stride by stride through the model for
    calibration. One calibration row spans the front end's whole range [0, 26], so the input
    quantisation is exactly ESPHome's (scale 26/255, zero point -128; checked)."""
    import tensorflow as tf

    module = streaming_module(model)

    def rep():
        edge = np.zeros((1, STRIDE, FE.CHANNELS), np.float32)
        edge[0, 0, 0], edge[0, 1, 1] = FE.FEATURE_MAX, 0.0
        yield [edge]
        for f in calib_feats:   # the calibrator's interpreter carries the variables from row to row
            f = np.clip(np.asarray(f, np.float32), 0.0, FE.FEATURE_MAX)
            for k in range(len(f) // STRIDE):
                yield [f[None, k * STRIDE:(k + 1) * STRIDE]]

    fn = module.__call__.get_concrete_function()
    conv = tf.lite.TFLiteConverter.from_concrete_functions([fn], module)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = rep
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = tf.int8
    conv.inference_output_type = tf.uint8
    conv.experimental_enable_resource_variables = True
    conv._experimental_variable_quantization = True   # int8 state, as microWakeWord converts (no DEQUANTIZE)
    data = conv.convert()
    info = tflite_info(data)
    scale, zp = info["input_quantization"]
    if info["input_dtype"] != "int8" or zp != FE.INPUT_ZERO_POINT or abs(scale - FE.INPUT_SCALE) > 1e-6:
        raise RuntimeError(f"converted input quantisation {info['input_quantization']} is not ESPHome's "
                           f"({FE.INPUT_SCALE}, {FE.INPUT_ZERO_POINT})")
    return data


# ----------------------------------------------------------------------------- checks

def tflite_info(data: bytes) -> dict:
    """Ops, input/output shapes, dtypes and quantisation of a .tflite (TensorFlow's interpreter)."""
    import tensorflow as tf

    it = tf.lite.Interpreter(model_content=data)
    i, o = it.get_input_details()[0], it.get_output_details()[0]
    return {"ops": sorted({d["op_name"] for d in it._get_ops_details()}),
            "input_shape": [int(v) for v in i["shape"]], "input_dtype": np.dtype(i["dtype"]).name,
            "input_quantization": (float(i["quantization"][0]), int(i["quantization"][1])),
            "output_shape": [int(v) for v in o["shape"]], "output_dtype": np.dtype(o["dtype"]).name,
            "output_quantization": (float(o["quantization"][0]), int(o["quantization"][1]))}


def check_format(data: bytes) -> dict:
    """Raise if the model is not in micro_wake_word's format; return its tflite_info."""
    info = tflite_info(data)
    problems = []
    if info["input_dtype"] != "int8" or len(info["input_shape"]) != 3 or info["input_shape"][0] != 1 \
            or info["input_shape"][2] != FE.CHANNELS:
        problems.append(f"input {info['input_dtype']} {info['input_shape']} (wanted int8 [1, stride, 40])")
    if info["output_dtype"] != "uint8" or info["output_shape"] != [1, 1]:
        problems.append(f"output {info['output_dtype']} {info['output_shape']} (wanted uint8 [1, 1])")
    extra = sorted(set(info["ops"]) - MWW_OPS)
    if extra:
        problems.append(f"ops micro_wake_word does not register: {', '.join(extra)}")
    if not STREAMING_OPS <= set(info["ops"]):
        problems.append("no streaming state in resource variables")
    if problems:
        raise RuntimeError("not a micro_wake_word model: " + "; ".join(problems))
    return info


def run_tflm(path, feats: np.ndarray, arena_size: int) -> np.ndarray:
    """Stream features through the model under TFLite Micro in an arena of ``arena_size`` bytes:
    uint8 output per stride."""
    from tflite_micro.python.tflite_micro import runtime

    it = runtime.Interpreter.from_file(str(path), arena_size=int(arena_size))
    q = FE.quantize(feats)
    out = []
    for k in range(len(q) // STRIDE):
        it.set_input(q[None, k * STRIDE:(k + 1) * STRIDE], 0)
        it.invoke()
        out.append(int(np.asarray(it.get_output(0)).reshape(-1)[0]))
    return np.asarray(out, np.uint8)


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


def arena_for(path) -> tuple[int, int]:
    """(smallest arena TFLite Micro runs it in, the manifest's tensor_arena_size: that + 10 %, to 16 B)."""
    from edge.backends.tflite_micro import probe_arena_size

    need = probe_arena_size(path)
    return need, int(-(-need * 1.1 // 16) * 16)


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
                   voices=None, clips=None) -> ExportResult:
    """The whole recipe: read the clips, build the data, train, convert, check, write model + manifest.

    ``corpus``: "cached" (default) is the synthetic corpus (``edgelearn data synth``, rendered on
    first use), None trains on the clips and noise alone (tests); ``clips`` (int16/float arrays)
    may replace ``wavs``."""
    cfg = cfg or ExportConfig()
    phrase = " ".join(phrase.lower().split())
    slug(phrase)
    user = read_clips(wavs) if clips is None else [np.asarray(c, np.float32) for c in clips]
    if clips is not None and len(user) < MIN_CLIPS:
        raise EdgelearnError(f"{len(user)} clip(s) of the phrase given, {MIN_CLIPS} or more are needed")
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
