"""Experiment (issue 17, 2026-12-06, session 42): the phrase models as the base commands' second stage.

``scripts/base_phrase_dev.py`` trained the ESPHome recipe once per command (no user clip) and found
that, run continuously and fused with the shipped model's scores, they cut the shipped model's
false accepts on real speech more than its hits. A device would run them as ``device detect
--asr`` runs PocketSphinx: only on the first stage's candidates (``edge.detect.Detector``'s ``asr``
hook: the audio around a candidate), with a fresh TFLite Micro front end on that snippet. This
replays exactly that on the development data ``base_phrase_dev.py`` used: the shipped int8 model's
first-stage candidates at ``FIRST`` (``edge.detect.trigger`` without the refractory period, which
the Detector starts only at an accepted event), each candidate's snippet (``PRE_S`` before its
keyword end to ``POST_S`` after) through a fresh front end (``host.export.frontend.features``) and
the command's streaming model (LiteRT, state fresh), the highest sliding-window mean (ESPHome's
window of 5) whose window ends from ``LO_S`` before the keyword end to ``POST_S`` after, then two
rules: the phrase model's peak >= P; or the geometric mean of the first stage's peak and it >= T.

    $ .venv/bin/python scripts/base_phrase_cascade.py [SEED] [--continuous] [--bench] [--post=S] [--ensemble=s0,s1]
          [--sliding=N] [--lo=S] [--first=T,T]
      # --bench: kws_base's streams, once
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import _base_streams as B  # noqa: E402
from bench import _realspeech as R  # noqa: E402
from bench.kws_base import other_real_stream, summarise, synthetic_negatives  # noqa: E402
from host.phrase_stage import calibrate  # noqa: E402
from curve_variants import BENCH_SEEDS, BUDGETS, DEV_SEEDS, best_at, load  # noqa: E402
from edge.detect import Detector, trigger  # noqa: E402
from edge.kws import DEFAULT_BUNDLE  # noqa: E402
from edge.operating import stream_scores  # noqa: E402
from edge.phrase_stage import PhraseModel  # noqa: E402
from host.data import realneg  # noqa: E402
from host.data.words import COMMANDS10  # noqa: E402
from host.export import frontend as FE  # noqa: E402

FIRST = (0.2, 0.3, 0.4, 0.5)
PRE_S, POST_S, LO_S = 2.0, 0.5, 0.3
P_GRID = (0.5, 0.7, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995)
T_GRID = (0.4, 0.5, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9)
SR = 16000

args = [a for a in sys.argv[1:] if not a.startswith("--")]
bench = "--bench" in sys.argv
continuous = "--continuous" in sys.argv   # the front end on the whole stream (a device would run it always)
seed = int(args[0]) if args else 0
tag = next((a[len("--tag="):] for a in sys.argv[1:] if a.startswith("--tag=")), "")   # base_phrase_dev.py's TAG
# --post=S: how long after the keyword end the snippet (and the windows judged) reach: the detection's wait
POST_S = float(next((a[len("--post="):] for a in sys.argv[1:] if a.startswith("--post=")), POST_S))
# --sliding=N, --lo=S (session 44): the sliding window of outputs (ESPHome's 5) and how long before the
# keyword end a judged window may end (0.3), for an ensemble (``--ensemble``)
SLIDE = int(next((a[len("--sliding="):] for a in sys.argv[1:] if a.startswith("--sliding=")), 5))
LO_S = float(next((a[len("--lo="):] for a in sys.argv[1:] if a.startswith("--lo=")), LO_S))
# --first=0.1,0.15,0.2: the first-stage thresholds compared (default FIRST)
FIRST = tuple(float(x) for x in next((a[len("--first="):] for a in sys.argv[1:] if a.startswith("--first=")),
                                     ",".join(map(str, FIRST))).split(","))
root = Path(__file__).resolve().parents[1] / "build" / f"base_phrase_s{seed}{tag}"
names = list(COMMANDS10)


# --ensemble=TAG,TAG: the mean of several trained sets' per-inference outputs (build/base_phrase_s<SEED><TAG>
# for "s1", "s0_more", ...) before ESPHome's sliding window: what one model averaging them would give
ensemble = next((a[len("--ensemble="):].split(",") for a in sys.argv[1:] if a.startswith("--ensemble=")), None)


class Phrase:
    """The command's exported model(s) as ``edge.phrase_stage.PhraseConfirm`` runs it (fresh state per snippet)."""

    def __init__(self, paths):
        self.models = [PhraseModel(p.read_bytes(), p.stem) for p in paths]

    def peak(self, feats: np.ndarray, t_rel: float) -> float:
        if len(self.models) == 1:
            return self.models[0].peak_features(feats, t_rel, POST_S)
        from edge.phrase_stage import RECEPTIVE_S, STEP, STRIDE
        SLIDING = SLIDE
        outs = [m.outputs(feats) for m in self.models]
        out, ends = np.mean([o for o, _ in outs], axis=0), outs[0][1]
        if len(out) < SLIDING:
            return 0.0
        mean = np.convolve(out, np.ones(SLIDING) / SLIDING, mode="valid")
        e = ends[SLIDING - 1:]
        ok = (e >= RECEPTIVE_S + (SLIDING - 1) * STRIDE * STEP / SR) & (e >= t_rel - LO_S) & (e <= t_rel + POST_S)
        return float(mean[ok].max()) if ok.any() else 0.0


roots = [root] if ensemble is None else [root.parent / f"base_phrase_{t}" for t in ensemble]
phrase = {c: Phrase([r / c / f"{c}.tflite" for r in roots]) for c in names}
_, shipped = load(str(DEFAULT_BUNDLE))
det = Detector(shipped)
seeds, stream_seed, syn_args = BENCH_SEEDS if bench else DEV_SEEDS
streams = B.voice_streams(seed=seeds, stream_seed=stream_seed)
if bench:
    dev = R.load_prompts(which="test")
    others = other_real_stream()            # bench kws_base's other speakers (Russian, Allison's Spanish)
else:
    dev = R.load_prompts(which="dev")
    others = other_real_stream(realneg.TRANSLATED)
dev_pcm, dev_spans = R.concat(dev)
syn = synthetic_negatives(**syn_args)
pcms = {f"pos_{v}_{snr}": pcm for (v, snr), (pcm, _, _) in streams.items()}
pcms.update({"dev": dev_pcm, "syn": syn, "others": others[0]})
hours = {k: len(v) / SR / 3600 for k, v in pcms.items()}

cands = {}
for key, pcm in pcms.items():
    sc, ends, _ = stream_scores(det, pcm)
    evs = trigger(sc, ends, min(FIRST), names, refractory_s=0.0)
    whole = FE.features(pcm) if continuous else None
    for e in evs:
        t = e["time_s"]
        a, b = max(0, int((t - PRE_S) * SR)), min(len(pcm), int((t + POST_S) * SR))
        if continuous:  # the front end ran on the whole stream: frame i's window starts at sample 160 i
            fa, fb = -(-a // 160), (b - 480) // 160 + 1
            e["phrase"] = phrase[e["keyword"]].peak(whole[fa:fb], t - fa * 160 / SR)
        else:
            e["phrase"] = phrase[e["keyword"]].peak(FE.features(pcm[a:b]), t - a / SR)
    cands[key] = evs
    print(key, len(evs), "candidates", file=sys.stderr, flush=True)


def accepted(key, first, rule, x):
    """``x``: one value for every command, or {command: value} (calibrated)."""
    def thr(e):
        return x[e["keyword"]] if isinstance(x, dict) else x
    out = [e for e in cands[key] if e["score"] >= first and
           (e["phrase"] >= thr(e) if rule == "P" else np.sqrt(e["score"] * e["phrase"]) >= thr(e))]
    return B.refractory(out, 1.0)


def false_on_dev(e) -> bool:
    return not any(a - 0.3 <= e["time_s"] <= b + 1.0 and p.says(e["keyword"]) for (a, b), p in zip(dev_spans, dev))


def calibrated(first, target):
    """Per command, the lowest phrase cutoff within its share of ``target`` false accepts per hour on
    the negatives (dev + synthetic + others): ``scripts/build_phrase_stage.py``'s rule."""
    negs = [(cands["dev"], false_on_dev), (cands["syn"], None), (cands["others"], None)]
    return calibrate(negs, hours["dev"] + hours["syn"] + hours["others"], names, first, target)[0]


def point(first, rule, x):
    pos = summarise({key: B.score_positives(accepted(f"pos_{key[0]}_{key[1]}", first, rule, x), spans, clips)
                     for key, (_, spans, clips) in streams.items()})
    fa = B.false_accepts(accepted("dev", first, rule, x), dev_spans, dev)
    n_oth = len(accepted("others", first, rule, x))
    return {"point": f"first {first:g} {rule} {x if isinstance(x, dict) else f'{x:g}'}", "recall": {c: round(r["balanced"], 4) for c, r in pos.items()},
            "per_voice_clean": pos["clean"]["per_voice"], "dev_fa_h": round(fa["fa_per_hour"], 2),
            "others_fa_h": round(n_oth / hours["others"], 2),
            "real_fa_h": round((fa["fa"] + n_oth) / (fa["hours"] + hours["others"]), 2),
            "synthetic_fa_h": round(len(accepted("syn", first, rule, x)) / hours["syn"], 2),
            "examples": fa["examples"][:6]}


pts = []
for first in FIRST:
    pts += [point(first, "P", p) for p in P_GRID] + [point(first, "T", t) for t in T_GRID if t * t >= first - 1e-9]
pts += [point(first, "P", 0.0) for first in (0.6, 0.7, 0.8, 0.9)]   # the first stage alone
if not bench:
    for first in FIRST:
        for target in (0.5, 2.0, 5.0):
            cal = calibrated(first, target)
            pts.append({**point(first, "P", cal), "point": f"first {first:g} P calibrated {target:g}", "cutoffs": cal})
for p in pts:
    print(f"{p['point']:>20}: recall " + " / ".join(f"{v:.3f}" for v in p["recall"].values())
          + f"  real {p['real_fa_h']:6.2f} FA/h ({'test' if bench else 'dev'} {p['dev_fa_h']:6.2f}, others {p['others_fa_h']:6.2f})"
          + f"  synthetic {p['synthetic_fa_h']:6.2f}  clean by voice {p['per_voice_clean']}", flush=True)
best = best_at(pts, BUDGETS, 3.65)
for b, p in best.items():
    print(f"  <= {b}: " + ("-" if p is None else " / ".join(f"{v:.3f}" for v in p["recall"].values())
                          + f" ({p['point']}, {p['real_fa_h']:g})"))
(root / f"cascade{'_bench' if bench else ''}{'_cont' if continuous else ''}"
 f"{'' if POST_S == 0.5 else f'_post{POST_S:g}'}{'' if ensemble is None else '_ens_' + '+'.join(ensemble)}"
 f"{'' if SLIDE == 5 else f'_w{SLIDE}'}{'' if LO_S == 0.3 else f'_lo{LO_S:g}'}"
 f"{'' if FIRST == (0.2, 0.3, 0.4, 0.5) else '_first' + '+'.join(map(str, FIRST))}.json").write_text(json.dumps({"points": pts, "best": best}, indent=1,
                                                                            default=str) + "\n")
