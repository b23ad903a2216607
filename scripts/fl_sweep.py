"""Experiment (issue 18): does a proximal term or a smaller server step keep the federated head closer
to the shipped model for the same gain? Development data only.

bench/fl_voices's fleet (the same 9 Flite users, examples and gate), top-k int8, its ``ROUNDS`` (18;
12 until 2026-12-02), each setting over 3 simulator schedules (seeds 0-2). Judged on development renders of the fleet's voices
(``heldout_clips`` seeds 300-302; the bench's are 100-102) and on the val split the gate scores
(10-command class-balanced recall), never on the test split or the bench's clips. Settings are
``SimConfig`` fields as JSON, e.g. FedProx's mu (``strategy_options`` reach the aggregator's
strategy; the task carries ``prox_mu`` to every client's trainer):

    $ .venv/bin/python scripts/fl_sweep.py '{"base": {}, "prox1": {"strategy": "fedprox",
          "extra": {"strategy_options": {"mu": 1.0}}}}' 3        # ~3 min of data, ~15 s a run

One JSON line per run: fleet_dev_gain and slt_dev_gain (points over the shipped model on the
fleet's voices and on Flite slt outside it, development renders), val_loss (points; negative is a
gain), rounds, published, updates uploaded per voice (joined), the gate's score per round. Measured 2026-12-02 (docs/edge-runtime.md, "The agent"): none beat plain FedAvg; not adopted.

Options: ``--streaming`` (also each final head in streams, as a user meets it: ``scripts._fl_probes.
Streaming``), ``--central`` (the pooled examples trained centrally, by which voices they hold),
``--speed LO,HI``, ``--convert SHARE,F0LO,F0HI,FMLO,FMHI|none``, ``--rehearsal-convert N``; the
positional arguments are the settings, the schedules per setting and the first simulator seed.
Every run made with it, its command and its figures: docs/fl-sweep.md.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REHEARSAL_MAX = 48  # the largest rehearsal set measured; train_loss never scores its rows
SLT_SEEDS = (303, 313, 323, 333)  # development renders of Flite slt (the bench's are seed 103)
# --central and --rehearsal-convert live in their own module
from scripts._fl_probes import Streaming, central as _central, rehearsal_converted as _rehearsal_converted  # noqa: E402


def main(argv) -> int:
    import bench.fl_voices as FV
    from bench import _realspeech as R
    from edge.bundle import load_bundle
    from edge.fl.model import head_logits
    from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys
    from host.data.words import COMMANDS10
    from host.fleet.data import extract_head, load_embeddings, rehearsal_rows
    from host.fleet.simulate import SimConfig, final_head, group_rows, simulate
    from host.fleet.voices import FLEET_VOICES, command_recall, heldout_clips, make_fleet, prepare_devices

    speed = None  # --speed LO,HI: the devices' augmented copies over another range than edge.fl.local.FL_SPEED
    if "--speed" in argv:
        i = argv.index("--speed")
        speed = tuple(float(v) for v in argv[i + 1].split(","))
        argv = argv[:i] + argv[i + 2:]
    from edge.fl.local import FL_CONVERT

    convert = FL_CONVERT  # --convert SHARE,F0LO,F0HI,FMLO,FMHI or none: another conversion, or none
    if "--convert" in argv:
        i = argv.index("--convert")
        try:
            v = [float(x) for x in argv[i + 1].split(",")] if argv[i + 1] != "none" else None
            convert = None if v is None else (v[0], (v[1], v[2]), (v[3], v[4]))
        except (IndexError, ValueError):
            raise SystemExit(f"fl_sweep: --convert {' '.join(argv[i + 1:i + 2])!r}: give SHARE,F0LO,F0HI,FMLO,FMHI "
                             "(e.g. 0.5,1.5,2.0,1.1,1.25) or none") from None
        argv = argv[:i] + argv[i + 2:]
    reh_conv = 0  # --rehearsal-convert N: the rehearsal set also carries N conversions of each of its clips
    if "--rehearsal-convert" in argv:
        i = argv.index("--rehearsal-convert")
        try:
            reh_conv = int(argv[i + 1])
            if reh_conv < 0:
                raise ValueError
        except (IndexError, ValueError):
            raise SystemExit(f"fl_sweep: --rehearsal-convert {' '.join(argv[i + 1:i + 2])!r}: give a whole "
                             "number of conversions per clip, e.g. 2") from None
        argv = argv[:i] + argv[i + 2:]
    central = "--central" in argv  # also: the pooled examples trained centrally, by which voices they hold
    streaming = "--streaming" in argv  # also: streaming recall and real false accepts at the matched point
    argv = [x for x in argv if x not in ("--central", "--streaming")]
    try:
        settings = json.loads(argv[0]) if argv else {"base": {}}
        reps = int(argv[1]) if len(argv) > 1 else 3
        first = int(argv[2]) if len(argv) > 2 else 0  # simulator seeds first .. first + reps - 1
        if not isinstance(settings, dict) or reps < 0 or first < 0:
            raise ValueError
    except ValueError:
        raise SystemExit(f"fl_sweep: {' '.join(argv)!r}: give the settings as a JSON object of SimConfig fields, "
                         "then schedules and first seed, e.g. '{\"base\": {}}' 3 0 (docstring: "
                         "scripts/fl_sweep.py)") from None
    tmp = Path(tempfile.mkdtemp(prefix="fl_sweep_"))
    bundle = load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys())
    km, labels = KeywordModel(bundle), list(bundle.labels)
    users = make_fleet(FV.DEVICES, FLEET_VOICES, seed=0, ambient_words=FV.OWN_WORDS)
    free = [p for p in R.load_prompts(which="dev") if not any(p.says(w) for w in COMMANDS10)]
    apcm, _ = R.concat(free[0::2])  # fold A, as the bench
    wins = np.stack([apcm[a:a + 16000] for a in range(0, len(apcm) - 16000, 8000)])
    wins = wins[np.sqrt((wins.astype(np.float32) ** 2).mean(1)) > 100]
    extra = [wins[np.random.default_rng([7, i]).choice(len(wins), min(FV.REAL_AMBIENT, len(wins)), replace=False)]
             for i in range(FV.DEVICES)]
    fleet = prepare_devices(users, tmp / "users", augment=8, bundle=bundle, progress=True, extra_ambient=extra,
                            speed=speed, convert=convert)
    dev, dev_clips = {}, {}
    for i, v in enumerate(FLEET_VOICES):  # development renders: seeds the bench never uses
        x, words = heldout_clips(v, seed=300 + i)
        dev_clips[v] = (x, words)
        emb = np.concatenate([km.infer(km.features(x[a:a + 256]))[0] for a in range(0, len(x), 256)])
        dev[v] = (np.asarray(emb, np.float32), np.array([labels.index(w) for w in words]))
    emb = load_embeddings(progress=False)
    va = emb.rows("val")
    val = (emb.X[va], emb.y[va].astype(np.int64))
    # the training voices' own eval clips, by synthesizer (the operator holds them): does the fleet's
    # federation pull the head away from the voices it was trained on? (never the test split)
    fams = {fam: group_rows(emb, f"train:{fam}") for fam in ("espeak", "festival")}  # the gate's own groups
    # the training voices' rows a rehearsal set may ship (``SimConfig.rehearsal_per_command`` up to
    # REHEARSAL_MAX per command, the first of one fixed shuffle) are never scored in train_loss
    shipped_rows = rehearsal_rows(emb, [labels.index(w) for w in COMMANDS10], REHEARSAL_MAX)
    train = {fam: (emb.X[r[~np.isin(r, shipped_rows)]], emb.y[r[~np.isin(r, shipped_rows)]].astype(np.int64))
             for fam, r in fams.items()}

    def train_scores(h):
        return {fam: command_recall(head_logits(h, X), y, labels)["balanced"] for fam, (X, y) in train.items()}

    def score(h):
        f = float(np.mean([command_recall(head_logits(h, X), y, labels)["balanced"] for X, y in dev.values()]))
        return f, command_recall(head_logits(h, val[0]), val[1], labels)["balanced"]

    # Flite slt, the voice outside the fleet, in development renders (the bench's are seed 103)
    # (seed 303 alone, 80 commands, until 2026-12-03; SLT_SEEDS since: 1.25 points a clip was too coarse)
    slt_x, slt_y = [], []
    for sd in SLT_SEEDS:
        x, words = heldout_clips("slt", seed=sd)
        slt_x.append(np.concatenate([km.infer(km.features(x[a:a + 256]))[0] for a in range(0, len(x), 256)]))
        slt_y.append(np.array([labels.index(w) for w in words]))
    slt = (np.concatenate(slt_x), np.concatenate(slt_y))

    def slt_score(d, res):
        return command_recall(head_logits(final_head(d, res["final_version"]), slt[0]), slt[1], labels)["balanced"]

    s0 = command_recall(head_logits(extract_head(), slt[0]), slt[1], labels)["balanced"]
    f0, v0 = score(extract_head())
    t0 = train_scores(extract_head())
    print(json.dumps({"shipped": {"fleet_dev": f0, "val": v0, "train": t0}}), flush=True)
    stream = None
    if streaming:
        fold_a = {p.name for p in free[0::2]}  # the devices' ambient speech; fold B is every other dev prompt
        stream = Streaming(km, dev_clips, [p for p in R.load_prompts(which="dev") if p.name not in fold_a])
        print(json.dumps({"shipped_streaming": stream(extract_head())}), flush=True)
    if central:
        _central(fleet, emb, labels, slt, s0, stream)
    if reh_conv:
        _rehearsal_converted(emb, km, labels, reh_conv)
    for name, over in settings.items():
        for rep in range(first, first + reps):
            base = dict(task="shipped-head", devices=FV.DEVICES, rounds=FV.ROUNDS, clients_per_round=FV.CLIENTS,
                        learning_rate=FV.LR, local_epochs=FV.EPOCHS, eval_tolerance=FV.GATE_TOLERANCE, seed=rep,
                        heldout_groups=FV.GATE_GROUPS, rehearsal_per_command=FV.REHEARSAL, round_gap=FV.ROUND_GAP,
                        codec="topk_int8", extra={"topk_fraction": FV.TOPK, **FV.GATE})
            cfg = SimConfig(**{**base, **{k: v for k, v in over.items() if k != "extra"},
                               "extra": {**base["extra"], **over.get("extra", {})}})
            t, d = time.time(), tmp / f"{name}-{rep}"
            res = simulate(cfg, d, progress=False, fleet=fleet)
            done = [r for r in res["rounds"] if r["status"] in ("closed", "rejected")]
            f, v = score(final_head(d, res["final_version"]))
            tl = {fam: round(100 * (t0[fam] - x), 2) for fam, x in train_scores(final_head(d, res["final_version"])).items()}
            print(json.dumps({"name": name, "rep": rep, "fleet_dev_gain": round(100 * (f - f0), 1),
                              "val_loss": round(100 * (v0 - v), 2), "train_loss": tl, "rounds": len(done),
                              "published": sum(r["status"] == "closed" for r in done),
                              "joined": {v: sum(n for n, f in zip(res["participation"], fleet) if f["voice"] == v)
                                         for v in FLEET_VOICES},
                              "slt_dev_gain": round(100 * (slt_score(d, res) - s0), 1),
                              "gate": [round(r["accuracy"], 4) for r in done], "s": round(time.time() - t),
                              **({"streaming": stream(final_head(d, res["final_version"]))} if stream else {})}),
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
