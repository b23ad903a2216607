"""Experiment (issue 17, session 44): let the phrase stage name the command, not only confirm it.

At the default's first stage (0.2) the Detector opens a candidate for the command furthest over its
threshold, and the phrase stage judges only that command: a "down" whose first window scores "go"
highest is judged as "go" (and may pass as "go") or lost. Here every candidate is judged by all
ten commands' phrase models (the bundle's two seeds averaged) and named by the command furthest
over its own cutoff. Cutoffs per rule are calibrated as the shipped ones are (``host/phrase_stage.py``:
the development negatives, 0.5 FA/h split over the commands); for "any", command c's false accepts
are counted as every negative candidate whose c-peak reaches the cutoff (an upper bound: the naming
can give a candidate to another command). Development data only (``curve_variants.DEV_SEEDS``).

    $ .venv/bin/python scripts/base_phrase_anycmd.py        # ~10 min
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import _base_streams as B  # noqa: E402
from bench.kws_base import summarise  # noqa: E402
from curve_variants import DEV_SEEDS  # noqa: E402
from edge import phrase_calibrate as PC  # noqa: E402
from edge.bundle import load_bundle  # noqa: E402
from edge.detect import Detector  # noqa: E402
from edge.kws import DEFAULT_BUNDLE, REPO_KEYS, KeywordModel  # noqa: E402
from edge.phrase_stage import SAMPLE_RATE, PhraseConfirm, features  # noqa: E402
from host import phrase_stage as HP  # noqa: E402

bundle = load_bundle(DEFAULT_BUNDLE, trusted_keys=REPO_KEYS)
km = KeywordModel(bundle)
pc = PhraseConfirm(bundle)
CMDS = list(pc.cutoffs)


class AllPeaks:
    """``peak`` gives {command: peak} for every command's models on the snippet."""
    first_stage, before_s, after_s = pc.first_stage, pc.before_s, pc.after_s

    def peak(self, word, pcm, keyword_end_s):
        pcm = np.asarray(pcm, np.int16)
        short = int(round((keyword_end_s + self.after_s) * SAMPLE_RATE)) - len(pcm)
        if short > 0:
            pcm = np.concatenate([pcm, np.zeros(short, np.int16)])
        f = features(pcm)
        return {c: pc.models[c].peak_features(f, keyword_end_s, self.after_s) for c in CMDS}


t0 = time.time()
seeds, stream_seed, _ = DEV_SEEDS
streams = B.voice_streams(seed=seeds, stream_seed=stream_seed)
negs, what = HP.development_negatives()
det_for = (lambda rec: Detector(km, threshold=pc.first_stage, asr=rec))
pos = {k: PC.record(det_for, AllPeaks(), [[pcm]])[0] for k, (pcm, _, _) in streams.items()}
neg = [(PC.record(det_for, AllPeaks(), [[pcm]])[0], false) for pcm, false in negs]
hours = sum(len(p) for p, _ in negs) / SAMPLE_RATE / 3600
print(f"candidates in {time.time() - t0:.0f} s: {sum(map(len, pos.values()))} positive, "
      f"{sum(len(e) for e, _ in neg)} negative ({hours * 60:.0f} min: {what})", file=sys.stderr, flush=True)


def own(evs):
    """Each candidate judged as its own command (the default)."""
    return [{**e, "phrase": e["phrase"][e["keyword"]]} for e in evs]


def as_command(evs, c):
    """Every candidate as command ``c`` (for calibrating "any")."""
    return [{**e, "keyword": c, "phrase": e["phrase"][c]} for e in evs]


def named(evs, cut, among=None):
    """Each candidate named by the command furthest over its cutoff (``among``: how many commands by
    margin to consider, None: all); dropped where none reaches its cutoff."""
    out = []
    for e in evs:
        m = {c: p - cut[c] for c, p in e["phrase"].items()}
        best = max(m, key=m.get)
        if m[best] >= 0:
            out.append({**e, "keyword": best, "phrase": 1.0})
    return out


def score(events_of):
    res = summarise({k: B.score_positives(PC.refractory(events_of(pos[k])), spans, clips)
                     for k, (_, spans, clips) in streams.items()})
    fa = {}
    for (evs, false), (pcm, _) in zip(neg, negs):
        got = PC.refractory(events_of(evs))
        fa[len(fa)] = sum(1 for e in got if false is None or false(e))
    return {c: round(r["balanced"], 4) for c, r in res.items()}, round(sum(fa.values()) / hours, 2)


out = {}
for target in (0.5, 2.0):
    cut_own, _ = PC.cutoffs([(own(e), f) for e, f in neg], hours, CMDS, pc.first_stage, target)
    out[f"own {target}"] = score(lambda evs: [e for e in own(evs) if e["phrase"] >= cut_own[e["keyword"]]])
    cut_any = {}
    for c in CMDS:
        x, _ = PC.cutoffs([(as_command(e, c), f) for e, f in neg], hours, [c], pc.first_stage, target / len(CMDS))
        cut_any[c] = x[c]
    out[f"any {target}"] = score(lambda evs: named(evs, cut_any))
    out[f"any {target} (own cutoffs)"] = score(lambda evs: named(evs, cut_own))
    print(target, "own", cut_own, "any", cut_any, file=sys.stderr)
out["shipped cutoffs, own"] = score(lambda evs: [e for e in own(evs) if e["phrase"] >= pc.cutoffs[e["keyword"]]])
out["shipped cutoffs, any"] = score(lambda evs: named(evs, pc.cutoffs))
ceiling = summarise({k: B.score_positives(own(pos[k]), spans, clips) for k, (_, spans, clips) in streams.items()})
out["a candidate of the right command at 0.2 (the ceiling)"] = ({c: round(r["balanced"], 4) for c, r in ceiling.items()},
                                                                  None)
# the negatives that set each command's shipped cutoff: its highest peaks on them (what it confuses)
from host.data import realspeech  # noqa: E402

dev = realspeech.load_prompts(which="dev")
_, dev_spans = realspeech.concat(dev)
names = ["the English development half", "synthetic word pairs", "other speakers' prompts"]
for c in CMDS:
    top = sorted(((e["phrase"][c], i, e) for i, (evs, false) in enumerate(neg) for e in evs
                  if e["keyword"] == c and (false is None or false(e))), key=lambda x: -x[0])[:3]
    said = []
    for peak, i, e in top:
        where = names[i]
        if i == 0:
            where = next((f'"{p.text}"' for (a, b), p in zip(dev_spans, dev) if a - 0.3 <= e["time_s"] <= b + 1.0),
                         where)
        said.append(f"{peak:.3f} at {e['time_s']:.1f} s ({where})")
    print(f"{c:>5} (cutoff {pc.cutoffs[c]}): " + "; ".join(said))
for k, (rec, fa) in out.items():
    print(f"{k:>28}: {' / '.join(f'{v:.3f}' for v in rec.values())}  dev negatives {fa} FA/h")
Path("build/anycmd.json").write_text(json.dumps({k: {"recall": r, "fa_h": f} for k, (r, f) in out.items()}, indent=1))
