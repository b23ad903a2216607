"""The base commands' phrase second stage, built into a bundle (issue 17; ``edge/phrase_stage.py`` runs it).

1. Two phrase models per command, the ESPHome export's recipe with no user clip and seeds ``SEEDS_TRAIN``
   (``host.export.esphome.export_esphome(..., min_clips=0)``: the command said by the corpus's training
   voices and ``OTHER_VOICES``, word runs, sentences, near misses, mined hard negatives; ~2.3 min of
   CPU each; ``train``);
   the device averages the two models' outputs (``edge.phrase_stage.PhraseModel``).
2. Each command's cutoff chosen on development data only (``choose``): the bundle's first stage at
   ``FIRST_STAGE`` over the English prompts' development half (``host.data.realspeech``), synthetic
   word pairs by the corpus's training voices (another draw than bench ``kws_base``'s), and three
   other speakers' prompts (``host.data.realneg.TRANSLATED``); every candidate judged as
   ``edge.phrase_stage.PhraseConfirm`` judges it; per command the lowest cutoff whose false accepts
   stay within its share of ``TARGET_FA_H``.
3. The models copied in as ``phrase_<command>.tflite``, ``extra.phrase_stage`` written, the model
   card's section, the file table refreshed and the manifest signed again (``add_to_bundle``). The
   encoder and the version do not change, so device states stay bound to it.

``edgelearn model`` runs all three on the bundle it builds (``host.recipe.rebuild``);
``scripts/build_phrase_stage.py`` on an existing one. Moved from that script (session 42) in session
43, when the stage became the default operating point: the product's own command now builds what
its default runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from edge import phrase_calibrate as PC
from edge.atomic import atomic_write
from edge.phrase_calibrate import GRID, accepted, cutoffs as calibrate, refractory  # noqa: F401 (its names before)
from host.bundle import PUBLIC  # a bundle's files are world-readable (keys and device state are 0600)

# chosen on development data (docs/edge-runtime.md; `base_phrase_cascade.py 0 --post=0.3 --ensemble=s0,s1`):
# the two seeds' mean at 0.2 63.3 / 48.3 / 31.1 %, at 0.3 60.0 / 46.1 / 27.8 %, each at 0 development FA/h;
# seed 0 alone (session 43's first default) 52.2 / 44.4 / 24.4 % at 0.3
FIRST_STAGE = 0.2
SEEDS_TRAIN = (0, 1)
# voices outside the corpus that also say each command and the corpus's words (``ExportConfig.
# other_voices``; the shipped encoder's recipe trains on them too, host/data/supplement.py): RHVoice's
# bdl and clb (HTS voices from CMU ARCTIC recordings of two people) and SVOX Pico's two English women,
# all Debian non-free (scripts/model_deps.sh). Since session 44, chosen on development data
# (`base_phrase_cascade.py 0 --post=0.3 --ensemble=s0_ov,s1_ov`; docs/edge-runtime.md): the two seeds
# 63.3 / 48.3 / 31.1 % -> 66.1 / 56.7 / 42.2 % at the first stage's 0.2, both at 0 development FA/h
OTHER_VOICES = ("rhvoice:bdl", "rhvoice:clb", "pico:en-US", "pico:en-GB")
# the snippet around a candidate; AFTER_S is also how long after the keyword's end the event waits.
# 0.3 since session 43 (2026-12-06), chosen on development data (`base_phrase_cascade.py 0 --post=S`):
# 0.5 52.2 / 45.0 / 24.4 %, 0.3 52.2 / 44.4 / 24.4 %, 0.2 50.6 / 37.2 / 20.6 %, each at 0 FA/h
BEFORE_S, AFTER_S = 2.0, 0.3
TARGET_FA_H = 0.5
SEEDS = (101, 55, {"n": 600, "seed": 31})   # scripts/curve_variants.py's development draws
CARD_HEADING = "\n## Phrase models (the base commands' second stage)\n"


def train(cmds, out: Path, seeds=SEEDS_TRAIN, corpus=None) -> dict:
    """{command: [model file per seed]}: seed s's model of each command in
    ``out/s<s>/<command>/<command>.tflite``, trained where it is not there yet (a run stopped half way
    goes on where it was)."""
    from host.data.corpus import build_corpus
    from host.export import esphome as E

    files = {c: [Path(out) / f"s{s}" / c / f"{c}.tflite" for s in seeds] for c in cmds}
    for c in cmds:
        for s, f in zip(seeds, files[c]):
            if not f.exists():
                corpus = build_corpus(progress=False) if corpus is None else corpus
                E.export_esphome(c, None, f.parent, E.ExportConfig(seed=s, other_voices=OTHER_VOICES), corpus=corpus,
                                 clips=[], min_clips=0)
    return files


def bundle_names(c: str, n: int) -> list[str]:
    """The bundle's file names of command ``c``'s ``n`` models (the first keeps session 42's name)."""
    return [f"phrase_{c}.tflite"] + [f"phrase_{c}_{i}.tflite" for i in range(1, n)]


class Stage:
    """``PhraseConfirm``'s peak from model files ({command: [files]}), before a bundle holds them."""

    def __init__(self, files: dict, before_s: float = BEFORE_S, after_s: float = AFTER_S,
                 first_stage: float = FIRST_STAGE):
        from edge.phrase_stage import PhraseModel

        self.before_s, self.after_s, self.first_stage = before_s, after_s, first_stage
        self.models = {c: PhraseModel([Path(f).read_bytes() for f in fs], c) for c, fs in files.items()}

    def peak(self, word, pcm, keyword_end_s: float | None = None):
        from edge.phrase_stage import snippet_peak

        m = self.models.get(word)
        return None if m is None else snippet_peak(m, pcm, keyword_end_s, self.after_s)


def candidates(bundle, stage, pcm, first: float) -> list[dict]:
    """The first stage's candidates over ``pcm`` as the Detector opens them at ``first``, each with
    its phrase model's peak as ``stage`` computes it (``edge.phrase_calibrate.record``, which
    ``device calibrate`` runs on a place's own audio)."""
    from edge.detect import Detector
    from edge.kws import KeywordModel

    km = KeywordModel(bundle)
    return PC.record(lambda rec: Detector(km, threshold=first, asr=rec), stage, [[pcm]])[0]


def development_negatives():
    """[(int16 stream, is_false(event) or None)] and what they are: the real prompts' development
    half (an event on a prompt that says its keyword as a word is not false), synthetic word pairs,
    three other speakers' prompts; None where Debian's Allison prompts are not installed."""
    from host.data import realneg, realspeech
    from host.data.negatives import word_pairs

    dev = realspeech.load_prompts(which="dev")
    if not dev:
        return None
    dev_pcm, dev_spans = realspeech.concat(dev)

    def false_on_dev(e) -> bool:
        return not any(a - 0.3 <= e["time_s"] <= b + 1.0 and p.says(e["keyword"]) for (a, b), p in zip(dev_spans, dev))

    streams = [(dev_pcm, false_on_dev), (word_pairs(**SEEDS[2]), None)]
    others = realspeech.other_speakers(realneg.TRANSLATED)
    if others is not None:
        streams.append((others[0], None))
    what = ("the English prompts' development half, synthetic word pairs"
            + (", Colombian Spanish, French and Italian prompts" if others is not None else ""))
    return streams, what


def choose(bundle, files: dict, negatives, what: str, after_s: float = AFTER_S) -> dict:
    """``extra.phrase_stage`` for ``files`` behind ``bundle``'s first stage, cutoffs chosen on
    ``negatives`` ([(int16 stream, is_false or None)])."""
    stage = Stage(files, after_s=after_s)
    cmds = list(files)
    negs = [(candidates(bundle, stage, pcm, FIRST_STAGE), false) for pcm, false in negatives]
    hours = sum(len(pcm) for pcm, _ in negatives) / 16000 / 3600
    cut, rate = PC.cutoffs(negs, hours, cmds, FIRST_STAGE, TARGET_FA_H)
    return {"models": {c: bundle_names(c, len(fs)) for c, fs in files.items()}, "cutoffs": cut,
            "first_stage": FIRST_STAGE, "before_s": BEFORE_S, "after_s": after_s, "target_fa_h": TARGET_FA_H,
            "dev_fa_h": rate, "chosen_on": f"{hours * 60:.0f} min of development negatives: {what}",
            "bytes_each": max(Path(f).stat().st_size for fs in files.values() for f in fs)}


def add_to_bundle(d: Path, files: dict, cfg: dict, key: Path, recipe: dict | None = None) -> None:
    """The models and ``cfg`` into the bundle directory ``d``, its model card's section, the file
    table refreshed and signed again with ``key``; verified as a device would load it."""
    d = Path(d)
    names = {c: bundle_names(c, len(fs)) for c, fs in files.items()}
    for old in d.glob("phrase_*.tflite"):  # an earlier stage's files that this one does not name
        if old.name not in {n for ns in names.values() for n in ns}:
            old.unlink()
    for c, fs in files.items():
        for f, name in zip(fs, names[c]):
            atomic_write(d / name, Path(f).read_bytes(), mode=PUBLIC)
    m = json.loads((d / "manifest.json").read_text())
    m["extra"]["phrase_stage"] = {**cfg, **({"recipe": recipe} if recipe is not None else {})}
    atomic_write(d / "manifest.json", (json.dumps(m, indent=1, sort_keys=True) + "\n").encode(), mode=PUBLIC)
    write_card(d, m["extra"]["phrase_stage"], key)


def write_card(d: Path, cfg: dict, key: Path) -> None:
    """The model card's phrase-model section from ``cfg``, the file table refreshed, signed again."""
    from edge.bundle import load_bundle
    from host.bundle import refresh_files, sign_bundle

    card = (d / "MODEL_CARD.md").read_text()
    card = card.split(CARD_HEADING)[0].rstrip("\n") + "\n"
    atomic_write(d / "MODEL_CARD.md", (card + card_section(cfg)).encode(), mode=PUBLIC)
    refresh_files(d)
    sign_bundle(d, key)
    load_bundle(d, trusted_keys=_public_half(key))  # verifies as a device would


def _public_half(key: Path) -> Path:
    """The signing key's public half: ``host.keys.generate_keypair`` writes NAME.pub beside NAME.key."""
    return Path(key).with_suffix(".pub")


def card_section(cfg: dict) -> str:
    from host.model_card import voice_counts

    n = voice_counts()  # the corpus's split rule: the voices export_esphome renders the phrase with
    cuts = ", ".join(f"{w} {c:g}" for w, c in cfg["cutoffs"].items())
    return (
        f"{CARD_HEADING}\n"
        f"`phrase_<command>[_<i>].tflite`, {len(next(iter(cfg['models'].values())))} per command "
        f"({cfg['bytes_each']} bytes each), whose outputs the device averages: the ESPHome export's recipe "
        f"(TFLite Micro's audio front end, a streaming int8 network with a 1 s receptive field; seeds "
        f"{', '.join(str(s) for s in (cfg.get('recipe') or {}).get('seeds', SEEDS_TRAIN))}) trained on the "
        f"synthetic corpus's training voices ({n[('train', 'espeak')]} espeak-ng and {n[('train', 'festival')]} "
        "Festival voices; the phrase by each, word runs, sentences, near misses and mined hard negatives)"
        + (", and four voices outside the corpus saying the phrase and the corpus's words: RHVoice's bdl and clb "
           "(HTS voices built from CMU ARCTIC recordings of a US man and a US woman; their data LGPL-2.1+) and SVOX "
           "Pico's en-US and en-GB (Apache-2.0), all from Debian's non-free component"
           if (cfg.get("recipe") or {}).get("other_voices") else "")
        + "; no user clip. The default operating point (`device detect` given no option; "
        f"`--phrase` with any other) runs them on the encoder's candidates at {cfg['first_stage']:g}, each judged "
        f"on its audio from {cfg['before_s']:g} s before its keyword's end to {cfg['after_s']:g} s after; cutoffs "
        f"chosen on development data only ({cfg['chosen_on']}): {cuts}. "
        "See docs/edge-runtime.md, \"Phrase models as the base commands' second stage\".\n")


def build(bundle_dir: Path, work: Path, key: Path, seeds=SEEDS_TRAIN, corpus=None, files: dict | None = None,
          after_s: float = AFTER_S) -> dict | None:
    """Train (into ``work``, or take ``files``), choose and add the phrase stage to the bundle at
    ``bundle_dir``; returns its ``extra.phrase_stage``, or None (said on stderr) where the development
    prompts are not installed: the bundle then runs its first stage alone."""
    from edge.bundle import load_bundle

    negatives = development_negatives()
    if negatives is None:
        from host.data.realspeech import missing_reason

        sys.stderr.write(f"model: no phrase second stage: its cutoffs are chosen on real development speech, and "
                         f"{missing_reason() or 'no prompt was found'}\n")
        return None
    bundle = load_bundle(bundle_dir, trusted_keys=_public_half(key))
    cmds = [w for w in bundle.manifest["extra"]["labels12"] if not w.startswith("_")]
    files = train(cmds, work, seeds, corpus) if files is None else files
    cfg = choose(bundle, files, *negatives, after_s=after_s)
    add_to_bundle(bundle_dir, files, cfg, key,
                  recipe={"host.export.esphome.ExportConfig": "defaults", "other_voices": list(OTHER_VOICES),
                          "seeds": list(seeds), "user_clips": 0})
    return cfg
