"""Experiment (issue 17, 2026-12-06, session 42): the ESPHome export's recipe for the ten base commands.

The phrase model (``host/export``: the TFLite Micro front end with its noise reduction and PCAN, a
streaming network with a 1 s receptive field, the phrase said by the corpus's 48 training voices,
word runs, sentences, near misses and one round of hard-negative mining) heard other voices of a
custom phrase three times in four where the enrolled first stage heard none ("A phrase model as the
first stage", docs/edge-runtime.md). Does the same recipe, one model per command and no user clip,
hear the base commands on voices never trained on better than the shipped model at the same real
false accepts? Development data only, as ``scripts/curve_variants.py`` compares variants: Flite
awb/rms/slt renders and streams of other seeds than bench ``kws_base``'s, the English prompts'
development half and three other speakers' prompts as real negatives, word pairs as synthetic ones.
pymicro-wakeword runs the ten exported models (``.venv-mww``); their sliding-window outputs, stacked,
are the first-stage scores ``edge.detect.trigger`` replays (no smoothing on top of ESPHome's window).

    $ .venv/bin/python scripts/base_phrase_dev.py [SEED [KNOBS_JSON TAG]]   # ~16 min training, ~5 min scoring
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _base_streams as B  # noqa: E402
from bench import _realspeech as R  # noqa: E402
from bench import esphome_export as BE  # noqa: E402
from bench.kws_base import other_real_stream, summarise, synthetic_negatives  # noqa: E402
from edge.detect import trigger  # noqa: E402
from edge.operating import calibrate  # noqa: E402
from host.data import realneg  # noqa: E402
from host.data.corpus import build_corpus  # noqa: E402
from host.data.words import COMMANDS10  # noqa: E402
from host.export import esphome as E  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from curve_variants import BUDGETS, DEV_SEEDS, best_at, load  # noqa: E402

seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
knobs = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}   # ExportConfig fields, e.g. '{"sentences": 1200}'
tag = sys.argv[3] if len(sys.argv) > 3 else ""
keep = Path(__file__).resolve().parents[1] / "build" / f"base_phrase_s{seed}{tag}"
keep.mkdir(parents=True, exist_ok=True)
tmp = Path(tempfile.mkdtemp(prefix="base_phrase_"))
corpus = build_corpus(progress=False)
models, t0 = [], time.time()
for cmd in COMMANDS10:
    d = keep / E.slug(cmd)
    if not (d / f"{E.slug(cmd)}.json").exists():
        E.export_esphome(cmd, None, d, E.ExportConfig(seed=seed, **knobs), corpus=corpus, clips=[], min_clips=0)
    models.append({"name": cmd, "config": str(d / f"{E.slug(cmd)}.json")})
print(f"trained in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)

seeds, stream_seed, syn_args = DEV_SEEDS
streams = B.voice_streams(seed=seeds, stream_seed=stream_seed)
dev = R.load_prompts(which="dev")
dev_pcm, dev_spans = R.concat(dev)
syn = synthetic_negatives(**syn_args)
others = other_real_stream(realneg.TRANSLATED)
pcms = {f"pos_{v}_{snr}": pcm for (v, snr), (pcm, _, _) in streams.items()}
pcms.update({"dev": dev_pcm, "syn": syn, "others": others[0]})
paths = []
for name, pcm in pcms.items():
    p = tmp / f"{name}.npy"
    np.save(p, np.asarray(pcm, np.int16)); paths.append(p)
res = BE.run_mww(models, paths, tmp)
names = list(COMMANDS10)


def scores(i):
    """(T, 10) sliding-window outputs of stream i and (T, 2) ends (the detection's time both)."""
    tr = [res["models"][c]["streams"][i] for c in names]
    n = min(len(t) for t, _ in tr)
    t = np.asarray(tr[0][0][:n], np.float64)
    return np.stack([np.asarray(p[:n], np.float32) for _, p in tr], axis=1), np.stack([t, t], axis=1)


cached = {k: scores(i) for i, k in enumerate(pcms)}
hours = {k: len(v) / 16000 / 3600 for k, v in pcms.items()}
trig = dict(smooth=1)


def says(k, t):
    return any(a - 0.3 <= t <= b + 1.0 and p.says(names[k]) for (a, b), p in zip(dev_spans, dev))


def point(label, thr):
    vec = np.asarray([thr[n] for n in names] if isinstance(thr, dict) else [thr] * len(names), np.float32)
    pos = summarise({key: B.score_positives(trigger(*cached[f"pos_{key[0]}_{key[1]}"], vec, names, **trig), spans, clips)
                     for key, (_, spans, clips) in streams.items()})
    fa = B.false_accepts(trigger(*cached["dev"], vec, names, **trig), dev_spans, dev)
    n_oth = len(trigger(*cached["others"], vec, names, **trig))
    return {"point": label, "recall": {c: round(r["balanced"], 4) for c, r in pos.items()},
            "per_voice_clean": pos["clean"]["per_voice"], "dev_fa_h": round(fa["fa_per_hour"], 2),
            "others_fa_h": round(n_oth / hours["others"], 2),
            "real_fa_h": round((fa["fa"] + n_oth) / (fa["hours"] + hours["others"]), 2),
            "synthetic_fa_h": round(len(trigger(*cached["syn"], vec, names, **trig)) / hours["syn"], 2),
            "examples": fa["examples"][:6], "thresholds": thr}


pts = [point(f"{t:g}", t) for t in (0.5, 0.7, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995)]
negs = [(*cached["dev"], says), (*cached["syn"], None), (*cached["others"], None)]
for target in (0.5, 2.0, 5.0, 10.0, 20.0):
    cal = calibrate(negs, hours["dev"] + hours["syn"] + hours["others"], target, names, smooth=1)
    pts.append(point(f"calibrated {target:g} FA/h", cal["thresholds"]))
for p in pts:
    print(f"{p['point']:>22}: recall " + " / ".join(f"{v:.3f}" for v in p["recall"].values())
          + f"  real {p['real_fa_h']:6.2f} FA/h (dev {p['dev_fa_h']:6.2f}, others {p['others_fa_h']:6.2f})"
          + f"  synthetic {p['synthetic_fa_h']:6.2f}  clean by voice {p['per_voice_clean']}", flush=True)
best = best_at(pts, BUDGETS, 3.65)
print("best mean recall at real development FA/h <= budget (English half <= 3.65):")
for b, p in best.items():
    print(f"  <= {b}: " + ("-" if p is None else " / ".join(f"{v:.3f}" for v in p["recall"].values())
                          + f" ({p['point']}, {p['real_fa_h']:g})"))

# Fusion: the shipped model's first stage (int8, as a device runs it) and the phrase models together.
# Their front ends, networks and data differ, so their confusions may too: each shipped window's
# score times the phrase model's highest output from 0.3 s before its end to 0.5 s after, square-rooted
# (a geometric mean on the posteriors' scale), replayed by the Detector's trigger as the shipped scores.
from edge.detect import Detector  # noqa: E402
from edge.kws import DEFAULT_BUNDLE  # noqa: E402
from edge.operating import stream_scores  # noqa: E402

_, shipped = load(str(DEFAULT_BUNDLE))
det = Detector(shipped)
assert list(det.names) == names


def fused(key):
    sc, ends, _ = stream_scores(det, pcms[key])
    P, tt = cached[key][0], cached[key][1][:, 0]
    lo = np.searchsorted(tt, ends[:, 0] - 0.3)
    hi = np.maximum(np.searchsorted(tt, ends[:, 0] + 0.5), lo + 1)
    pm = np.stack([P[a:b].max(axis=0) if b <= len(P) and a < len(P) else np.zeros(len(names), np.float32)
                   for a, b in zip(lo, hi)])
    return {"shipped": (sc, ends), "fused": (np.sqrt(sc * pm).astype(np.float32), ends)}


both = {k: fused(k) for k in pcms}
fpts = {}
for which in ("shipped", "fused"):
    cached = {k: v[which] for k, v in both.items()}
    trig = dict(smooth=2)
    fp = [point(f"{which} {t:g}", t) for t in (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)]
    negs = [(*cached["dev"], says), (*cached["syn"], None), (*cached["others"], None)]
    for target in (0.5, 2.0, 5.0, 10.0, 20.0):
        cal = calibrate(negs, hours["dev"] + hours["syn"] + hours["others"], target, names)
        fp.append(point(f"{which} calibrated {target:g} FA/h", cal["thresholds"]))
    for p in fp:
        print(f"{p['point']:>30}: recall " + " / ".join(f"{v:.3f}" for v in p["recall"].values())
              + f"  real {p['real_fa_h']:6.2f} FA/h (dev {p['dev_fa_h']:6.2f}, others {p['others_fa_h']:6.2f})"
              + f"  synthetic {p['synthetic_fa_h']:6.2f}  clean by voice {p['per_voice_clean']}", flush=True)
    fpts[which] = {"points": fp, "best": best_at(fp, BUDGETS, 3.65)}
    for b, p in fpts[which]["best"].items():
        print(f"  {which} <= {b}: " + ("-" if p is None else " / ".join(f"{v:.3f}" for v in p["recall"].values())
                                      + f" ({p['point']}, {p['real_fa_h']:g})"))
cpu = {c: res["models"][c].get("cpu_s") for c in names}
audio_s = sum(len(v) for v in pcms.values()) / 16000
print(json.dumps({"cpu_ms_per_s_each": {c: round(1000 * v / audio_s, 2) for c, v in cpu.items() if v}}))
(keep / "curve.json").write_text(json.dumps({"points": pts, "best": best, **fpts}, indent=1, default=str) + "\n")
