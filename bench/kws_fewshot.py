"""5-shot custom keywords on unseen voices: false-reject rate and false accepts per hour.

For each custom phrase (``host.data.words.CUSTOM_PHRASES``, never trained on) and
each evaluation voice the encoder never saw (Flite awb/rms, the Festival and
espeak-ng voices of the corpus's test split), 8 renders at random rate and pitch:
5 enrol the keyword (``edge.enroll.enroll``, threshold calibrated only against the
bundle's negative bank), 3 are held out. Each held-out render is streamed, in
noise (SNR 10-30 dB) between other speech, through the real ``Detector``: a miss
is a false reject. False accepts: >= 2 hours of negative speech from the same
unseen voices (fillers, Speech Commands words, near-miss phrases sharing a word or
syllables with the custom ones, short word runs) with gaps, over coloured noise
and babble, streamed at the detector's stride; every event of an enrolled keyword
is a false accept, except on the few near-miss pieces that say the keyword itself ("cinnamon roll"
for "cinnamon", "magnets", "lanterns") or a homophone of it ("good knight" for "good night", "doll fin"
for "dolphin", by espeak-ng's phonemes): for that keyword those pieces are not negative speech, so their
events do not count and their time leaves its hours (``S.on_negative_speech``; the goal's measure).
Beside them: rows where pieces that extend the keyword ("magnets", "dolphins", "thunderbolt") stay
negative speech and only pieces that say it as whole words do not (``S.says_as_words``), and rows with
every event counted. Audio and stream embeddings are generated once and cached
under ``.cache/edgelearn`` (not in git). Reference side by side: the nearest-
prototype cosine score (the ESP32's head) with its threshold set on the same bank
at the same target rate. Two-stage rows: the same keyword models with the
time-order verifier (``edge.verify``, its threshold from the enrolment clips
alone) checking each first-stage candidate, beside the first stage alone.

The verifier's calibration rule was chosen while looking at these positive voices, so
the main two-stage rows are optimistic. The independent check repeats the measurement,
both stages side by side, on positives nobody tuned on: the espeak-ng test-split voices
the main rows use only as negatives, rendered from fresh seeds, enrolled and measured
the same way. Its keyword models are new, but its false accepts are counted on the same
negative stream (which was in view when the rule was chosen). Its numbers are reported
as they come out; nothing is re-tuned on them.

The two-stage FRR and FA/h rows carry a 95 % interval (``ci95``) from a bootstrap over voices and,
within each, keyword models: 140 models of 7 voices pin a rate less tightly than 420 renders suggest.

The fresh check (issue 4) does the same on the espeak-ng voices of the corpus's val split (never
trained on, absent from the negative stream) with seeds of its own; it was added before a second
verifier rule was developed, and that development looked only at the main rows.

Rendering and caching live in ``bench._fewshot_data``, enrolment and counting in
``bench._fewshot_score``; this module reads the results into rows.

    $ nice -n 10 edgelearn bench kws_fewshot          # first run renders ~15 min of CPU
"""

from __future__ import annotations

import json

import numpy as np

from bench import _fewshot_data as D
from bench import _fewshot_score as S
from bench.common import row, write_results


def first_stage_rows(res, hours):
    """The first stage beside the prototype-cosine reference, on the main rows' voices."""
    n = sum(r[3] for r in res)
    frr, frr_p = sum(r[2] for r in res) / n, sum(r[6] for r in res) / n
    fah, fah_p = np.mean([r[4] for r in res]) / hours, np.mean([r[5] for r in res]) / hours
    worst = max(res, key=lambda r: r[4])
    proto_name = "prototype cosine (bank-calibrated)"
    rows = [
        row("kws_fewshot", f"false-reject rate, 5-shot, {len(res)} keyword models, {n} held-out renders",
            round(frr * 100, 2), "%", proto_name, round(frr_p * 100, 2)),
        row("kws_fewshot", f"false accepts per hour per keyword, every event counted ({hours:.2f} h)", round(fah, 3),
            "FA/h", proto_name, round(fah_p, 3)),
        row("kws_fewshot", "keyword models over 0.5 FA/h", int(sum(r[4] / hours > 0.5 for r in res)), "count",
            proto_name, int(sum(r[5] / hours > 0.5 for r in res)),
            worst={"voice": worst[0], "phrase": worst[1], "fa_per_hour": round(worst[4] / hours, 2)}),
    ]
    for syn in ("flite", "festival", "espeak"):
        sub = [r for r in res if r[0].startswith(syn)]
        if sub:
            rows.append(row("kws_fewshot", f"false-reject rate, {syn} voices", round(
                100 * sum(r[2] for r in sub) / sum(r[3] for r in sub), 2), "%", proto_name,
                round(100 * sum(r[6] for r in sub) / sum(r[3] for r in sub), 2),
                fa_per_hour=round(float(np.mean([r[4] for r in sub]) / hours), 3)))
    return rows


def fa_source_rows(fa_src):
    by_kind, speech_share, own = S.fa_sources(*fa_src)
    rows = []
    for kind, share in by_kind.items():
        rows.append(row("kws_fewshot", f"share of false accepts whose window is mostly a {kind}",
                        round(100 * share, 1), "%", "share of the stream's speech time",
                        None if kind not in speech_share else round(100 * speech_share[kind], 1), ratio=None))
    rows.append(row("kws_fewshot", "share of false accepts on the keyword's own near-miss phrases",
                    round(100 * own, 1), "%", None, None))
    return rows


NEGATIVE_SPEECH = ("negative speech: events on stream pieces that say the keyword itself ('cinnamon roll', "
                   "'magnets') or a homophone of it ('good knight', by espeak-ng phonemes) are not false accepts, "
                   "and those pieces' time is not negative speech")


def negative_rates(audio, root, res, fa, hours) -> dict:
    """Each keyword model's FA/h on its negative speech (``S.on_negative_speech``), both stages, and
    the two-stage rate when pieces that extend the keyword ("magnets") stay negative (``words``)."""
    one, d1 = S.on_negative_speech(audio, root, res, fa, hours, stage=1)
    two, d2 = S.on_negative_speech(audio, root, res, fa, hours, stage=2)
    words, dw = S.on_negative_speech(audio, root, res, fa, hours, stage=2, says=S.says_as_words)
    return {"one": one, "two": two, "dropped_one": d1, "dropped_two": d2, "words": words, "dropped_words": dw}


def fa_rows(res, hours, neg, tag=""):
    """The two-stage FA/h per keyword on negative speech (the goal's measure), with pieces that extend
    the keyword counted as negative, and with every event counted: each with its interval."""
    first = "first stage alone"
    ci_neg, ci_all = bootstrap_ci(res, hours, fa_per_hour=neg["two"]), bootstrap_ci(res, hours)
    return [row("kws_fewshot", f"{tag}two-stage false accepts per hour per keyword on negative speech ({hours:.2f} h "
                "less the pieces that say it)", round(float(np.mean(neg["two"])), 3), "FA/h", first,
                round(float(np.mean(neg["one"])), 3), ci95=ci_neg["fa_per_hour"], rule=NEGATIVE_SPEECH,
                events_dropped=neg["dropped_two"], first_stage_events_dropped=neg["dropped_one"]),
            row("kws_fewshot", f"{tag}two-stage false accepts per hour per keyword when pieces that extend the keyword "
                "('magnets', 'dolphins', 'thunderbolt') count as negative speech",
                round(float(np.mean(neg["words"])), 3),
                "FA/h", "on negative speech", round(float(np.mean(neg["two"])), 3), ratio=None,
                ci95=bootstrap_ci(res, hours, fa_per_hour=neg["words"])["fa_per_hour"],
                events_dropped=neg["dropped_words"]),
            row("kws_fewshot", f"{tag}two-stage false accepts per hour per keyword, every event counted (also on "
                f"pieces that say the keyword; {hours:.2f} h)", round(float(np.mean([r[9] for r in res]) / hours), 3),
                "FA/h", first, round(float(np.mean([r[4] for r in res]) / hours), 3), ci95=ci_all["fa_per_hour"])]


def two_stage_rows(res, models, hours, fa_src, km, neg):
    """First stage + verifier beside the first stage alone, on the same keyword models and audio."""
    import time

    from edge import features as F
    from edge.verify import Verifier

    n = sum(r[3] for r in res)
    one_frr, two_frr = sum(r[2] for r in res) / n, sum(r[8] for r in res) / n
    first = "first stage alone"
    ci = bootstrap_ci(res, hours)
    rows = [row("kws_fewshot", f"two-stage (time-order verifier) false-reject rate, {len(res)} keyword models",
                round(100 * two_frr, 2), "%", first, round(100 * one_frr, 2), ratio=None, ci95=ci["frr"])]
    rows += fa_rows(res, hours, neg)
    rows += [row("kws_fewshot", "two-stage keyword models over 0.5 FA/h on negative speech",
                 int(sum(f > 0.5 for f in neg["two"])), "count", first, int(sum(f > 0.5 for f in neg["one"])),
                 ratio=None)]
    for syn in ("flite", "festival", "espeak"):
        sub = [r for r in res if r[0].startswith(syn)]
        if sub:
            rows.append(row("kws_fewshot", f"two-stage false-reject rate, {syn} voices", round(
                100 * sum(r[8] for r in sub) / sum(r[3] for r in sub), 2), "%", first,
                round(100 * sum(r[2] for r in sub) / sum(r[3] for r in sub), 2), ratio=None,
                fa_per_hour=round(float(np.mean([r[9] for r in sub]) / hours), 3),
                first_stage_fa_per_hour=round(float(np.mean([r[4] for r in sub]) / hours), 3)))
    runs = np.mean([len(m["verify"].distances) for m in models]) / hours
    win = F.normalize(np.zeros((F.N_FRAMES, F.N_MFCC), np.float32) + 1, km.scale)
    t0 = time.perf_counter()
    for _ in range(100):
        km.infer(win[None])
    enc = (time.perf_counter() - t0) / 100
    v = Verifier(km.bundle)
    tpl = [np.zeros((15, v.dim()), np.int8) + 1] * D.SHOTS
    t0 = time.perf_counter()
    for _ in range(100):
        v.distance(v.sequences(win[None]), tpl)
    vt = (time.perf_counter() - t0) / 100
    rows.append(row("kws_fewshot", "verifier runs per hour of negative speech per keyword (windows of the first "
                    "stage's candidates, until one passes; the encoder runs 45,000 times an hour)",
                    round(float(runs), 1), "runs/h", None, None,
                    ms_per_run=round(vt * 1e3, 3), encoder_ms_per_run=round(enc * 1e3, 3), ratio=None))
    by_kind, _, own = S.fa_sources(*fa_src)
    rows.append(row("kws_fewshot", "two-stage share of false accepts whose window is mostly a near-miss",
                    round(100 * by_kind.get("near-miss", 0.0), 1), "%", None, None, ratio=None,
                    own_near_miss=round(100 * own, 1)))
    return rows


def bootstrap_ci(res, hours, n_boot=2000, seed=0, fa_per_hour=None):
    """95 % intervals of the two-stage FRR (%) and mean FA/h per keyword: voices resampled with
    replacement, then each drawn voice's keyword models (a voice's models share its renders and its
    own pieces of the stream, so they are not independent). ``fa_per_hour``: each model's FA/h (e.g.
    ``S.on_negative_speech``), default its every two-stage event over ``hours``. Returns {"frr":
    [lo, hi], "fa_per_hour": [lo, hi]}."""
    rng = np.random.default_rng(seed)
    fah_of = [r[9] / hours for r in res] if fa_per_hour is None else list(fa_per_hour)
    by_voice = {}
    for r, f in zip(res, fah_of):
        by_voice.setdefault(r[0], []).append((r[8], r[3], f))
    groups = [np.asarray(v, np.float64) for v in by_voice.values()]
    frr, fah = np.empty(n_boot), np.empty(n_boot)
    for b in range(n_boot):
        pick = [groups[i] for i in rng.integers(len(groups), size=len(groups))]
        draw = np.concatenate([g[rng.integers(len(g), size=len(g))] for g in pick])
        frr[b] = 100 * draw[:, 0].sum() / draw[:, 1].sum()
        fah[b] = draw[:, 2].mean()
    return {"frr": [round(float(np.percentile(frr, 2.5)), 2), round(float(np.percentile(frr, 97.5)), 2)],
            "fa_per_hour": [round(float(np.percentile(fah, 2.5)), 3), round(float(np.percentile(fah, 97.5)), 3)]}


def _stages(sub, hours):
    """First stage and two-stage FRR (%) and mean FA/h per keyword over per-keyword results ``sub``."""
    n = sum(r[3] for r in sub)
    return {"first_stage_frr": round(100 * sum(r[2] for r in sub) / n, 2),
            "two_stage_frr": round(100 * sum(r[8] for r in sub) / n, 2),
            "first_stage_fa_per_hour": round(float(np.mean([r[4] for r in sub]) / hours), 3),
            "two_stage_fa_per_hour": round(float(np.mean([r[9] for r in sub]) / hours), 3),
            "held_out": n, "first_stage_misses": sum(r[2] for r in sub), "two_stage_misses": sum(r[8] for r in sub)}


INDEPENDENT_TAG = "independent check: voices and renders not used when the verifier's rule was chosen"
FRESH_TAG = ("fresh check: espeak-ng val-split voices, fresh renders, added before the second verifier rule "
             "was developed")


def independent_rows(res, hours, neg, tag=INDEPENDENT_TAG, seeds=None):
    """Both stages on a check's keyword models (the independent or the fresh check; see the module
    docstring)."""
    n, both = sum(r[3] for r in res), _stages(res, hours)
    first, proto_name = "first stage alone", "prototype cosine (bank-calibrated)"
    voices = sorted({r[0] for r in res})
    per_voice = {v: _stages([r for r in res if r[0] == v], hours) for v in voices}
    seeds = seeds or {"render_seed": D.INDEPENDENT_RENDER_SEED, "snippet_seed": D.INDEPENDENT_SNIPPET_SEED}
    ci = bootstrap_ci(res, hours)
    return [
        row("kws_fewshot", f"{tag}: first-stage false-reject rate, {len(res)} keyword models ({len(voices)} "
            f"espeak-ng voices), {n} held-out renders", both["first_stage_frr"], "%", proto_name,
            round(100 * sum(r[6] for r in res) / n, 2), voices=voices, **seeds),
        row("kws_fewshot", f"{tag}: first-stage false accepts per hour per keyword, every event counted "
            f"({hours:.2f} h)", both["first_stage_fa_per_hour"], "FA/h", proto_name,
            round(float(np.mean([r[5] for r in res]) / hours), 3)),
        row("kws_fewshot", f"{tag}: two-stage (time-order verifier) false-reject rate", both["two_stage_frr"], "%",
            first, both["first_stage_frr"], ratio=None, per_voice=per_voice, ci95=ci["frr"]),
        *fa_rows(res, hours, neg, f"{tag}: "),
        row("kws_fewshot", f"{tag}: two-stage keyword models over 0.5 FA/h on negative speech",
            int(sum(f > 0.5 for f in neg["two"])), "count", first, int(sum(f > 0.5 for f in neg["one"])), ratio=None),
    ]


def main():
    from edge.bundle import load_bundle
    from edge.enroll import negative_bank
    from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys

    from bench.common import RESULTS

    root = D.cache_dir()
    audio = D.render_audio(root / "audio.npz")
    km = KeywordModel(load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys()))
    emb, ends, hours, frames = D.stream_cache(km, audio, root)
    emb = emb.astype(np.float32)
    bank = negative_bank(km.bundle)
    stream = {"emb": emb, "unit": emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12),
              "ends": ends, "frames": frames,
              "bank_unit": bank / np.maximum(np.linalg.norm(bank, axis=1, keepdims=True), 1e-12)}
    pieces = [audio[k] for k in sorted(audio) if k.startswith("neg|")]
    pos_voices, _ = D.eval_voices()
    res, models, fa = S.evaluate_keywords(km, pos_voices, audio, pieces, stream, np.random.default_rng(11))
    rows = first_stage_rows(res, hours)
    rows += S.check_counter(km, audio, models, res, frames)
    curve = S.operating_curve(models, hours)
    rows += S.curve_rows(curve, "")
    rows += fa_source_rows((audio, fa["times"], fa["phrases"], root))
    rows += two_stage_rows(res, models, hours, (audio, fa["times2"], fa["phrases2"], root), km,
                           negative_rates(audio, root, res, fa, hours))
    curve2 = S.operating_curve(models, hours, two_stage=True)
    rows += S.curve_rows(curve2, "two-stage ")
    (root / "per_keyword.json").write_text(json.dumps(res, default=str, indent=0))

    ind_audio = D.render_independent(root / f"audio-independent-{D.INDEPENDENT_RENDER_SEED}.npz",
                                     D.INDEPENDENT_RENDER_SEED)
    ind_res, _, ind_fa = S.evaluate_keywords(km, D.independent_voices(), ind_audio, pieces, stream,
                                        np.random.default_rng(D.INDEPENDENT_SNIPPET_SEED))
    rows += independent_rows(ind_res, hours, negative_rates(audio, root, ind_res, ind_fa, hours))
    (root / "per_keyword_independent.json").write_text(json.dumps(ind_res, default=str, indent=0))

    fresh_audio = D.render_independent(root / f"audio-fresh-{D.FRESH_RENDER_SEED}.npz", D.FRESH_RENDER_SEED,
                                       D.fresh_voices(), "fresh")
    fr_res, _, fr_fa = S.evaluate_keywords(km, D.fresh_voices(), fresh_audio, pieces, stream,
                                           np.random.default_rng(D.FRESH_SNIPPET_SEED))
    rows += independent_rows(fr_res, hours, negative_rates(audio, root, fr_res, fr_fa, hours), FRESH_TAG,
                             {"render_seed": D.FRESH_RENDER_SEED, "snippet_seed": D.FRESH_SNIPPET_SEED})
    (root / "per_keyword_fresh.json").write_text(json.dumps(fr_res, default=str, indent=0))

    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "kws_fewshot_curve.json").write_text(json.dumps({"first_stage": curve, "two_stage": curve2}))
    S.plot_curve(curve, RESULTS / "kws_fewshot_det.png", curve2)
    write_results("kws_fewshot", rows)
    return rows


if __name__ == "__main__":
    main()
