"""What one judgment of a candidate costs: the bundle's phrase models (two seeds, averaged) on a 2.3 s
snippet, as the base commands' second stage and a custom keyword's other voices run them
(``edge.phrase_stage``), against the same judgment with a fresh interpreter per model per snippet (the
path until 2026-12-06, session 46, which LiteRT's ``reset_all_variables`` cannot replace). Both
judge the same snippets in alternating rounds; every peak must be equal (the kept interpreters'
outputs past the warm-up are a fresh state's). The front end alone is timed too: it is the rest.

Snippets: the Allison prompts' development half, cut every 2.3 s, each judged by the next command's
models in turn.

Second, one stream's candidates on its tape (``edge.phrase_tape``, since session 47: the front end and
the models go on over audio the snippet before already covered) against each judged alone (the kept
interpreters above): the same development half as one stream, a candidate every 0.5, 1.1 (a custom
keyword opened 1 logit lower: 3,198 candidates an hour of development speech) and 2.5 s, one ensemble
(the "off" models) judging them all; CPU per second of audio, and how the peaks compare (exact on a
snippet that starts the tape; elsewhere the front end has warmed on the audio before).

    $ nice -n 5 .venv/bin/python -m bench.phrase_judgment
"""

from __future__ import annotations

import sys
import time

import numpy as np

from bench.common import row, write_results

SR = 16000
SNIPPET_S, KEYWORD_END_S, AFTER_S = 2.3, 2.0, 0.3
N, ROUNDS = 120, 5


def fresh_model(model):
    """The reference: ``model`` as ``edge.phrase_stage.PhraseModel`` ran it until session 46, a fresh
    interpreter per model per snippet (everything else the same code)."""
    from edge.phrase_stage import PhraseModel

    class Fresh(PhraseModel):
        def _interpreters(self):
            self._its = None
            return super()._interpreters()

    return Fresh(model.datas, model.name)


def snippets() -> list[np.ndarray]:
    from bench import _realspeech as R

    pcm, _ = R.concat([p for p in R.load_prompts() if p.split == "dev"])
    n = int(SNIPPET_S * SR)
    return [np.asarray(pcm[i:i + n], np.int16) for i in range(0, len(pcm) - n, n)][:N]


def main(argv=None) -> int:
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, default_trusted_keys
    from edge.phrase_stage import PhraseConfirm, features

    stage = PhraseConfirm(load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys()))
    words = sorted(stage.models)
    clips = snippets()
    fresh = {w: fresh_model(m) for w, m in stage.models.items()}
    jobs = [(stage.models[words[i % len(words)]], fresh[words[i % len(words)]], c) for i, c in enumerate(clips)]
    for m, _, c in jobs[:len(words)]:   # every kept interpreter made once, outside the timing (a device's first judgment)
        m.outputs(features(c))
    times = {"kept": [], "fresh": [], "front end": []}
    peaks = {"kept": [], "fresh": []}
    for _ in range(ROUNDS):
        for name in ("kept", "fresh", "front end"):
            t0 = time.process_time()
            got = []
            for kept, ref, c in jobs:
                f = features(c)
                if name != "front end":
                    got.append((kept if name == "kept" else ref).peak_features(f, KEYWORD_END_S, AFTER_S))
            times[name].append((time.process_time() - t0) / len(jobs) * 1e3)
            if name in peaks and not peaks[name]:
                peaks[name] = got
    ms = {k: float(np.median(v)) for k, v in times.items()}
    same = peaks["kept"] == peaks["fresh"]
    if not same:
        print("phrase_judgment: the kept interpreters' peaks differ from fresh ones", file=sys.stderr)
    name = f"a candidate's judgment (2.3 s snippet, two models averaged; {len(jobs)} Allison snippets x {ROUNDS} rounds)"
    rows = [row(name, "CPU per judgment, front end + models", round(ms["kept"], 3), "ms",
                "a fresh interpreter per model per snippet (until session 46)", round(ms["fresh"], 3),
                identical_peaks=same, front_end_ms=round(ms["front end"], 3),
                models_ms=round(ms["kept"] - ms["front end"], 3),
                baseline_models_ms=round(ms["fresh"] - ms["front end"], 3))]
    rows += stream_rows(stage.models["off"])
    write_results("phrase_judgment", rows)
    return 0 if same else 1


def stream_rows(model) -> list[dict]:
    """The tape against snippets judged alone, over the development half as one stream (module doc)."""
    from bench import _realspeech as R
    from edge.phrase_stage import snippet_peak
    from edge.phrase_tape import Tape

    pcm, _ = R.concat([p for p in R.load_prompts() if p.split == "dev"])
    pcm = np.asarray(pcm, np.int16)
    audio_s, rows = len(pcm) / SR, []
    for every in (0.5, 1.1, 2.5):
        cuts = []
        for t in np.arange(2.0, audio_s - AFTER_S, every):
            a = int(round((t - 2.0) * SR))
            cuts.append((pcm[a:int(round((t + AFTER_S) * SR))], a, (t * SR - a) / SR))
        cpu, peaks, tape = {}, {}, Tape()
        for name in ("tape", "alone"):
            t0 = time.process_time()
            peaks[name] = [tape.peak(model, c, a, e, AFTER_S) if name == "tape" else snippet_peak(model, c, e, AFTER_S)
                           for c, a, e in cuts]
            cpu[name] = (time.process_time() - t0) / audio_s * 1e3
        p, q = np.asarray(peaks["tape"]), np.asarray(peaks["alone"])
        rows.append(row(f"one stream's candidates every {every:g} s ({len(cuts)} over {audio_s / 60:.1f} min of "
                        "Allison's development half; one ensemble)", "CPU per second of audio, the stream's tape",
                        round(cpu["tape"], 3), "ms/s", "each snippet judged alone (kept interpreters)",
                        round(cpu["alone"], 3), snippets=len(cuts), fresh_starts=tape.fresh,
                        equal_peaks=int((p == q).sum()), max_abs_peak_diff=round(float(np.abs(p - q).max()), 4),
                        # at the custom keywords' cutoff, and at 0.5, where peaks of this speech fall
                        decisions_differ={str(c): int(((p >= c) != (q >= c)).sum()) for c in (0.97, 0.5)},
                        passed={str(c): {"tape": int((p >= c).sum()), "alone": int((q >= c).sum())}
                                for c in (0.97, 0.5)}))
    return rows


if __name__ == "__main__":
    sys.exit(main())
