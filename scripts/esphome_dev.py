"""Experiment (issue 20): variants of the ESPHome export recipe, on development data only.

Each setting (``ExportConfig`` fields as JSON) trains a model of each phrase from the corpus + the
same 5 clips of Flite rms as ``bench/esphome_export``, and pymicro-wakeword runs them all over
development streams: positives rendered with other seeds than the bench's (Flite awb/rms/slt, clean
and at 20/10/5 dB) and the bench's *development* negatives only (the Allison development half,
half of the espeak-ng test-split voices, Flite word pairs of word-list half 1). The test negatives
and the bench's positives are never read. Per setting and phrase, one JSON line: FRR at the lowest
cutoff with <= 0.5 and <= 2 false accepts per hour on the development negatives (as the bench
chooses), the false accepts per source at the cutoff the manifest gives and at 0.995, and the
windows the recipe made.

With a third argument (sliding-window sizes, e.g. ``1,5,10``) each model's outputs are also scored
as pymicro-wakeword would average them over that many inferences (a manifest's
``sliding_window_size``), with no retraining.

``--ensemble A+B,A+B+C`` also scores the mean of those settings' per-inference outputs (then the
manifest's sliding window), what one exported model averaging their sub-networks would output.

    $ .venv/bin/python scripts/esphome_dev.py '{"base": {"real_speech": [], "telephone": 0},
          "real": {}}' ["hey jarvis,okay nabu"] [1,3,5,10]   # ~4 min of training per setting and phrase
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEV_SEED = 55   # the positives' render seed (the bench's is 5)


def window_mean(raw: np.ndarray, w: int) -> np.ndarray:
    """pymicro-wakeword's sliding-window mean of the last w outputs (0 until w outputs exist)."""
    c = np.r_[0.0, np.cumsum(raw, dtype=np.float64)]
    m = np.zeros(len(raw), np.float32)
    m[w - 1:] = (c[w:] - c[:-w]) / w
    return m


def main(argv) -> int:
    from bench import _base_streams as B
    from bench import esphome_export as BE
    from host.export import esphome as E

    ensembles = []
    if "--ensemble" in argv:
        k = argv.index("--ensemble")
        if k + 1 >= len(argv) or argv[k + 1].startswith("-"):
            raise SystemExit("esphome_dev: --ensemble needs the settings to average, e.g. --ensemble s0+s1,s0+s1+s2")
        ensembles = [e.split("+") for e in argv[k + 1].split(",")]
        argv = argv[:k] + argv[k + 2:]
    settings = json.loads(argv[0]) if argv else {"recipe": {}}
    unknown = sorted({m for e in ensembles for m in e} - set(settings))
    if unknown:
        raise SystemExit(f"esphome_dev: --ensemble names {unknown}, which are not settings ({sorted(settings)})")
    phrases = argv[1].split(",") if len(argv) > 1 and argv[1] else list(BE.PHRASES)
    windows = [int(w) for w in argv[2].split(",")] if len(argv) > 2 else []
    tmp = Path(tempfile.mkdtemp(prefix="esphome_dev_"))
    pool = B.babble_pool()
    neg = BE._negatives("dev", pool)
    hours = sum(len(x) for _n, x in neg) / 16000 / 3600
    for phrase in phrases:
        slug = BE.PHRASES[phrase]
        pos = BE._positives(phrase, pool, seed=DEV_SEED)
        streams, pos_idx, neg_idx = [], [], []
        for k, (_v, _snr, pcm, _sp) in enumerate(pos):
            streams.append(tmp / f"{slug}_pos{k}.npy")
            np.save(streams[-1], pcm)
            pos_idx.append(len(streams) - 1)
        for k, (_n, x) in enumerate(neg):
            streams.append(tmp / f"neg{k}.npy")
            np.save(streams[-1], x)
            neg_idx.append(len(streams) - 1)
        models, made = [], {}
        for name, over in settings.items():
            over = {k: tuple(v) if isinstance(v, list) else v for k, v in over.items()}
            res = E.export_esphome(phrase, None, tmp / name / slug, E.ExportConfig(**{"seed": 0, **over}),
                                   clips=BE._user_clips(phrase))
            models.append({"name": name, "config": str(res.manifest_path)})
            made[name] = (res.n_windows, res.manifest["micro"]["probability_cutoff"])
        out = BE.run_mww(models, streams, tmp)
        for name in settings:
            st = out["models"][name]["streams"]
            sc = BE._score(out["models"][name], pos, pos_idx, neg_idx, neg_idx, hours, hours)
            by_source = {c: {n: len(BE.detections(*st[i], c)) for (n, _x), i in zip(neg, neg_idx)}
                         for c in (made[name][1], 0.995)}
            print(json.dumps({"setting": name, "phrase": phrase, "dev_hours": round(hours, 3),
                              **{k: {"cutoff": v["cutoff"], "met": v["target_met_on_dev"], "frr": round(v["frr"], 1),
                                     "frr_by_snr": v["frr_by_snr"], "frr_by_voice": v["frr_by_voice"],
                                     "fa_dev": v["fa_dev"]}
                                 for k, v in sc.items() if k in ("fa<=0.5", "fa<=2", "manifest")},
                              "fa_by_source": by_source, "windows": made[name][0]}), flush=True)
            for w in windows:      # the same outputs under another sliding-window size
                res = dict(out["models"][name], streams=[(t, window_mean(r, w)) for (t, _p), r
                                                         in zip(st, out["models"][name]["raw"])])
                sc = BE._score(res, pos, pos_idx, neg_idx, neg_idx, hours, hours)
                print(json.dumps({"setting": name, "phrase": phrase, "sliding_window": w,
                                  **{k: {"cutoff": v["cutoff"], "met": v["target_met_on_dev"],
                                         "frr": round(v["frr"], 1), "frr_by_voice": v["frr_by_voice"],
                                         "fa_dev": v["fa_dev"]}
                                     for k, v in sc.items() if k in ("fa<=0.5", "fa<=2")}}), flush=True)
        for members in ensembles:     # the members' per-inference outputs averaged, then the window
            raws = [out["models"][m]["raw"] for m in members]
            w = out["models"][members[0]]["window"]
            res = dict(out["models"][members[0]],
                       streams=[(t, window_mean(np.mean([r[i] for r in raws], axis=0), w))
                                for i, (t, _p) in enumerate(out["models"][members[0]]["streams"])])
            sc = BE._score(res, pos, pos_idx, neg_idx, neg_idx, hours, hours)
            print(json.dumps({"ensemble": "+".join(members), "phrase": phrase,
                              **{k: {"cutoff": v["cutoff"], "met": v["target_met_on_dev"], "frr": round(v["frr"], 1),
                                     "frr_by_voice": v["frr_by_voice"], "fa_dev": v["fa_dev"]}
                                 for k, v in sc.items() if k in ("fa<=0.5", "fa<=2")}}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
