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
where the bundle ships them and pymicro-features is installed; the default operating point since
2026-12-06, ``edge.device_detect.default_stage``), and that default as ``device detect`` runs it on
a device with a custom keyword enrolled (``ENROLLED``: a command's candidate then waits a refractory
period for it, ``edge.detect``). Streams (``kws_base``'s):
the ten commands by Flite awb/rms/slt clean and at 20 / 10 dB, the Allison prompts' *test* half
(real speech of one US speaker; a false accept is a command on a prompt that does not say it as a
word), and the other speakers' real speech (``host.data.realneg``: Russian, Allison's Spanish).
CPU per second of audio on the real streams, the recogniser's decodes counted in; how long after
its keyword end each event on the Flite streams comes out (a second stage waits for audio past it).

    $ edgelearn bench kws_confirm        # ~10 min on 2 cores; needs the asr extra (pocketsphinx)
"""

from __future__ import annotations

import shutil
import tempfile
import time

import numpy as np

from bench import _base_streams as B
from bench import _realspeech as R
from bench.common import row, write_results
from bench.kws_base import TARGET_FA_H, other_real_stream, summarise
from edge.detect import Detector, detect_pcm


ENROLLED = "hey edge"   # the setting with a custom keyword: a phrase that starts like no command


def enrolled_state(tmp) -> str:
    """A device state in ``tmp`` with ``ENROLLED`` enrolled from 5 renders of an espeak-ng training voice."""
    from edge.device import Device
    from host.data.synth import Voice, render

    clips = render(Voice("espeak", "en-us+m3"), [(ENROLLED, r, p) for r, p in
                                                  ((0.9, 1.0), (1.0, 0.95), (1.1, 1.05), (0.95, 1.1), (1.05, 0.9))])
    Device(tmp).enroll(ENROLLED, clips)
    return tmp


def settings(km, tmp=None):
    from edge import phrase_stage
    from edge.confirm import FIRST_STAGE, AsrConfirm

    out = {"shipped at 0.7": lambda: Detector(km, threshold=0.7),
           "shipped first stage alone at its own thresholds (--no-phrase)": lambda: Detector(km),
           f"first stage at {FIRST_STAGE:g} alone": lambda: Detector(km, threshold=FIRST_STAGE),
           f"first stage at {FIRST_STAGE:g} + PocketSphinx confirms": lambda: Detector(
               km, threshold=FIRST_STAGE, asr=AsrConfirm())}
    if phrase_stage.available() and (km.bundle.manifest.get("extra") or {}).get("phrase_stage"):
        first = float(phrase_stage.config(km.bundle)["first_stage"])
        out[f"first stage at {first:g} + the phrase models confirm (the default)"] = lambda: Detector(
            km, threshold=first, asr=phrase_stage.PhraseConfirm(km.bundle))
        if tmp is not None:  # as `device detect` runs it on a device with a keyword enrolled: a command
            from edge.device import Device  # waits its refractory second for the keyword (edge/detect.py)

            state = enrolled_state(tmp)
            out[f"the default on a device with {ENROLLED!r} enrolled"] = lambda: Device(state).detector(
                replay=False)[0]
    return out


def run_stream(make, pcm, delays=None):
    """(events, CPU ms per second of audio, the detector); ``delays``: a list that gets, per event,
    how long after its keyword end it came out (s; the audio pushed so far, in 0.1 s chunks as a
    microphone delivers them, minus the event's ``time_s``)."""
    det = make()
    t0 = time.process_time()
    if delays is None:
        evs = detect_pcm(det, pcm)
    else:
        evs = []
        for start in range(0, len(pcm), 1600):
            new = det.push(pcm[start:start + 1600])
            delays += [min(start + 1600, len(pcm)) / 16000 - e["time_s"] for e in new]
            evs += new
        evs += det.flush()
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
    tmp = tempfile.mkdtemp(prefix="kws_confirm_")
    try:
        made = settings(km, tmp)
        _rows(made, streams, real_pcm, real_spans, test, other, rows, ref)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_results("kws_confirm", rows)
    return 0


def _rows(made, streams, real_pcm, real_spans, test, other, rows, ref) -> None:
    for name, make in made.items():
        delays = []
        pos = summarise({key: B.score_positives(run_stream(make, pcm, delays)[0], spans, cl)
                         for key, (pcm, spans, cl) in streams.items()})
        evs, cpu, det = run_stream(make, real_pcm)
        fa = B.false_accepts(evs, real_spans, test)
        if not ref:  # the first setting's: every row's baseline
            ref.update({"pos": pos, "fa": fa["fa_per_hour"], "cpu": cpu})
        for cond, r in pos.items():
            rows.append(row(f"{name}: Flite awb/rms/slt, {cond}", "streaming command recall (class-balanced)",
                            round(r["balanced"], 4), "fraction", "shipped at 0.7",
                            round(ref["pos"][cond]["balanced"], 4), ratio=None, per_voice=r["per_voice"],
                            plain_recall=round(r["recall"], 4), goal=0.8))
        d = np.asarray(delays) * 1000
        rows.append(row(f"{name}: event after the keyword end, p50 / p99 (Flite streams, 0.1 s chunks)",
                        "detection delay", round(float(np.percentile(d, 50)), 1), "ms", "shipped at 0.7",
                        round(ref.setdefault("delay", float(np.percentile(d, 50))), 1), ratio=None,
                        p99_ms=round(float(np.percentile(d, 99)), 1), events=len(d)))
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


if __name__ == "__main__":
    raise SystemExit(main())
