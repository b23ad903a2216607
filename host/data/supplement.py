"""The shipped recipe's training data beyond the cached corpus: two more synthesizers' voices and real
speech of other languages as ``_unknown_``, appended to the corpus's training split in memory.

Why: on voices no model trained on (Flite's, and Asterisk's real prompts) the corpus alone left the
base commands at 9.6 % mean recall at <= 5 real false accepts per hour; RHVoice's two voices of real
US speakers (bdl, clb), SVOX Pico's two English women and 1 s windows of Asterisk's French and
Italian prompts as negatives took it to 23.0 (docs/frontend-and-model.md, "Three more real speakers,
and the ranking they give"). The val, test and unseen clips stay the corpus's own, so every figure
measured on them is comparable with the model before.

    >>> corpus, synths = supplemented(build_corpus(), Supplement())   # what `edgelearn model` trains on
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

ENGINE_VOICES = {"rhvoice": "RHVOICE_VOICES", "pico": "PICO_VOICES"}  # engine -> synth's list of its usable voices


@dataclass(frozen=True)
class Supplement:
    """What is added to the corpus's training split. ``engines``: {engine: (renders per keyword, per
    filler)} by each of the engine's usable voices (``ENGINE_VOICES``; Debian non-free);
    ``real_negatives``: languages of Debian's Asterisk prompts (``host.data.realneg.SPEAKERS``) cut
    into 1 s windows as ``_unknown_``. The defaults are the shipped model's recipe."""
    engines: tuple = (("rhvoice", (12, 3)), ("pico", (12, 3)))
    real_negatives: tuple = ("fr", "it")

    def describe(self) -> dict:
        return {k: [list(x) if isinstance(x, tuple) else x for x in v] for k, v in asdict(self).items()}


def engine_jobs(engine, words, fillers, renders, rate, pitch, seed=0):
    """Render jobs ``(voice, text, rate, pitch, key)`` for a non-free engine's usable voices
    (``ENGINE_VOICES``: RHVoice's bdl and clb, SVOX Pico's en-US and en-GB): ``renders`` = (per
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


def check(sup: Supplement) -> None:
    """Raise one EdgelearnError naming what to install when an engine or a language is missing."""
    from edge.errors import EdgelearnError
    from host.data import realneg, synth

    synth.check_installed([e for e, n in sup.engines if any(n)])
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
    jobs = [j for e, n in sup.engines if any(n) for j in engine_jobs(e, words, fillers, n, rate, pitch, seed)]
    synths = ("espeak", "festival") + tuple(e for e, n in sup.engines if any(n))
    if jobs:
        corpus = with_supplement(corpus, synth.render_jobs(jobs, "extra renders"))
    if sup.real_negatives:
        langs = tuple(sup.real_negatives)
        wins = realneg.windows(langs)
        corpus = with_supplement(corpus, {("asterisk:" + ",".join(langs), f"real speech {i}", "filler", i): w
                                          for i, w in enumerate(wins)})
        synths += ("asterisk",)
    return corpus, synths
