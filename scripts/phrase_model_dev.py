"""Experiment (issue 17, 2026-12-06): the ESPHome export recipe as a custom keyword's first stage.

The recipe (`host/export`: the phrase said by the corpus's training voices + the user's 5 clips, a
streaming model on the TFLite Micro front end) trained for kws_custom's four phrases from the same
5 clips of Flite awb that `Device.enroll` gets there, and scored on kws_custom's own streams exactly
as the peers are: pymicro-wakeword runs it; "default" is the manifest's cutoff, "fair" the lowest
grid value with <= 0.5 FA/h on the synthetic negatives; then one cutoff for every phrase from 0.9
to 0.995. espeak en-us+f2, one of kws_custom's other voices, is a corpus training voice: it is taken
out of the recipe's data. Results: docs/edge-runtime.md, "A phrase model as the first stage".

    $ .venv/bin/python scripts/phrase_model_dev.py [SEED]     # ~8 min training, ~4 min scoring
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
from bench import kws_custom as K  # noqa: E402
from bench._custom_scoring import NOISY_SNRS, PHRASES, events_at, fair_thresholds, frr, score  # noqa: E402
from host.data.corpus import build_corpus  # noqa: E402
from host.export import esphome as E  # noqa: E402

out = Path(tempfile.mkdtemp(prefix="phrase_model_"))
seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
audio = K.render_audio()
streams = K.positive_streams(audio)
negs = {k.replace("/", "_"): v for k, v in audio.items() if k.startswith("neg/")}
prompts = R.load_prompts()
test, spans = R.concat([p for p in prompts if p.split == "test"])
real = {"real_test": np.asarray(test, np.int16)}
pool = B.babble_pool()
noisy = {f"real_test_{snr}db": B.noisy_speech(test, spans, snr, seed=600 + snr, pool=pool) for snr in NOISY_SNRS}
allpcm = {f"pos_{vid}_{snr}": pcm for (vid, snr), (pcm, _, _) in streams.items()}
allpcm.update({**negs, **real, **noisy})
paths = []
for name, pcm in allpcm.items():
    p = out / f"{name.replace(':', '_')}.npy"
    np.save(p, np.asarray(pcm, np.int16)); paths.append(p)
corpus = build_corpus(progress=False)
corpus.split = np.where(corpus.voice == "espeak:en-us+f2", "heldout", corpus.split)
models = []
t0 = time.time()
for ph in PHRASES:
    clips = [audio[f"enrol/{ph}/{j}"] for j in range(K.SHOTS)]
    d = out / f"s{seed}" / K.MODEL_NAMES[ph]
    if not (d / f"{K.MODEL_NAMES[ph]}.json").exists():
        E.export_esphome(ph, None, d, E.ExportConfig(seed=seed), corpus=corpus, clips=clips)
    models.append({"name": ph, "config": str(d / f"{K.MODEL_NAMES[ph]}.json")})
print(f"trained in {time.time()-t0:.0f} s", file=sys.stderr)
res = BE.run_mww(models, paths, out)
names = list(allpcm)
traces = {ph: {n: {"t": t, "p": p} for n, (t, p) in zip(names, res["models"][ph]["streams"])} for ph in PHRASES}
cut = {ph: res["models"][ph]["cutoff"] for ph in PHRASES}

def events(thr):
    def run(name, _pcm):
        ev = []
        for ph in PHRASES:
            ev += events_at(traces[ph][name], thr[ph], ph)
        return sorted(ev, key=lambda e: e["time_s"])
    return run

def summary(r):
    s = {g: {c: round(100 * frr(r, g, snrs), 1) for c, snrs in (("clean", (None,)), ("5-20", (20, 10, 5)))}
         for g in ("user", "others")}
    s["user_by_noise"] = {c: round(100 * frr(r, "user", (20, 10, 5), noise=c), 1) for c in B.COLOURS}
    s["fa"] = {k: round(v["fa_per_hour"], 2) for k, v in r["fa"].items()}
    s["by_voice_clean"] = {k.split("|")[0]: round(100 * (1 - v["recall"]), 1) for k, v in r["positives"].items() if k.endswith("|None")}
    return s

d = score(events(cut), streams, negs, real, noisy)
print(json.dumps({"seed": seed, "default": cut, **summary(d)}))
fair_thr = fair_thresholds(lambda thr: score(events(thr), {}, negs, {}), sorted(set(K.PEER_GRID) | set(cut.values())))
if fair_thr:
    f = score(events(fair_thr), streams, negs, real, noisy)
    print(json.dumps({"seed": seed, "fair": fair_thr, **summary(f)}))
else:
    print("no fair threshold")
print(json.dumps({"cpu_s": {ph: res["models"][ph].get("cpu_s") for ph in PHRASES},
                  "audio_s": sum(len(x) for x in allpcm.values()) / 16000}))
# a curve: one threshold for every phrase
for thr in (0.9, 0.95, 0.97, 0.98, 0.99, 0.995):
    r = score(events(dict.fromkeys(PHRASES, thr)), streams, negs, real, noisy)
    sm = summary(r)
    print(json.dumps({"thr": thr, "user": sm["user"], "others": sm["others"], "fa": sm["fa"],
                      "fa_kw": {k: v["keywords"] for k, v in r["fa"].items()}, "by_voice_clean": sm["by_voice_clean"]}))
