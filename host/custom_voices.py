"""``edgelearn export voices``: teach an enrolled keyword other voices, from its typed phrase.

The device's enrolment hears the voice that enrolled (bench ``kws_custom``: other voices 100 %
missed). This adds the other-voices path of ``edge.custom_voices`` to the keyword's entry in the
state directory, from what the device already has (its name, the clips it kept) and the host's
synthesizers:

1. a second first-stage head, trained on the phrase said once by each of the corpus's training
   voices plus the user's clips (augmented as enrolment does), against the bundle's negative bank;
   every head of the keyword then runs at its share of the bank rate (two heads: half each);
2. phrase models of the phrase (``host/export``'s ESPHome recipe: the corpus's voices and, where
   installed, RHVoice's and Pico's four voices say it, the user's clips among the positives, against
   the corpus's words, near misses, mined hard negatives, the user's clips with their halves swapped
   (``USER_SWAPPED``) and, where installed, Debian's real French and Italian prompts:
   ``REAL_SPEECH``), written under ``<state>/voices/``: three draws (seeds 0, 1,
   2) where they trained against the prompts, else two (``CV.seeds``).

Trained against real speech, the models stop passing other speakers' prompts, so the keyword's first
stage opens ``CV.LOWER_REAL`` logit lower for them and the three models' mean must reach
``CV.CUTOFF_REAL`` (3.0 and 0.85 since session 51: 81.2 / 67.4 % of other voices heard clean / under
20-5 dB noise on development data at 0.22 false accepts per hour per phrase, against 76.0 / 65.3 % at
0.44 for two models at 0.95, session 49's point, and 41.6 / 42.7 % clean / 20 dB for the recipe's
models at ``CV.LOWER``, 0; without the prompts a first stage 1 logit lower gave 1.56 FA/h). Without
the prompts the two models train as before and the entry keeps ``CV.LOWER`` and ``CV.CUTOFF`` (said):
``CV.point``.

~3 minutes of CPU per model on 2 cores, the first run also renders the corpus. Chosen on development
data, not on the benchmark (``scripts/custom_cascade_dev.py``; docs/edge-runtime.md, "Other voices
for a custom keyword"). Enrolling the keyword again (``--replace``, ``--add``) or rebuilding a damaged
``keywords.json`` keeps the path (``edge.custom_voices.carried``: the same head and models, every
head's threshold recomputed); a model version with a new encoder drops it (its head scored the old
encoder's embeddings; ``Device.carry_to`` says so): run this again then.

    >>> teach("state/", bundle, "hey jarvis")
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edge import custom_voices as CV
from edge.custom_voices import with_voices_head  # noqa: F401 (re-exported: scripts and tests import it here)
from edge.atomic import atomic_write
from edge.errors import EdgelearnError

RENDER_SEED = 7
# other speakers' real prompts among the phrase models' negatives (``ExportConfig.real_speech``;
# asterisk-core-sounds-fr-wav, -it-wav: scripts/model_deps.sh); chosen on development data, whose three
# foreign speakers are other people (scripts/custom_cascade_dev.py --models-config)
REAL_SPEECH = ("fr", "it")
# negatives per augmented user clip with its halves swapped (``ExportConfig.user_swapped``: the user's
# own words in the wrong order); chosen on development data, where three draws with it fired 2 times
# on 1.3 h of synthetic talk against 5 (session 52; docs/edge-runtime.md, "More synthetic talk")
USER_SWAPPED = 2


def real_speech(log=print) -> tuple:
    """``REAL_SPEECH`` where every package of it is installed, else none (said: the point then stays)."""
    from host.data import realneg

    lack = realneg.missing(REAL_SPEECH)
    if lack:
        log(f"export voices: {lack}: the phrase models train without real speech and the keyword's first "
            f"stage opens where it did (fewer other voices heard; scripts/model_deps.sh installs them)")
        return ()
    return REAL_SPEECH


def other_voices(log=print) -> tuple:
    """``host.phrase_stage.OTHER_VOICES`` where their synthesizers are installed, else none (said)."""
    from host.data import synth
    from host.phrase_stage import OTHER_VOICES

    try:
        synth.check_installed({v.split(":")[0] for v in OTHER_VOICES})
        return OTHER_VOICES
    except EdgelearnError as e:
        log(f"export voices: {e.problem}: the phrase models train without RHVoice's and Pico's voices "
            f"({e.fix} adds them)")
        return ()


def voices_head(km, bank, phrase: str, clips, voices, rng):
    """(w, b) of the head trained on ``phrase`` said by ``voices`` (one render each) and ``clips``."""
    from edge import enroll as En
    from host.data import synth as S

    said = [En.prepare_clip(S.render(v, [(phrase, float(rng.uniform(0.9, 1.1)), float(rng.uniform(0.9, 1.1)))])[0],
                            str(v)) for v in voices]
    user = [En.prepare_clip(np.asarray(c), "user") for c in clips]
    pos, _ = km.infer(km.features(En.augment(user + said, rng)))
    return En.train_head(pos, bank)


def teach(state_dir, bundle, name: str, cfg=None, corpus="cached", voices=None, log=print) -> dict:
    """Add the other-voices path to enrolled keyword ``name`` (module doc); returns a report.
    ``cfg``: the phrase models' ``ExportConfig`` (tests shrink it; its seed is set per model);
    ``corpus``: as ``export_esphome`` takes it; ``voices``: the renders' voices (default: the
    corpus's training voices)."""
    import dataclasses
    import tempfile
    import time

    from edge.device import Device
    from edge.device_enrolment import _slug
    from edge.enroll import negative_bank
    from edge.keywords import DeviceState
    from edge.kws import KeywordModel
    from host.export import esphome as E

    root = Path(state_dir)
    dev = Device(root, bundle)
    state = DeviceState.open(root, dev.bundle)
    entry = next((e for e in state.keywords if e["name"] == name), None)
    if entry is None:
        raise EdgelearnError(f"no keyword {name!r} is enrolled in {root}",
                             fix=f"enrol it first: edgelearn device enroll --state {root} --keyword {name!r} "
                                 "--wav a.wav b.wav c.wav")
    clips = dev.enrolment_clips(name)
    if clips is None:
        raise EdgelearnError(f"{root} kept no clips of {name!r} (enrolled before the device kept them, or removed)",
                             fix=f"enrol it again with --replace: edgelearn device enroll --state {root} "
                                 f"--keyword {name!r} --replace --wav ...")
    t0 = time.process_time()
    if corpus == "cached":
        from host.data.corpus import build_corpus

        corpus = build_corpus(progress=False)
    if voices is None:
        from host.export.esphome_data import _training_voices

        voices = _training_voices(corpus) if corpus is not None else []
    rng = np.random.default_rng(RENDER_SEED)
    km = KeywordModel(dev.bundle)
    bank = negative_bank(dev.bundle)
    w, b = voices_head(km, bank, name, clips, voices, rng)
    cfg = cfg or E.ExportConfig(other_voices=other_voices(log), real_speech=real_speech(log),
                                user_swapped=USER_SWAPPED)
    pt = CV.point(cfg.real_speech)
    rel = [f"{CV.DIR}/{_slug(name)}_{s}.tflite" for s in CV.seeds(cfg.real_speech)]
    models = []
    for s in CV.seeds(cfg.real_speech):
        with tempfile.TemporaryDirectory() as tmp:
            res = E.export_esphome(name, None, tmp, dataclasses.replace(cfg, seed=s), corpus=corpus,
                                   clips=list(clips))
            models.append(res.model_path.read_bytes())
    (root / CV.DIR).mkdir(parents=True, exist_ok=True)
    for r, data in zip(rel, models):  # before the entry names them: a cut here leaves the entry as it was
        atomic_write(root / r, data)
    state = DeviceState.open(root, dev.bundle)  # the file as it is now (minutes have passed)
    entry = next((e for e in state.keywords if e["name"] == name), None)
    if entry is None:
        raise EdgelearnError(f"keyword {name!r} was removed from {root} while its voices trained",
                             fix="enrol it again, then run this again")
    new = CV.attach(entry, w, b, bank, {"version": CV.VERSION, "models": rel, **pt,
                                              "real_speech": list(cfg.real_speech)})
    state.keywords[state.keywords.index(entry)] = new
    state.save()  # merged under the state lock; an entry enrolled again meanwhile: refused, nothing written
    return {"keyword": name, "voices": len(voices), "models": [str(root / r) for r in rel],
            **pt, "real_speech": list(cfg.real_speech), "heads": len(new["speaker_heads"]) + 1,
            "threshold": new["threshold"], "cpu_s": round(time.process_time() - t0, 1)}
