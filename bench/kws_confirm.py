"""The base commands with a second stage (the Pi tier): a real-speech recogniser, and the bundle's
phrase models, beside the shipped detector at 0.7 and at its default, on bench ``kws_base``'s streams.

``edge.confirm``: the first stage runs at ``FIRST_STAGE`` (0.3) instead of 0.7, and each
base-keyword candidate stands only if PocketSphinx's full-vocabulary decode of its audio is the
command alone (the rule, the decoder's beams and 0.3 were chosen on development data by
``scripts/asr_stage.py``; nothing here was looked at while choosing). In one run, the real ``Detector`` (``Device.detector``'s
path) for three settings: the shipped model at 0.7 (today's default, the reference), at 0.3 alone
(what the recogniser has to clean up), at 0.3 with the recogniser, and at the bundle's phrase
stage's first stage (0.3) with the phrase models (``edge.phrase_stage``: one model per command on
TFLite Micro's front end; cutoffs chosen on development data by ``scripts/build_phrase_stage.py``;
where the bundle ships them and pymicro-features is installed). Streams (``kws_base``'s):
the ten commands by Flite awb/rms/slt clean and at 20 / 10 dB, the Allison prompts' *test* half
(real speech of one US speaker; a false accept is a command on a prompt that does not say it as a
word), and the other speakers' real speech (``host.data.realneg``: Russian, Allison's Spanish).
CPU per second of audio on the real streams, the recogniser's decodes counted in.

    $ edgelearn bench kws_confirm        # ~10 min on 2 cores; needs the asr extra (pocketsphinx)
"""

from __future__ import annotations

import time

import numpy as np

from bench import _base_streams as B
from bench import _realspeech as R
from bench.common import row, write_results
from bench.kws_base import TARGET_FA_H, other_real_stream, summarise
from edge.detect import Detector, detect_pcm


def settings(km):
    from edge import phrase_stage
    from edge.confirm import FIRST_STAGE, AsrConfirm

    out = {"shipped at 0.7": lambda: Detector(km, threshold=0.7),
           "shipped at its default operating point": lambda: Detector(km),
           f"first stage at {FIRST_STAGE:g} alone": lambda: Detector(km, threshold=FIRST_STAGE),
           f"first stage at {FIRST_STAGE:g} + PocketSphinx confirms": lambda: Detector(
               km, threshold=FIRST_STAGE, asr=AsrConfirm())}
    if phrase_stage.available() and (km.bundle.manifest.get("extra") or {}).get("phrase_stage"):
        first = float(phrase_stage.config(km.bundle)["first_stage"])
        out[f"first stage at {first:g} + the phrase models confirm (--phrase)"] = lambda: Detector(
            km, threshold=first, asr=phrase_stage.PhraseConfirm(km.bundle))
    return out


def run_stream(make, pcm):
    det = make()
    t0 = time.process_time()
    evs = detect_pcm(det, pcm)
    cpu = time.process_time() - t0
    return evs, 1000 * cpu / (len(pcm) / 16000), det


def main(argv=None) -> int:
    from edge.bundle import load_bundle
    from edge.confirm import available
    from edge.kws import DEFAULT_BUNDLE, REPO_KEYS, KeywordModel

    reason = R.missing_reason()
    if reason or not available():
        print(f"kws_confirm: {reason or 'PocketSphinx is not installed (pip install .[asr])'}")
        return 1
    km = KeywordModel(load_bundle(DEFAULT_BUNDLE, trusted_keys=REPO_KEYS))
    test = R.load_prompts(which="test")
    streams = B.voice_streams()  # kws_base's streams
    real_pcm, real_spans = R.concat(test)
    other = other_real_stream()
    rows, ref = [], {}
    for name, make in settings(km).items():
        pos = summarise({key: B.score_positives(run_stream(make, pcm)[0], spans, cl)
                         for key, (pcm, spans, cl) in streams.items()})
        evs, cpu, det = run_stream(make, real_pcm)
        fa = B.false_accepts(evs, real_spans, test)
        if not ref:
            ref = {"pos": pos, "fa": fa["fa_per_hour"], "cpu": cpu}
        for cond, r in pos.items():
            rows.append(row(f"{name}: Flite awb/rms/slt, {cond}", "streaming command recall (class-balanced)",
                            round(r["balanced"], 4), "fraction", "shipped at 0.7",
                            round(ref["pos"][cond]["balanced"], 4), ratio=None, per_voice=r["per_voice"],
                            plain_recall=round(r["recall"], 4), goal=0.8))
        rows.append(row(f"{name}: real speech (Allison, test half, {fa['hours'] * 60:.1f} min)",
                        "false accepts per hour", round(fa["fa_per_hour"], 2), "FA/h", "shipped at 0.7",
                        round(ref["fa"], 2), ratio=None, goal=TARGET_FA_H,
                        in_sentence=f"{fa['in_sentence_found']}/{fa['in_sentence_said']}", examples=fa["examples"],
                        rejected=det.rejected, decoded=getattr(det.asr, "decoded", 0)))
        rows.append(row(f"{name}: CPU per second of audio (real test half, recogniser included)",
                        "CPU time per second of audio", round(cpu, 3), "ms", "shipped at 0.7", round(ref["cpu"], 3),
                        ratio=ref["cpu"] / cpu if cpu else None,
                        decoded_s=round(getattr(det.asr, "seconds", 0.0), 1)))
        if other is not None:
            evs, cpu_o, det_o = run_stream(make, other[0])
            rows.append(row(f"{name}: real speech, other speakers ({other[2]}, {other[1] * 60:.0f} min, never trained on)",
                            "false accepts per hour", round(len(evs) / other[1], 2), "FA/h", "goal", TARGET_FA_H,
                            ratio=None, cpu_ms_per_s=round(cpu_o, 3), rejected=det_o.rejected,
                            by_keyword={k: sum(e["keyword"] == k for e in evs) for k in sorted({e["keyword"] for e in evs})}))
    write_results("kws_confirm", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
