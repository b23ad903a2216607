"""Would a second stage fix the adapted tail's false accepts? Development data only.

The speaker recipe (``edge.adapt.recipe``) as the first stage, and the custom keywords' time-order
verifier (``edge.verify``: templates and noise-level thresholds from the same 3 clips per command,
every window of a candidate tried, as the Detector does for a version-6 custom keyword) as the
second, on the same 2-fold development setup as ``scripts/adapt_recipe.py``, with false accepts also
on each Allison fold under noise (white, pink, babble at ``NOISY_SNRS`` dB: ``bench._base_streams.
noisy_speech``, cached beside the clean folds). ``--verify`` is a JSON object or list of
``Verifier.calibrate`` overrides (pass targets, levels; ``version``: the verifier version to build
the entries with, default the one ``device adapt`` builds, ``edge.verify.COMMANDS_VERSION``), each
scored on the same adapted tails.

    $ .venv/bin/python scripts/adapt_verify.py --recipe '{...}' [--verify '[{}, {"pass_target": 0.9}]']
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import adapt_recipe as A  # noqa: E402

from edge import features as F  # noqa: E402

THRESHOLDS = (0.5, 0.7, 0.9, 0.95)


class _FeatShim(A._Shim):
    def scores(self, feats):
        return np.asarray(feats, np.float32).reshape(len(feats), -1), None


def stream_feats(km, pcm):
    from edge.operating import stream_scores

    f, _, _ = stream_scores(_FeatShim(km, None), pcm)
    return f.reshape(-1, 49, 10)


def build_feats(km):
    """Normalised (T, 49, 10) windows of every scored stream (the same windows as the cached backbone outputs)."""
    from bench.kws_base import synthetic_negatives

    todo = []
    pool = None
    for i, v in enumerate(A.B.VOICES):
        if A._load(f"feats_dev_{v}_clean") is None:
            pool = pool or A.B.babble_pool()
            clips = A.B.render_voice(v, seed=A.DEV_SEED + i)
            for snr in A.B.SNRS:
                pcm, _ = A.B.positive_stream(clips, snr, seed=55, pool=pool)
                todo.append((f"dev_{v}_{'clean' if snr is None else snr}", pcm))
        if A._load(f"feats_self_{v}") is None:
            todo.append((f"self_{v}", A.self_negatives(v, half=0)))
    for f in (0, 1):
        if A._load(f"feats_allison_fold{f}") is None:
            todo.append((f"allison_fold{f}", A._load(f"allison_pcm{f}")["pcm"]))
    if A._load("feats_synthetic") is None:
        todo.append(("synthetic", synthetic_negatives(n=450)))
    for name, pcm in todo:
        f = stream_feats(km, pcm)
        n = len(A._load(name)["x"])
        assert len(f) == n, (name, len(f), n)
        A._save(f"feats_{name}", f=f)
        print("feats", name, flush=True)


NOISY_SNRS = (20, 10)


def build_noisy(km, bb):
    pool = None
    for f in (0, 1):
        for snr in NOISY_SNRS:
            name = f"allison_fold{f}_{snr}"
            if A._load(name) is not None and A._load(f"feats_{name}") is not None:
                continue
            pool = pool or A.B.babble_pool()
            d, src = A._load(f"allison_pcm{f}"), A._load(f"allison_fold{f}")
            pcm = A.B.noisy_speech(d["pcm"], [tuple(s) for s in d["spans"]], snr, seed=300 + 10 * f + snr, pool=pool)
            x, ends, hours = A.stream_features(km, bb, pcm)
            A._save(name, x=x, ends=ends, hours=hours, spans=src["spans"], names=src["names"])
            A._save(f"feats_{name}", f=stream_feats(km, pcm))
            print("noisy negatives", name, flush=True)


class Second:
    """Per-command verifier entries from one voice's adaptation clips; cached decisions per window."""

    def __init__(self, bundle, km, voice, ev, cal=None):
        from edge.verify import Verifier, version_for

        cal = dict(cal or {})  # "version": e.g. 7, the noise range's 10th percentile; default the device's
        self.v = Verifier(bundle, version=cal.pop("version", version_for(bundle, commands=True)))
        self.km, self.ev = km, ev
        d = A._load(f"adaptpcm_{voice}")
        words = [str(w) for w in d["words"]]
        rng = np.random.default_rng(0)
        self.entries = []
        for w in A.COMMANDS10:
            win = d["w"][[i for i, x in enumerate(words) if x == w]]
            tpl = self.v.templates(win, km.scale)
            levels, _, _ = self.v.calibrate(win, tpl, km.scale, rng, **cal)
            self.entries.append((tpl, levels))
        self.cache = {}

    def fn(self, name):
        from edge.verify import threshold_at

        feats = self.ev._data.setdefault(f"feats_{name}", A._load(f"feats_{name}")["f"])

        def verify(k, runs):
            for r in runs:
                key = (name, k, r)
                if key not in self.cache:
                    tpl, levels = self.entries[k]
                    f = feats[r:r + 1]
                    dist = float(self.v.distance(self.v.sequences(f), tpl)[0])
                    self.cache[key] = dist <= float(threshold_at(levels, f, self.v.version)[0])
                if self.cache[key]:
                    return True
            return False

        return verify


def score(ev, sec, voice, delta, fold_):
    streams = {"allison": f"allison_fold{1 - fold_}", "self": f"self_{voice}", "syn": "synthetic",
               **{f"allison{snr}": f"allison_fold{1 - fold_}_{snr}" for snr in NOISY_SNRS}}
    sc = {k: ev.scores(delta, n) for k, n in streams.items()}
    pos = {snr: ev.scores(delta, f"dev_{voice}_{snr}") for snr in ("clean", 20, 10)}
    out = {}
    for thr in THRESHOLDS:
        for two in (False, True):
            r = {}
            for snr, s in pos.items():
                name = f"dev_{voice}_{snr}"
                d = ev.data(name)
                evs = A.emulate(s, d["ends"], thr, verify=sec.fn(name) if two else None)
                evs = [{"keyword": A.COMMANDS10[k], "time_s": t} for k, t, _ in evs]
                clips = [A.B.Clip(voice, str(w), np.zeros(0)) for w in d["words"]]
                sp = A.B.score_positives(evs, [tuple(x) for x in d["spans"]], clips, noisy=snr != "clean")
                r[f"recall_{snr}"] = sp["balanced"]
                for colour, x in sp.get("by_noise", {}).items():   # white, pink, babble: clip by clip in turn
                    r[f"recall_{snr}_{colour}"] = x
            for k, name in streams.items():
                d = ev.data(name)
                evs = A.emulate(sc[k], d["ends"], thr, verify=sec.fn(name) if two else None)
                if name.startswith("allison"):
                    prompts, spans = ev.prompts(name), [tuple(x) for x in d["spans"]]
                    evs = [e for e in evs if not any(a - 0.3 <= e[1] <= b + 1.0 and p.says(A.COMMANDS10[e[0]])
                                                     for (a, b), p in zip(spans, prompts))]
                r[f"{k}_fa"] = len(evs)
            out[f"{thr:g}{'+verify' if two else ''}"] = r
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--voices", default=",".join(A.B.VOICES))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--verify", default="{}", help="edge.verify calibrate() overrides, JSON")
    a = ap.parse_args(argv)
    from edge.adapt import Backbone
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, REPO_KEYS, KeywordModel

    bundle = load_bundle(DEFAULT_BUNDLE, trusted_keys=REPO_KEYS)
    km, bb = KeywordModel(bundle), Backbone(bundle)
    A.build(km, bb)
    build_feats(km)
    build_noisy(km, bb)
    ev = A.Evaluator(bundle, km.labels, km, bb)
    recipe = json.loads(a.recipe)
    t0 = time.time()
    voices = a.voices.split(",")
    hours = {"allison": sum(float(ev.data(f"allison_fold{f}")["hours"]) for f in (0, 1))}
    cals = json.loads(a.verify)
    cals = cals if isinstance(cals, list) else [cals]
    per = [{} for _ in cals]
    for v in voices:
        hours.update({"self": 2 * float(ev.data(f"self_{v}")["hours"]), "syn": 2 * float(ev.data("synthetic")["hours"])})
        for snr in NOISY_SNRS:
            hours[f"allison{snr}"] = hours["allison"]
        deltas = [A.adapt(ev, v, recipe, ambient_x=ev.ambient_x(f)) for f in (0, 1)]
        for c, cal in enumerate(cals):
            sec = Second(bundle, km, v, ev, cal)
            res = [score(ev, sec, v, deltas[f], f) for f in (0, 1)]
            per[c][v] = {}
            for label in res[0]:
                x, y = res[0][label], res[1][label]
                o = {k: round((x[k] + y[k]) / 2, 4) for k in x if k.startswith("recall")}
                for k in ("allison", "self", "syn", *(f"allison{snr}" for snr in NOISY_SNRS)):
                    o[f"{k}_fa_h"] = round((x[f"{k}_fa"] + y[f"{k}_fa"]) / hours[k], 2)
                per[c][v][label] = o
    for cal, pc in zip(cals, per):
        mean = {lab: {k: round(float(np.mean([pc[v][lab][k] for v in voices])), 4) for k in pc[voices[0]][lab]}
                for lab in pc[voices[0]]}
        line = json.dumps({"recipe": recipe, "verify": cal, "mean": mean, "per_voice": pc,
                           "seconds": round(time.time() - t0, 1)})
        print(line, flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
