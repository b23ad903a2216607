"""The speaker-recipe rows of the ``kws_base`` bench: each Flite voice adapted with the speaker
recipe (``edge.adapt.recipe``) in a fresh state, scored before and after on the same streams.

``speaker_rows`` adapts one state per voice (``adapt_speaker``: ``Device.adapt(recipe="speaker",
ambient=...)``, what ``device adapt --recipe speaker --ambient WAV...`` calls), then streams the
voice's test renders and the negative speech through the adapted tail alone and through both
stages (``Device.detector``, what ``device detect`` runs); ``bench/kws_base.py``'s docstring says
what is measured and why. ``state_model`` is the model detection runs on an adapted state.

    >>> rows, report = speaker_rows(bundle, km, streams, test, syn, room_wav, tmp)
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from bench import _base_streams as B
from bench import _realspeech as R
from bench.common import row
from edge.adapt.recipe import SPEAKER
from edge.detect import Detector, detect_pcm
from host.data.words import COMMANDS10

NOISY_FA_SNRS = (20, 10)  # the real-speech test half also under noise (white, pink, babble) at these SNRs
SPEAKER_THRESHOLDS = (0.7, 0.9)  # first-stage thresholds of the two-stage rows; 0.7 chosen on development data


def adapt_speaker(bundle, voice, ambient_wavs, tmp, **options):
    """A fresh state adapted with the speaker recipe (``edge.adapt.recipe``: ``device adapt --recipe
    speaker --ambient WAV...``) from the same 3 clips per command of ``voice`` plus 10 s of room noise,
    with the ambient windows of ``ambient_wavs`` (audio the device heard that says no command) as
    ``_unknown_``; in a new folder under ``tmp`` (the run's scratch folder)."""
    from edge.device import Device
    from edge.features import fit_to_window

    clips = B.adapt_clips(voice, silence=10)
    windows = np.stack([fit_to_window(c.pcm) for c in clips])
    state = Path(tempfile.mkdtemp(prefix=f"{voice}_speaker_", dir=tmp)) / "state"
    t0 = time.process_time()
    res = Device(state, bundle).adapt((windows, [c.word for c in clips]), recipe="speaker", ambient=ambient_wavs,
                                      force=True, **options)
    res["cpu_s"] = time.process_time() - t0
    return state, res


def negative_fa(km, thresholds, pcm) -> dict:
    """Events on a stream that says no command at all (every event is a false accept)."""
    evs = detect_pcm(Detector(km, threshold=thresholds), pcm)
    hours = len(pcm) / 16000 / 3600
    return {"fa": len(evs), "hours": hours, "fa_per_hour": len(evs) / hours,
            "keywords": sorted({e["keyword"] for e in evs})}


def speaker_rows(bundle, km, streams, test, syn, room, tmp) -> tuple[list[dict], dict]:
    """The speaker recipe per voice, before and after: the adapted tail alone at 0.7, and with the
    commands' second stage (``edge.adapt.verified``) at 0.7 (the recipe's operating point, chosen on
    development data) and 0.9; false accepts on the Allison test half, on the voice's own other
    speech and on synthetic sentences (none of them heard while adapting). ``room``: a WAV of the
    place's keyword-free speech, heard while adapting; ``tmp``: the run's scratch folder."""
    from edge.adapt.store import AdaptStore
    from edge.device import Device
    from host.data.synth import pcm_to_wav_bytes

    rows, report = [], {}
    test_pcm, test_spans = R.concat(test)
    pool = B.babble_pool()
    noisy_test = {snr: B.noisy_speech(test_pcm, test_spans, snr, seed=500 + snr, pool=pool) for snr in NOISY_FA_SNRS}
    for v in B.VOICES:
        own = Path(tmp) / f"{v}_own_speech.wav"
        own.write_bytes(pcm_to_wav_bytes(B.other_speech(v, n=200, seed=8, half=1)))  # heard before adapting
        said = B.other_speech(v, n=300, seed=7, half=0)  # scored: other words than the ambient's
        state, res = adapt_speaker(bundle, v, [room, str(own)], tmp)
        tm = state_model(bundle, state)
        assert AdaptStore(state, bundle).load() and res["verified"] == sorted(COMMANDS10)
        before = B.score_positives(detect_pcm(Detector(km), streams[(v, None)][0]), *streams[(v, None)][1:])
        before_own = negative_fa(km, 0.7, said)
        dets = {"first stage only, at 0.7": lambda: Detector(tm, threshold=0.7)}
        for thr in SPEAKER_THRESHOLDS:
            # what `device detect` runs on the adapted state (Device.detector: both stages)
            dets[f"two-stage, at {thr:g}"] = lambda thr=thr: Device(state, bundle).detector(threshold=thr,
                                                                                           replay=False)[0]
        # the reference: the recipe as it was until 2026-12-03, without a noisy copy of each ambient window
        old_state, _ = adapt_speaker(bundle, v, [room, str(own)], tmp, noisy_ambient=False)
        reference = (f"two-stage, at {SPEAKER_THRESHOLDS[0]:g}, without the noisy ambient copies (the recipe "
                     "until 2026-12-03)")
        dets[reference] = lambda: Device(old_state, bundle).detector(threshold=SPEAKER_THRESHOLDS[0], replay=False)[0]
        report[v] = {"adapt": {k: res[k] for k in ("status", "steps_done", "n", "cpu_s", "loss_first", "loss",
                                                    "verified")},
                     "before": {"clean": before, "own_speech": before_own}}
        for label, make in dets.items():
            copies = "" if label == reference else ", each window also once more under noise"
            after = {snr: B.score_positives(detect_pcm(make(), streams[(v, snr)][0]), *streams[(v, snr)][1:],
                                            noisy=snr is not None)
                     for snr in B.SNRS}
            fa, own_fa, syn_fa = real_fa_with(make, test), negative_fa_with(make, said), negative_fa_with(make, syn)
            fa_noisy = {snr: real_fa_with(make, test, x) for snr, x in noisy_test.items()}
            report[v][label] = {"positives": after, "real_test": fa, "own_speech": own_fa, "synthetic": syn_fa,
                                **{f"real_test_{snr}db": f for snr, f in fa_noisy.items()}}
            rows.append(row(f"adapted to {v} (speaker recipe: {SPEAKER['strategy']}, {SPEAKER['optimizer']}, "
                            f"{res['steps_done']} steps; 3 clips per command x {SPEAKER['augment']} augmented + 10 s "
                            f"of room noise; ambient as _unknown_{copies}: the development half's keyword-free "
                            f"prompts + 4 min of the voice's other words), {label}, clean",
                            "streaming command recall (class-balanced)", round(after[None]["balanced"], 4),
                            "fraction", "before adapting (0.7)", round(before["balanced"], 4), ratio=None,
                            at_20db=round(after[20]["balanced"], 4), at_10db=round(after[10]["balanced"], 4),
                            **{f"at_{snr}db_by_noise": {c: round(x, 4) for c, x in after[snr]["by_noise"].items()}
                               for snr in (20, 10)},
                            real_fa_per_hour=round(fa["fa_per_hour"], 2), real_fa_examples=fa["examples"],
                            **{f"real_fa_per_hour_{snr}db": round(f["fa_per_hour"], 2) for snr, f in fa_noisy.items()},
                            in_sentence=f"{fa['in_sentence_found']}/{fa['in_sentence_said']}",
                            own_speech_fa_per_hour=round(own_fa["fa_per_hour"], 2),
                            own_speech_fa_before=round(before_own["fa_per_hour"], 2),
                            synthetic_fa_per_hour=round(syn_fa["fa_per_hour"], 2), goal=0.95,
                            cpu_ms_per_s=round(fa["cpu_ms_per_s"], 3), adapt_cpu_s=round(res["cpu_s"], 1)))
    return rows, report


def real_fa_with(make, test, pcm=None) -> dict:
    """False accepts of ``make()``'s detector on the test half (``pcm``: the same prompts with noise)."""
    clean, spans = R.concat(test)
    pcm = clean if pcm is None else pcm
    t0 = time.process_time()
    evs = detect_pcm(make(), pcm)
    cpu = time.process_time() - t0
    return {**B.false_accepts(evs, spans, test), "cpu_ms_per_s": 1000 * cpu / (len(pcm) / 16000)}


def negative_fa_with(make, pcm) -> dict:
    evs = detect_pcm(make(), pcm)
    hours = len(pcm) / 16000 / 3600
    return {"fa": len(evs), "hours": hours, "fa_per_hour": len(evs) / hours,
            "keywords": sorted({e["keyword"] for e in evs})}


def state_model(bundle, state):
    from edge.device import detection_models

    km, head = detection_models(bundle, state, "auto")
    assert head is None
    return km
