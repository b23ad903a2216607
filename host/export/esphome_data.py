"""The ESPHome export's training data: labelled 101-frame feature windows of the phrase and of
everything it must not fire on (the recipe: ``host/export/esphome.py``'s docstring).

``build_training_set`` makes the windows: the phrase rendered by the corpus's training voices and the
user's clips, each augmented into contexts of background, noise and level (``_positive_context``,
``host/export/esphome_audio.py``; optionally a share of them over loud babble, ``user_babble`` and
``synth_babble``); negatives from the same clips cut short, scrambled or reversed (``scrambled``),
runs and sentences of the corpus's words, near misses of the phrase, and noise alone; optionally
other speakers' real speech (``real_speech``) and voices outside the corpus (``other_voices``).
``mine_negatives`` scores fresh draws of that speech with the trained model and keeps the hard
negatives for the fine-tune.

    >>> X, y, counts = build_training_set("hey jarvis", clips, corpus, ExportConfig())
    >>> X.shape[1:], counts["positive"]     # (WINDOW, 40) float16 windows, y 1.0 for the phrase
"""

from __future__ import annotations

import numpy as np

from edge.errors import EdgelearnError
from host.export import frontend as FE
from host.export.esphome_audio import (
    _augment_utt, _background, _channel, _floor, _level, _positive_context, _power, scrambled, swapped)
from host.export.esphome_config import WINDOW, ExportConfig, _say


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
    realneg.check_languages(cfg.real_speech, "real_speech", set(realneg.SPEAKERS) - {"es"})
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
                             f'e.g. "flite:kal16" (synth: {", ".join(synth.BINARIES)})')
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

    X, y, counts = [], [], {"positive": 0, "partial": 0, "scrambled": 0, "swapped": 0, "speech": 0, "sentence": 0,
                            "real_speech": 0, "near_miss": 0, "noise": 0}
    tel = cfg.telephone

    def positive(utt, copies, n_scrambled, n_swapped=0, babble=0.0):
        for _ in range(copies):
            # a share of the copies, with their negatives, over babble at cfg.user_babble_snr dB
            hard = cfg.user_babble_snr if babble and rng.random() < babble else None
            for kind, n in (("scrambled", n_scrambled), ("swapped", n_swapped)):
                for _ in range(n):
                    neg = scrambled(rng, utt) if kind == "scrambled" else swapped(utt)
                    pcm, end, _start = _positive_context(rng, neg, pool, tel, hard)
                    f = FE.features(pcm)
                    e = FE.frame_of_sample(end)
                    for w in _windows(f, [e + int(rng.integers(0, 25))]):
                        X.append(w); y.append(0.0); counts[kind] += 1
            pcm, end, start = _positive_context(rng, utt, pool, tel, hard)
            f = FE.features(pcm)
            e = FE.frame_of_sample(end)
            for d in rng.integers(0, 25, size=3):
                for w in _windows(f, [e + d]):
                    X.append(w); y.append(1.0); counts["positive"] += 1
            cut = start + int(rng.uniform(0.3, 0.55) * (end - start))
            for w in _windows(f, [FE.frame_of_sample(cut)]):
                X.append(w); y.append(0.0); counts["partial"] += 1

    for u in synth_pos:
        positive(u, cfg.synth_copies, cfg.scrambled_copies, 0, cfg.synth_babble)
    for u in user_clips:
        positive(np.asarray(u, np.float32), cfg.user_copies, cfg.user_scrambled, cfg.user_swapped,
                 cfg.user_babble)
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
