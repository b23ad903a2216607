"""The shipped recipe's training data beyond the cached corpus: two more synthesizers' voices, real
speech of other languages and running speech of everyday words by the corpus's own training voices
as ``_unknown_``, appended to the corpus's training split in memory.

Why: on voices no model trained on (Flite's, and Asterisk's real prompts) the corpus alone left the
base commands at 9.6 % mean recall at <= 5 real false accepts per hour; RHVoice's two voices of real
US speakers (bdl, clb), SVOX Pico's two English women and 1 s windows of Asterisk's French and
Italian prompts as negatives took it to 23.0 (docs/frontend-and-model.md, "Three more real speakers,
and the ranking they give"); version 3 adds 1 s windows of running everyday speech (parts of words,
two words in one window: what the detector meets between keywords), which halved the false accepts
on real development speech at one threshold ("Everyday running speech as `_unknown_`"). The val,
test and unseen clips stay the corpus's own, so every figure measured on them is comparable with the
model before.

    >>> corpus, synths = supplemented(build_corpus(), Supplement())   # what `edgelearn model` trains on
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

# engine -> synth's list of its usable voices; "festival": its voices beyond the corpus's (rab, don)
ENGINE_VOICES = {"rhvoice": "RHVOICE_VOICES", "pico": "PICO_VOICES", "festival": "FESTIVAL_EXTRA_VOICES"}


@dataclass(frozen=True)
class Supplement:
    """What is added to the corpus's training split. ``engines``: {engine: (renders per keyword, per
    filler)} by each of the engine's usable voices (``ENGINE_VOICES``: RHVoice's and Pico's from Debian
    non-free; "festival": Festival's voices the corpus does not have);
    ``real_negatives``: languages of Debian's Asterisk prompts (``host.data.realneg.SPEAKERS``) cut
    into 1 s windows as ``_unknown_``; ``everyday``: phrases of everyday words per espeak-ng training
    voice (``everyday_windows``). The defaults are the shipped model's recipe."""
    engines: tuple = (("rhvoice", (12, 3)), ("pico", (12, 3)))
    real_negatives: tuple = ("fr", "it")
    everyday: int = 20

    def describe(self) -> dict:
        return {k: [list(x) if isinstance(x, tuple) else x for x in v] if isinstance(v, tuple) else v
                for k, v in asdict(self).items()}


def engine_jobs(engine, words, fillers, renders, rate, pitch, seed=0):
    """Render jobs ``(voice, text, rate, pitch, key)`` for an engine's usable voices (``ENGINE_VOICES``:
    RHVoice's bdl and clb, SVOX Pico's en-US and en-GB, Festival's rab and don): ``renders`` = (per
    keyword, per filler), drawn as the corpus draws its voices, each voice from its own stream."""
    from host.data import synth

    jobs, base = [], 7000 + 100 * list(ENGINE_VOICES).index(engine)
    for vi, name in enumerate(getattr(synth, ENGINE_VOICES[engine])):
        voice, rng = synth.Voice(engine, name), np.random.default_rng([seed, base + vi])
        for kind, texts, n in (("keyword", words, renders[0]), ("filler", fillers, renders[1])):
            for t in texts:
                for r in range(n):
                    jobs.append((voice, t, float(rng.uniform(*rate)), float(rng.uniform(*pitch)),
                                 (voice.id, t, kind, r)))
    return jobs


def with_supplement(corpus, rendered: dict):
    """The corpus plus ``rendered`` ({(voice id, text, kind, r): int16}) as training rows."""
    from host.data.corpus import Corpus

    audio, offsets = [corpus.audio], list(corpus.offsets)
    meta = {"text": list(corpus.text), "kind": list(corpus.kind), "voice": list(corpus.voice),
            "split": list(corpus.split)}
    for (vid, text, kind, _r), pcm in rendered.items():  # in plan order
        audio.append(np.asarray(pcm, np.int16))
        offsets.append(offsets[-1] + len(pcm))
        for k, v in zip(("text", "kind", "voice", "split"), (text, kind, vid, "train")):
            meta[k].append(v)
    return Corpus(np.concatenate(audio), np.array(offsets, np.int64), meta, corpus.config)


def training_voices(corpus):
    """``(index, voice id, synthesizer, synth.Voice)`` of each of the corpus's *training* voices."""
    from host.data import synth

    for vi, vid in enumerate(sorted({v for v, s in zip(corpus.voice, corpus.split) if s == "train"})):
        kind_synth, name = vid.split(":", 1)
        yield vi, vid, kind_synth, synth.Voice(kind_synth, name)


def everyday_words(commands=None) -> list[str]:
    """host/data/everyday_words.txt less the words a command begins ("going", "upper") or that hold a
    command of three or more letters anywhere ("stopped", "download"): the near-miss experiment's
    lesson (scripts/_variant_data.NEAR_MISSES) was that such words as ``_unknown_`` teach the model
    to refuse the command itself."""
    from pathlib import Path

    from host.data.words import COMMANDS10

    commands = COMMANDS10 if commands is None else commands
    words = (Path(__file__).parent / "everyday_words.txt").read_text().split()
    return [w for w in words if not any(w.startswith(c) or (len(c) >= 3 and c in w) for c in commands)]


def everyday_windows(corpus, phrases: int, seed: int = 0) -> dict:
    """Running speech of every training voice cut into 1 s windows, as ``_unknown_`` rows: ``phrases``
    phrases of 2-5 everyday words per espeak-ng voice (three times as many per Festival voice), each
    voice's renders one after another, windows 1 s apart from a random start (as
    ``host.data.realneg.cut`` cuts the real prompts), quiet ones dropped. What the detector meets
    between keywords: parts of words, two words in one window, none of them the corpus's ~100."""
    from host.data import realneg, synth

    words = everyday_words()
    jobs = []
    for vi, vid, kind_synth, voice in training_voices(corpus):
        rng = np.random.default_rng([seed, 7000 + vi])
        for k in range(phrases * (3 if kind_synth == "festival" else 1)):
            text = " ".join(str(w) for w in rng.choice(words, int(rng.integers(2, 6))))
            jobs.append((voice, text, float(rng.uniform(0.85, 1.2)), float(rng.uniform(0.9, 1.1)), (vid, k)))
    got = synth.render_jobs(jobs, "everyday speech")
    rows, rng = {}, np.random.default_rng([seed, 7999])
    for vid in dict.fromkeys(j[4][0] for j in jobs):
        parts = []
        for j in jobs:
            if j[4][0] == vid and j[4] in got:
                parts += [got[j[4]].astype(np.float32), np.zeros(int(rng.uniform(0.05, 0.4) * 16000), np.float32)]
        for w in realneg.cut(np.concatenate(parts), rng):
            rows[(vid, f"everyday {len(rows)}", "filler", len(rows))] = w
    return rows


def check(sup: Supplement) -> None:
    """Raise one EdgelearnError naming what to install when an engine or a language is missing."""
    from edge.errors import EdgelearnError
    from host.data import realneg, synth

    used = [e for e, n in sup.engines if any(n)]
    synth.check_installed(used)
    if "festival" in used:
        synth.check_festival_voices(synth.FESTIVAL_EXTRA_VOICES)
    realneg.check_languages(sup.real_negatives, "real negatives")
    why = realneg.missing(sup.real_negatives)
    if why:
        raise EdgelearnError(why, fix="or run scripts/model_deps.sh, which installs everything `edgelearn model` needs")


def supplemented(corpus, sup: Supplement = Supplement()):
    """(the corpus with ``sup`` in its training split, the synthesizers it trains on). The renders
    draw from the corpus config's seed, rate and pitch ranges, so a rebuild renders the same clips."""
    from host.data import realneg, synth

    check(sup)
    cfg = corpus.config  # the cached corpus's CorpusConfig as a dict
    seed, rate, pitch, words = cfg.get("seed", 0), cfg["rate"], cfg["pitch"], cfg["words"]
    # the corpus's own filler texts, from its config: rows a caller added before (windows of real or
    # running speech, named by number) are not texts for an engine to say
    fillers = sorted(cfg["fillers"])
    # by the corpus's own training voices (drawn before the engines' voices join it), added last
    everyday = everyday_windows(corpus, sup.everyday, seed=seed) if sup.everyday else {}
    jobs = [j for e, n in sup.engines if any(n) for j in engine_jobs(e, words, fillers, n, rate, pitch, seed)]
    synths = ("espeak", "festival") + tuple(e for e, n in sup.engines if any(n) and e != "festival")
    if jobs:
        corpus = with_supplement(corpus, synth.render_jobs(jobs, "extra renders"))
    if sup.real_negatives:
        langs = tuple(sup.real_negatives)
        wins = realneg.windows(langs)
        corpus = with_supplement(corpus, {("asterisk:" + ",".join(langs), f"real speech {i}", "filler", i): w
                                          for i, w in enumerate(wins)})
        synths += ("asterisk",)
    if everyday:
        corpus = with_supplement(corpus, everyday)
    return corpus, synths
