"""Experiment (issue 17, session 45): a custom keyword that hears other voices, as the base commands do.

The base commands hear voices they never trained on through a cascade: the encoder's head opens a
candidate at a low threshold, and phrase models (the ESPHome export's recipe, two seeds, averaged)
must reach a cutoff on the candidate's audio. A custom keyword has no such path: its first stage is
trained on the user's clips (plus, in ``custom_stages.py --voices --two-heads``, on the phrase said
by the corpus's 48 training voices) and its second stage compares against the enrolled voice, so
other voices are lost (docs/edge-runtime.md, "Where other voices are lost"); a phrase model alone
hears them but fires ~7 times an hour ("A phrase model as the first stage"). Here the two are
chained: the two-heads first stage at its threshold lowered by ``DELTAS`` in logit, then the
keyword's two phrase models (seeds 0 and 1, trained on the corpus less the held-out voices, the
four ``host.phrase_stage.OTHER_VOICES`` and the user's 5 clips) on the candidate's snippet, OR'd
with the device's own two stages (which hear the enrolled voice). Development data only: the four
phrases of ``phrase_stage_dev.py`` from 5 clips of Flite rms, held-out renders of rms and four
other voices (none of kws_custom's) clean and at 20 dB, the Allison development half and everyday
words by rms, awb and kal16 as negatives.

    $ .venv/bin/python scripts/custom_cascade_dev.py    # ~25 min of training the first time, then ~5 min
    $ .venv/bin/python scripts/custom_cascade_dev.py --integrated   # the same models and heads as
        # `edgelearn export voices` writes them (host/custom_voices.py), run by the Detector itself
        # (edge/custom_voices.py: a candidate its phrase models reject frees the detector at once),
        # at each LOWER and CUTOFF below
    $ .venv/bin/python scripts/custom_cascade_dev.py --integrated --shipped --before 2.0,1.5   # the shipped
        # point with a shorter snippet before the keyword end (the CPU of a judgment is its snippet's)
    $ .venv/bin/python scripts/custom_cascade_dev.py --integrated --more-negatives --grid 0:0.97 --head-other-voices 3
        # the voices head also trained on RHVoice's and Pico's four voices (host.phrase_stage.OTHER_VOICES,
        # what the phrase models already hear), 3 renders each
    $ .venv/bin/python scripts/custom_cascade_dev.py --integrated --more-negatives --grid 0:0.97,1:0.995
    $ .venv/bin/python scripts/custom_cascade_dev.py --integrated --more-negatives --grid 0:0.97,1:0.995 \
          --models-config '{"real_speech": ["fr", "it"]}'   # phrase models trained against real speech too
        # those points with 43 more minutes of development negatives (host.data.realneg.TRANSLATED:
        # three speakers no model trains on), so that 0.5 false accepts per hour per phrase is ~3
        # events, not ~1
    $ .venv/bin/python scripts/custom_cascade_dev.py --integrated --more-negatives --near-misses \
          --grid 0:0.97,0.5:0.97,1:0.97,1:0.995 --models-config '{"real_speech": ["fr", "it"]}'
        # and each phrase's near misses (NEAR_MISSES) by the negatives' voices (session 47)
    $ .venv/bin/python scripts/custom_cascade_dev.py --integrated --models-config '{"real_speech": ["fr", "it"]}' \
          --grid 1:0.97 --snrs 10,5 --diagnose
        # the positives also at 10 and 5 dB, the real half under noise too; where each missed positive
        # was lost: judged by the phrase models and rejected (its best peak), or never judged (session 48)
    $ .venv/bin/python scripts/custom_cascade_dev.py --integrated --models-config '{"real_speech": ["fr", "it"]}' \
          --grid 1:0.97,1.5:0.97,2:0.97,3:0.97,4:0.97,6:0.97,3:0.9,3:0.93,3:0.95 --snrs 20,10,5 \
          --more-negatives --near-misses --diagnose
        # the first stage opened lower, then the cutoff at 3 logit (session 49: CV.LOWER_REAL, CV.CUTOFF_REAL)
    $ .venv/bin/python scripts/custom_cascade_dev.py --integrated --models-config '{"real_speech": ["fr", "it"]}' \
          --seeds 0,1,2 --grid 3:0.75,3:0.8,3:0.85,3:0.9 --snrs 20,10,5 --more-negatives --near-misses
        # three draws of the phrase models (a third, seed 2, trained the first time), their mean at each
        # cutoff (session 51: CV.SEEDS_REAL, CV.CUTOFF_REAL 0.85); with a third grid number (3:0.85:0.99)
        # the quiet-snippet rule of sensitivity high (two of three sure alone), and --dump F --diagnose
        # records each model's own peak for rules tried offline
    $ .venv/bin/python scripts/custom_cascade_dev.py --integrated --models-config '{"real_speech": ["fr", "it"]}' \
          --seeds 0,1,2 --grid 3:0.85 --snrs 20,10,5 --more-negatives --near-misses --more-talk
        # an hour more of synthetic talk by the five voices (session 52): the development negatives held
        # 18 min of it, where bench kws_custom's 47 min fire most (docs/edge-runtime.md, "More synthetic talk")
    $ .venv/bin/python scripts/custom_cascade_dev.py --integrated --seeds 0,1 --grid 3:0.8,3:0.85,3:0.9 \
          --models-config '{"real_speech": ["fr", "it"], "user_swapped": 2, "user_babble": 0.3}' \
          --snrs 20,10,5 --more-negatives --near-misses --more-talk --diagnose
        # the user's clips over loud babble for the phrase models (session 54, not adopted: docs/edge-runtime.md,
        # "The user's clips over loud babble")
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import _base_streams as B  # noqa: E402
from scripts._custom_variants import renders  # noqa: E402
from scripts.phrase_stage_dev import ENROL, OTHERS, PHRASES, dev_streams  # noqa: E402

SR = 16000
DELTAS = (0.0, 1.0, 2.0, 3.0)      # the first stage's threshold lowered by this much in logit
CUTOFFS = (0.5, 0.7, 0.8, 0.9, 0.95, 0.97, 0.99)
WORK = ROOT / "build" / "custom_cascade"
# --models-config JSON: ExportConfig fields for the phrase models (e.g. '{"real_speech": ["fr", "it"]}'),
# kept apart from the recipe's models (build/custom_cascade/<phrase>/s<seed>_<digest>)
MODEL_CFG = json.loads(sys.argv[sys.argv.index("--models-config") + 1]) if "--models-config" in sys.argv else {}
TAG = "_" + __import__("hashlib").sha1(json.dumps(MODEL_CFG, sort_keys=True).encode()).hexdigest()[:8] \
    if MODEL_CFG else ""


# --near-misses (session 47): words that sound like part of a phrase or like all of it, as
# bench/kws_custom.py's NEAR_MISSES are for its phrases (homophones left out: they are the phrase)
NEAR_MISSES = {"open sesame": ["open season", "sesame", "open the seam", "often sammy", "hopping sesame"],
               "good night": ["good light", "night", "could might", "good kite", "wood knife"],
               "hey robot": ["hey rowboat", "robot", "hey rabbit", "hey robert", "hay rope"],
               "pineapple": ["pinnacle", "apple", "fine apple", "pine cone", "spine apple"]}


def near_misses(renders_each: int = 3) -> np.ndarray:
    """Each phrase's near misses said by the development negatives' voices (rms, awb, kal16), a list
    per render with pauses between, over a microphone's noise floor (int16)."""
    rng, parts = np.random.default_rng(47), []
    for vi, v in enumerate((ENROL,) + OTHERS[:2]):
        for pi, ph in enumerate(PHRASES):
            for c in renders(v, ", ".join(NEAR_MISSES[ph]), renders_each, 4700 + 10 * vi + pi):
                parts += [np.zeros(int(rng.uniform(0.4, 1.0) * SR), np.float32), c.astype(np.float32)]
    x = np.concatenate(parts)
    return np.clip(x + B.with_floor(rng, len(x)), -32768, 32767).astype(np.int16)


def integrated(km, bundle, state, models, bank, rng) -> int:
    """The Detector with each phrase's entry as ``export voices`` writes it, at each LOWER x CUTOFF."""
    import shutil

    from edge import custom_voices as CV
    from edge.detect import Detector, detect_pcm
    from edge.keywords import CustomKeywords
    from host.custom_voices import with_voices_head
    from host.export import esphome as E

    entries = []
    for e in state.keywords:
        w, b = models[e["name"]].heads
        new = with_voices_head(e, w, b, bank)
        rel = []
        for s in SEEDS:
            r = f"{CV.DIR}/{E.slug(e['name'])}_{s}.tflite"
            (state.root / CV.DIR).mkdir(exist_ok=True)
            shutil.copy(WORK / E.slug(e["name"]) / f"s{s}{TAG}" / f"{E.slug(e['name'])}.tflite", state.root / r)
            rel.append(r)
        new["voices"] = {"version": CV.VERSION, "models": rel, "cutoff": CV.CUTOFF, "lower": CV.LOWER}
        entries.append(new)
    streams = dev_streams()
    if "--more-negatives" in sys.argv:  # three development speakers no model trains on (43 min; kws_custom never reads them)
        from host.data import realneg
        from host.data.realspeech import other_speakers

        more = other_speakers(realneg.TRANSLATED)
        if more is None:
            raise SystemExit(f"custom_cascade_dev: {realneg.missing(realneg.TRANSLATED)}")
        streams["neg_translated"] = (more[0], None, None, more[2])
    if "--near-misses" in sys.argv:  # each phrase's near misses by the negatives' three voices (kws_custom has its own)
        streams["neg_near"] = (near_misses(), None, None, "rms/awb/kal16")
    if "--more-talk" in sys.argv:  # (session 52) ~12 min more everyday words by each of the five voices (other
        # draws than neg_talk_*): 1.3 h of synthetic talk in all, so that its rate is more than one event
        from host.data import synth as S

        avoid = {w for ph in PHRASES for w in ph.split()}
        for i, v in enumerate((ENROL,) + OTHERS):
            streams[f"neg_moretalk_{v[1]}"] = (B.other_speech(S.Voice(*v), n=440, seed=180 + i, avoid=avoid), None,
                                               None, v[1])
    if "--snrs" in sys.argv:  # more noise levels (e.g. --snrs 10,5): the positives' clips, and the real half, under them
        streams.update(noisier(streams, [float(x) for x in sys.argv[sys.argv.index("--snrs") + 1].split(",")]))
    hours = sum(len(s[0]) for n, s in streams.items() if n.startswith("neg")) / SR / 3600
    grid = [(lo, c) for lo in (0.0, 0.5, 1.0, 1.5, 2.0) for c in (0.9, 0.97, 0.99, 0.995)]
    if "--grid" in sys.argv:  # e.g. --grid 0:0.97,1:0.99,1:0.995
        # a third number: the lone model's cutoff in a quiet snippet (CV.SINGLE; above 1: off), a fourth
        # the loudness range a quiet snippet has (CV.QUIET_DB)
        grid = [tuple(float(x) for x in g.split(":")) for g in sys.argv[sys.argv.index("--grid") + 1].split(",")]
    if "--shipped" in sys.argv:  # the shipped point alone, with each snippet length (--before S,S...)
        grid = [tuple(CV.point(MODEL_CFG.get("real_speech")).values())]
    befores = [float(x) for x in sys.argv[sys.argv.index("--before") + 1].split(",")] if "--before" in sys.argv \
        else [CV.BEFORE_S]
    for before, (lower, cutoff, *single) in ((b, g) for b in befores for g in grid):
        CV.BEFORE_S = before  # read by each Voices as it loads
        single = {"single": min(single[0], 1.0), "quiet_db": (single[1:] or [CV.QUIET_DB])[0] if single[0] <= 1
                  else 200.0} if single else {}
        ents = [{**e, "voices": {**e["voices"], "lower": lower, "cutoff": cutoff, **single}} for e in entries]
        custom = CustomKeywords(ents, bundle, root=state.root)
        heard, fa, judged, cpu, audio_s = {}, {}, 0, 0.0, 0.0
        diag = {} if "--diagnose" in sys.argv else None
        for name, (pcm, spans, clips, voice) in streams.items():
            det = Detector(km, custom=custom, keywords=[])
            n0 = sum(v.judged for v in custom.voices)
            judgments = record_judgments(custom) if diag is not None else None
            c0 = time.process_time()
            if "--alone" in sys.argv:   # each keyword in a detector of its own: no candidate of another blocks it
                ev = []
                for i in range(len(custom.names)):
                    d = Detector(km, custom=custom, keywords=[])
                    d.thresholds[[j for j in range(len(custom.names)) if j != i]] = 2.0   # never opens
                    ev += detect_pcm(d, np.asarray(pcm, np.int16))
                ev.sort(key=lambda e: e["time_s"])
            else:
                ev = detect_pcm(det, np.asarray(pcm, np.int16))
            cpu, audio_s = cpu + time.process_time() - c0, audio_s + len(pcm) / SR
            if spans is not None:
                heard[name[4:]] = round(100 * B.score_positives(ev, spans, clips, words=PHRASES)["recall"], 1)
            else:
                fa[name] = len(ev)
                judged += sum(v.judged for v in custom.voices) - n0
            if diag is not None:
                diag[name] = diagnose(ev, judgments, spans, clips, cutoff)
                if DUMP is not None:
                    DUMP[-1].update(stream=name, hours=len(pcm) / SR / 3600)
        print(json.dumps({"before_s": before, "lower": lower, "cutoff": cutoff, **single, "heard_pct": heard,
                          "fa_per_hour_per_phrase": round(sum(fa.values()) / hours / len(PHRASES), 2),
                          "fa_events": fa, "judged_per_hour_of_negatives": round(judged / hours),
                          # every stream, 4 phrases (compare within one run: the machine's load moves it)
                          "cpu_ms_per_s": round(1000 * cpu / audio_s, 2)}), flush=True)
        if diag is not None:
            print(json.dumps({"diagnose": diag}), flush=True)
        if DUMP is not None:   # --dump FILE: every judgment and positive, for rules tried offline
            Path(sys.argv[sys.argv.index("--dump") + 1]).write_text(json.dumps(DUMP))
    return 0


DUMP = [] if "--dump" in sys.argv else None
# --seeds 0,1,2: the phrase models' draws (the recipe trains 0 and 1; a third for rules over three)
SEEDS = tuple(int(x) for x in sys.argv[sys.argv.index("--seeds") + 1].split(",")) if "--seeds" in sys.argv else (0, 1)


def noisier(streams: dict, snrs) -> dict:
    """The positive streams' clips again under white, pink and babble at each of ``snrs`` dB (as
    kws_custom mixes its positives), and the real development half under the same mix."""
    from bench import _realspeech as R

    pool, out = B.babble_pool(), {}
    for name, (pcm, spans, clips, voice) in list(streams.items()):
        if name.startswith("pos_") and name.endswith("_clean"):
            for snr in snrs:
                p, sp = B.positive_stream(clips, snr_db=snr, seed=700 + int(snr) + len(out), pool=pool)
                out[f"pos_{voice}_{snr:g}"] = (p, sp, clips, voice)
    dev, dev_spans = R.concat([p for p in R.load_prompts() if p.split == "dev"])
    for snr in snrs:
        out[f"neg_real_{snr:g}db"] = (B.noisy_speech(dev, dev_spans, snr, seed=800 + int(snr), pool=pool), None, None,
                                      "allison")
    return out


def record_judgments(custom) -> list:
    """Each phrase-model judgment of the stream from now on: (phrase, keyword end in s, the models'
    mean peak, each model's own peak where the Voices computed them (a third --grid number), the
    snippet's loudness range in dB)."""
    from edge.custom_voices import loudness_range
    from edge.phrase_stage import SAMPLE_RATE

    out = []
    for name, v in zip(custom.names, custom.voices):
        if v is None:
            continue

        v.exact = True   # the peaks themselves, not bounds under the cutoff

        def says_at(pcm, end, tape=None, at=None, v=v, name=name, orig=type(v).says_at):
            ok = orig(v, pcm, end, tape, at)
            out.append((name, (0 if at is None else at / SAMPLE_RATE) + end, float(v.last),
                        [round(p, 4) for p in v.last_each or ()], round(loudness_range(pcm), 2)))
            return ok
        v.says_at = says_at
    return out


def diagnose(events, judgments, spans, clips, cutoff) -> dict:
    """Where each positive was lost (heard / judged by the phrase models and rejected / never judged:
    the first stage did not open it, or another phrase's candidate held the detector), with the best
    peak of the rejected ones; on negatives, the judged peaks' spread."""
    if DUMP is not None:
        DUMP.append({"judgments": judgments, "clips": None if spans is None else [
            (a, b, c.word, any(e["keyword"] == c.word and a - 0.1 <= e["time_s"] <= b + 1.0 for e in events))
            for (a, b), c in zip(spans, clips)]})
    peaks = np.array([j[2] for j in judgments]) if judgments else np.zeros(0)
    if spans is None:
        return {"judged": len(judgments), "peaks_over": {str(c): int((peaks >= c).sum()) for c in (0.8, 0.9, 0.95, cutoff)}}
    heard = rejected = unjudged = 0
    best = []
    for (a, b), c in zip(spans, clips):
        if any(e["keyword"] == c.word and a - 0.1 <= e["time_s"] <= b + 1.0 for e in events):
            heard += 1
            continue
        mine = [j[2] for j in judgments if j[0] == c.word and a - 0.1 <= j[1] <= b + 1.0]
        if mine:
            rejected += 1
            best.append(round(max(mine), 3))
        else:
            unjudged += 1
    return {"heard": heard, "rejected": rejected, "never_judged": unjudged, "rejected_best_peaks": sorted(best)}


def main() -> int:
    from edge import enroll as En
    from edge.bundle import load_bundle
    from edge.detect import Detector, detect_pcm
    from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys
    from edge.phrase_stage import PhraseModel, snippet_peak
    from host.data import synth as S
    from host.data.corpus import build_corpus
    from host.export import esphome as E
    from host.export.esphome import _training_voices
    from host.phrase_stage import OTHER_VOICES

    bundle = load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys())
    km = KeywordModel(bundle)
    state = En.DeviceState(Path(tempfile.mkdtemp()), bundle.model_id, bundle.version, [], bundle)
    corpus = build_corpus(progress=False)
    held = [f"{v[0]}:{v[1]}" for v in OTHERS]
    corpus.split = np.where(np.isin(corpus.voice, held), "heldout", corpus.split)  # never trained on
    voices = _training_voices(corpus)
    bank = En.negative_bank(bundle)
    rng = np.random.default_rng(7)
    xrng = np.random.default_rng(8)
    k = int(sys.argv[sys.argv.index("--head-other-voices") + 1]) if "--head-other-voices" in sys.argv else 0
    extra_head = [S.Voice(*v.split(":", 1)) for v in OTHER_VOICES] * k
    models = {}
    for pi, ph in enumerate(PHRASES):  # every phrase first: the heads below change entries in memory only
        En.enroll(km, state, ph, renders(ENROL, ph, 5, pi))
    for pi, ph in enumerate(PHRASES):
        clips = renders(ENROL, ph, 5, pi)
        # the second head: the phrase said by the corpus's training voices (custom_stages.py --voices --two-heads)
        said = [En.prepare_clip(S.render(v, [(ph, float(rng.uniform(0.9, 1.1)), float(rng.uniform(0.9, 1.1)))])[0],
                                f"{v}") for v in voices]
        if extra_head:  # --head-other-voices K: OTHER_VOICES' K renders each too (their own rng: the rest is unchanged)
            said += [En.prepare_clip(S.render(v, [(ph, float(xrng.uniform(0.9, 1.1)), float(xrng.uniform(0.9, 1.1)))])[0],
                                     f"{v}") for v in extra_head]
        user = [En.prepare_clip(c, "user") for c in clips]
        pos, _ = km.infer(km.features(En.augment(user + said, rng)))
        w, b = En.train_head(pos, bank)

        def half(w, b):
            c = En.CustomKeywords([{"name": ph, "w": w, "b": b, "threshold": 0.5}])
            return max(0.5, float(np.quantile(c.scores(bank)[:, 0], 1.0 - En.FAR_TARGET / 2)))

        entry = next(k for k in state.keywords if k["name"] == ph)
        entry.update(threshold=half(np.asarray(entry["w"], np.float32), entry["b"]),
                     speaker_heads=[{"w": [float(x) for x in w], "b": float(b), "threshold": half(w, b),
                                     "sensitivities": {}}])
        files = []
        for s in SEEDS:
            d = WORK / E.slug(ph) / f"s{s}{TAG}"
            f = d / f"{E.slug(ph)}.tflite"
            if not f.exists():
                E.export_esphome(ph, None, d, E.ExportConfig(seed=s, other_voices=OTHER_VOICES, **MODEL_CFG), corpus=corpus,
                                 clips=clips)
            files.append(f.read_bytes())
        models[ph] = PhraseModel(files, ph)
        models[ph].heads = (w, b)
        print(json.dumps({"trained": ph}), flush=True)
    if "--integrated" in sys.argv:
        return integrated(km, bundle, state, models, bank, rng)
    custom = state.custom()
    verifies, base_thr = custom.verifies, custom.thresholds.copy()

    def events(pcm, second: bool, delta: float = 0.0):
        custom.verifies = verifies if second else (lambda k: False)
        custom.thresholds = (1.0 / (1.0 + np.exp(-(np.log(base_thr / (1 - base_thr)) - delta)))).astype(np.float32)
        try:
            return detect_pcm(Detector(km, custom=custom, keywords=[]), pcm)
        finally:
            custom.verifies, custom.thresholds = verifies, base_thr

    streams = dev_streams()
    # per stream: the device's two stages' events, and per delta the first stage's events with each
    # one's phrase-model peak on its snippet (2 s before its keyword end to 0.3 s after)
    rec = {}
    for name, (pcm, spans, clips, voice) in streams.items():
        pcm = np.asarray(pcm, np.int16)
        both = events(pcm, True)
        firsts = {}
        for d in DELTAS:
            ev = events(pcm, False, d)
            for e in ev:
                t = e["time_s"]
                seg = pcm[max(0, int((t - 2.0) * SR)):int((t + 0.3) * SR)]
                e["peak"] = snippet_peak(models[e["keyword"]], seg, min(t, 2.0), 0.3)
            firsts[d] = ev
        rec[name] = (both, firsts)
        print(json.dumps({"stream": name, "both": len(both), "first": {d: len(v) for d, v in firsts.items()}}),
              flush=True)
    if "--near-misses" in sys.argv:  # each phrase's near misses by the negatives' three voices (kws_custom has its own)
        streams["neg_near"] = (near_misses(), None, None, "rms/awb/kal16")
    if "--snrs" in sys.argv:  # more noise levels (e.g. --snrs 10,5): the positives' clips, and the real half, under them
        streams.update(noisier(streams, [float(x) for x in sys.argv[sys.argv.index("--snrs") + 1].split(",")]))
    hours = sum(len(s[0]) for n, s in streams.items() if n.startswith("neg")) / SR / 3600

    def report(label, pick):
        heard, fa = {}, {}
        for name, (pcm, spans, clips, voice) in streams.items():
            ev = B.refractory(sorted(pick(*rec[name]), key=lambda e: e["time_s"]))
            if spans is not None:
                heard[name[4:]] = round(100 * B.score_positives(ev, spans, clips, words=PHRASES)["recall"], 1)
            else:
                fa[name] = len(ev)
        print(json.dumps({"stage": label, "heard_pct": heard,
                          "fa_per_hour_per_phrase": round(sum(fa.values()) / hours / len(PHRASES), 2),
                          "fa_events": fa}), flush=True)

    print(json.dumps({"negative_hours": round(hours, 3)}), flush=True)
    report("the device's two stages", lambda both, firsts: both)
    for d in DELTAS:
        report(f"first stage alone, -{d} logit", lambda both, firsts, d=d: firsts[d])
        for c in CUTOFFS:
            report(f"first -{d} logit + phrase >= {c}, OR the device's two stages",
                   lambda both, firsts, d=d, c=c: both + [e for e in firsts[d] if e["peak"] >= c])
    out = WORK / "rec.json"
    out.write_text(json.dumps({n: {"both": b, "first": {str(d): v for d, v in f.items()}} for n, (b, f) in rec.items()}))
    print(json.dumps({"events": str(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
