"""Federated rounds that improve the shipped model, on voices it never trained on (issue 18).

A fleet of ``DEVICES`` users (``host.fleet.voices``: CMU Flite's awb, rms and kal16, each user
with their own pitch and room: reverberation RT60 0.15-0.5 s, white or pink noise at 15-35 dB)
federates the shipped model's classifier head (``SimConfig(task="shipped-head")``: the real
aggregator over loopback HTTP, the real ``edge.fl.FLClient`` and ``edge.store``, each device a
real ``edge.device.Device`` state whose examples come from ``edge.fl.local.local_examples``: 4
labelled clips per command x 8 augmented (sped up or slowed down over ``FL_SPEED``, 0.9-1.35: pitch and
formants move with it; 0.9-1.12 until 2026-12-03; half of them first voice-converted to a higher pitch
and a shorter vocal tract, ``FL_CONVERT``, since 2026-12-05), 10 s of room noise as ``_silence_``, as ``_unknown_`` 90
of the user's other words and 150 1 s windows of the place's everyday speech (keyword-free prompts
of the Allison *development* half, every other one: fold A; as kws_base's speaker recipe uses
them), and the confident detections (>= 0.9) ``Device.detect`` kept from ~3 minutes of what the
device heard). Side by side in one run, class-balanced 10-command recall
(argmax of the 37-way head on 1 s clips; a false accept is an ``_unknown_`` clip named as a
command) for:

- the shipped model (its classifier, exactly: ``host.fleet.data.extract_head``);
- the federated version after ``ROUNDS`` rounds, per codec (dense float32, int8, top-k int8);
- each device adapting alone on its own examples (the same trainer, ``ROUNDS`` local epochs);
- centralised fine-tuning on the pooled examples of every device and the rehearsal set (the same
  trainer and epochs): the upper bound;

on held-out clips of the fleet's voices (fresh renders in fresh rooms, words no device heard),
on a voice outside the fleet (Flite slt), and on the corpus test split (espeak-ng and Festival
voices the model never trained on; the aggregator gates on the val split and the training Festival
voices' clips, never reported here);
then the same models in the streaming ``Detector`` over streams of the held-out commands, at 0.7,
at per-word thresholds matched to the shipped model (``MATCHED``: for each word the lowest threshold
at which the version fires no more often than the shipped model at its own operating point (manifest
``extra.operating``; 0.7 for a bundle without one) on ~24 min of word pairs by the corpus's training
voices, audio an aggregator has: a federated version's are the ones its aggregator published in its
manifest, ``ModelRegistry.operating``, what a device detects with; the centralised head's are
computed the same way here; the shipped model stays at its own operating point) and at
per-keyword thresholds calibrated (``edge.operating.calibrate``) to 2 false accepts per
hour on the rest of the development half (fold B: the other keyword-free prompts and those that
say commands), with false accepts per hour on the Allison test half (``bench._realspeech``; only
reported, never chosen on).
Bytes uploaded per round with each codec against dense float32 frames of the same updates.
The simulated fleet is timed by threads and a clock, so one run is one draw of who joins which round:
the clip rows of each federated version are also given over ``REPEATS`` schedules (simulator seeds;
the same devices and examples), their mean and worst, with each schedule's accepted updates per
voice (``joined``: the bench knows the voices, the aggregator never does).

The trainer's settings (the whole head: projection and classifier, labels a device never hears kept
in the classifier, half of each batch ``_unknown_``/``_silence_``, lr 0.02, one local epoch, 150
real-speech windows; the classifier alone at lr 0.05 until 2026-12-03) were chosen on
development renders of the same voices (other seeds) and false accepts on development fold B,
never on these clips or the test half. The aggregator publishes a round's aggregate only if its
class-balanced 12-class recall on the val split (espeak-ng voices no device holds; a device's
12-class view: any of the 25 other words is `_unknown_`), and on the training Festival voices' clips
as a group of their own (``GATE_GROUPS``), is at most ``GATE_TOLERANCE`` below the shipped model's
(``eval_metric="balanced"``, ``eval_against="start"``, ``heldout.npz``'s ``classes`` and ``groups``);
an aggregate that fails is published a half or a quarter of the way from the current version if
that passes (``eval_shrink``), as an operator would run it: until 2026-12-02 the bench ran without a
gate (tolerance 1.0), until 2026-12-03 with the val split alone at 0.01 and no partial steps. Every
version ships a rehearsal set (``REHEARSAL`` clips of each command by the corpus's training voices,
``aggregator init --rehearsal-corpus``) that each device trains on beside its own examples, so that
rounds keep the voices the model was trained on (since 2026-12-03; a device adapting alone has none).
Rounds run an hour apart (``ROUND_GAP``; the simulator skips the hour and moves every device's battery
and overnight charging window on by it), so over the 18 rounds every device's charger comes round, as
in a household; back to back until 2026-12-05.

    $ nice -n 10 python -m bench.fl_voices        # ~9 min on 2 shared cores (six schedules)
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench._fl_rows import result_rows
from bench.common import row, write_results
from host.fleet.simulate import LEARNING_RATES

DEVICES = 9
ROUNDS = 18  # 12 until 2026-12-02: 18 gained on development data in every schedule but one (scripts/fl_sweep.py)
CLIENTS = 4
# 0.02, the shipped-head task's own step (host.fleet.simulate.LEARNING_RATES); 0.05 while devices trained
# the classifier alone (until 2026-12-03; scripts/fl_sweep.py)
LR = LEARNING_RATES["shipped-head"]
EPOCHS = 1
TOPK = 0.02
OWN_WORDS = 90        # the user's other words each device heard (_unknown_)
REAL_AMBIENT = 150    # 1 s windows of the place's everyday speech per device (development half, fold A)
MATCHED = "per-word thresholds matching the shipped model's rate at its own operating point on synthetic speech"
MATCH_PAIRS = 900     # word pairs by training voices (~24 min) the matched operating point is set on
CALIBRATED_FA_H = 2.0  # the calibrated operating point (all commands together), on development fold B
CODECS = ("dense_f32", "int8", "topk_int8")
# the simulated fleet is timed by threads and a clock (who answers first joins a round), so one run is
# one draw: the clip rows are also measured over REPEATS schedules (simulator seeds 0..REPEATS-1, the
# same devices and examples) and each federated row says the mean and the range
REPEATS = 6
# the aggregator's publication gate: class-balanced recall on the val split (voices no device holds),
# and on each of GATE_GROUPS on its own, may fall at most GATE_TOLERANCE below the shipped model's (the
# first published version); an aggregate that fails is published a half or a quarter of the way if that
# passes (0.01, the val split alone and no partial steps until 2026-12-03)
GATE_TOLERANCE = 0.02
GATE_GROUPS = ("train:festival",)  # the training Festival voices' clips, which the operator holds
GATE = {"eval_metric": "balanced", "eval_against": "start", "eval_shrink": [0.5, 0.25]}
# the aggregator's rehearsal set: this many training-voice clips of each command ship with every version
# and each device trains on them beside its own examples (``aggregator init --rehearsal-corpus``;
# none until 2026-12-03: chosen on development renders, scripts/fl_sweep.py)
REHEARSAL = 24
# rounds an hour apart (``SimConfig.round_gap``, skipped rather than waited through): each device's battery
# and overnight charging window move on with them, so who trains is not fixed by the charge every device
# had at one instant (back to back until 2026-12-05: 18 rounds in ~20 simulated minutes, and in one
# schedule two of rms's three users never reached the battery floor; scripts/fl_sweep.py)
ROUND_GAP = 3600.0


def recall(logits, y, labels) -> dict:
    from host.fleet.voices import command_recall

    return command_recall(logits, y, labels)


def _stream(windows, words):
    from bench import _base_streams as B

    clips = [B.Clip("", w, x) for x, w in zip(windows, words) if w != "_unknown_"]
    pcm, spans = B.positive_stream(clips, None, seed=5)
    return pcm, spans, clips


def main(argv=None) -> int:
    global DEVICES, ROUNDS, CLIENTS
    quick = "--quick" in (argv or [])  # a smoke run: 3 devices, 2 rounds, few clips (nothing written)
    if quick:
        DEVICES, ROUNDS, CLIENTS = 3, 2, 2
    tmp = Path(tempfile.mkdtemp(prefix="fl_voices_"))
    try:
        return _run(tmp, quick)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run(tmp: Path, quick: bool = False) -> int:
    from bench import _base_streams as B
    from bench import _realspeech as R
    from edge.adapt import EmbeddingHead
    from edge.bundle import load_bundle
    from edge.detect import Detector, detect_pcm
    from edge.fl.model import head_logits
    from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys
    from edge.portable import wire
    from host.fleet.data import extract_head, load_embeddings
    from host.fleet.simulate import SimConfig, device_trainer, final_head, final_operating, simulate
    from host.fleet.voices import FLEET_VOICES, OUTSIDE_VOICES, heldout_clips, make_fleet, prepare_devices

    t0 = time.time()
    bundle = load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys())
    km = KeywordModel(bundle)
    labels = list(bundle.labels)
    from host.data.words import COMMANDS10

    small = dict(labelled_per_command=2, heard_per_command=1, ambient_words=4, heard_words=2) if quick else \
        dict(ambient_words=OWN_WORDS)
    users = make_fleet(DEVICES, FLEET_VOICES, seed=0, **small)
    # the places' everyday speech: keyword-free development prompts (fold A: every other one) as
    # ambient; fold B and the development prompts that say commands calibrate operating points
    have_real = R.missing_reason() is None
    dev = R.load_prompts(which="dev") if have_real else []
    free = [p for p in dev if not any(p.says(w) for w in COMMANDS10)]
    fold_a = free[0::2]
    fold_b = [p for p in dev if p not in fold_a]
    extra = None
    if fold_a:
        apcm, _ = R.concat(fold_a)
        wins = np.stack([apcm[a:a + 16000] for a in range(0, len(apcm) - 16000, 8000)])
        wins = wins[np.sqrt((wins.astype(np.float32) ** 2).mean(1)) > 100]
        n = min(REAL_AMBIENT, len(wins)) if not quick else 5
        extra = [wins[np.random.default_rng([7, i]).choice(len(wins), n, replace=False)] for i in range(DEVICES)]
    fleet = prepare_devices(users, tmp / "users", augment=8, bundle=bundle, progress=True, extra_ambient=extra)
    t_prep = time.time() - t0
    held = {}
    for i, v in enumerate(FLEET_VOICES + OUTSIDE_VOICES):
        x, words = heldout_clips(v, seed=100 + i, **(dict(per_command=1, other_words=3) if quick else {}))
        emb = np.concatenate([km.infer(km.features(x[a:a + 256]))[0] for a in range(0, len(x), 256)])
        held[v] = {"X": np.asarray(emb, np.float32), "y": np.array([labels.index(w) for w in words]),
                   "windows": x, "words": words}
    emb = load_embeddings(progress=True)
    te = emb.rows("test")
    test = (emb.X[te], emb.y[te].astype(np.int64))
    print(f"fl_voices: data ready in {time.time() - t0:.0f} s", file=sys.stderr)

    shipped = extract_head()
    cfg0 = SimConfig(task="shipped-head", devices=DEVICES, rounds=ROUNDS, clients_per_round=CLIENTS,
                     learning_rate=LR, local_epochs=EPOCHS, eval_tolerance=GATE_TOLERANCE, seed=0,
                     rehearsal_per_command=REHEARSAL, heldout_groups=GATE_GROUPS, round_gap=ROUND_GAP)
    systems = {"shipped model": shipped}
    sims, operating = {}, {}
    # keyword-free speech of the training voices: the aggregator publishes each version with per-word
    # thresholds matched on it (ModelRegistry.operating); the streaming rows use what it published
    from bench.kws_base import synthetic_negatives
    from host.data.negatives import stream_negatives

    syn = synthetic_negatives(n=60 if quick else MATCH_PAIRS, seed=41)
    negatives = stream_negatives(km, syn, COMMANDS10)

    def joined(res):  # accepted updates per voice (the aggregator never learns voices; the bench knows them)
        return {v: int(sum(n for n, f in zip(res["participation"], fleet) if f["voice"] == v)) for v in FLEET_VOICES}

    for codec in CODECS:
        cfg = SimConfig(**{**cfg0.__dict__, "codec": codec, "extra": {"topk_fraction": TOPK, **GATE}})
        t1 = time.time()
        res = simulate(cfg, tmp / f"sim-{codec}", progress=False, fleet=fleet, negatives=negatives)
        done = [r for r in res["rounds"] if r["status"] in ("closed", "rejected")]
        sims[codec] = {"rounds": len(done), "published": sum(r["status"] == "closed" for r in done),
                       "uploads": res["stats"]["uploads"], "drops": res["stats"]["drops"],
                       "bytes_up": res["bytes_up"], "final_version": res["final_version"],
                       "seconds": round(time.time() - t1, 1), "joined": joined(res),
                       "val_gate_score": [r["accuracy"] for r in done]}
        systems[f"federated ({codec}, {len(done)} rounds)"] = final_head(tmp / f"sim-{codec}", res["final_version"])
        operating[f"federated ({codec}, {len(done)} rounds)"] = final_operating(tmp / f"sim-{codec}",
                                                                                 res["final_version"])
    repeats = {codec: [] for codec in CODECS}  # per codec, per simulator seed: the final version's head
    for seed in range(1, 1 if quick else REPEATS):
        for codec in CODECS:
            cfg = SimConfig(**{**cfg0.__dict__, "seed": seed, "codec": codec, "extra": {"topk_fraction": TOPK, **GATE}})
            res = simulate(cfg, tmp / f"sim-{codec}-{seed}", progress=False, fleet=fleet)
            repeats[codec].append((seed, final_head(tmp / f"sim-{codec}-{seed}", res["final_version"]),
                                   sum(r["status"] == "closed" for r in res["rounds"]), joined(res)))
    # the dense float32 size of one update: the same tensors, the same header
    trainer = device_trainer(cfg0, labels)
    task = {"learning_rate": LR, "local_epochs": ROUNDS * EPOCHS, "batch_size": 16}
    trained = trainer.train(shipped, fleet[0]["X"], fleet[0]["y"], task, np.random.default_rng(0))
    import array

    hdr = wire.Header("dev0", 1, 1, 1, len(fleet[0]["y"]))
    hdr.flags |= wire.FLAG_SUBSET
    dense_frame = len(wire.encode_update(hdr, [(k, v.shape, array.array("f", (v - shipped[k]).astype(np.float32).tobytes()))
                                               for k, v in sorted(trained.items())], b"k" * 32, codec=wire.DENSE_F32))
    # each device alone: the same trainer, ROUNDS local epochs on its own examples
    alone = []
    for i, f in enumerate(fleet):
        new = device_trainer(cfg0, labels).train(shipped, f["X"], f["y"], task, np.random.default_rng(i))
        alone.append({**shipped, **new})
    # centralised: every device's examples and the rehearsal set, the data the federation trains on
    from host.fleet.simulate import simulated_rehearsal

    rr = simulated_rehearsal(emb, cfg0, labels) if cfg0.rehearsal_per_command else np.zeros(0, np.int64)
    Xp = np.concatenate([f["X"] for f in fleet] + [emb.X[rr]])
    yp = np.concatenate([f["y"] for f in fleet] + [emb.y[rr].astype(np.int64)])
    central = {**shipped, **device_trainer(cfg0, labels).train(shipped, Xp, yp, task, np.random.default_rng(0))}
    systems["centralised (pooled examples)"] = central

    def scores(h):
        out = {v: recall(head_logits(h, d["X"]), d["y"], labels) for v, d in held.items()}
        out["test split"] = recall(head_logits(h, test[0]), test[1], labels)
        return out

    table = {name: scores(h) for name, h in systems.items()}
    per_dev = [scores(h) for h in alone]
    own = {v: float(np.mean([s[v]["balanced"] for s, f in zip(per_dev, fleet) if f["voice"] == v])) for v in FLEET_VOICES}
    table["each device alone (mean)"] = {
        **{v: {"balanced": own[v], "note": "each device on its own voice"} for v in FLEET_VOICES},
        **{g: {"balanced": float(np.mean([s[g]["balanced"] for s in per_dev])),
               "fa": float(np.mean([s[g]["fa"] for s in per_dev]))} for g in OUTSIDE_VOICES + ("test split",)}}

    # streaming: the real Detector at 0.7 with each head; false accepts on the real test half
    streams = {v: _stream(held[v]["windows"], held[v]["words"]) for v in held}
    real = R.load_prompts(which="test") if R.missing_reason() is None else []
    real = real[:5] if quick else real
    real_pcm, real_spans = R.concat(real) if real else (None, None)
    from edge.operating import calibrate, stream_scores

    if fold_b:
        bpcm, bspans = R.concat(fold_b[:4] if quick else fold_b)

    def says(k, t, det):
        return any(a - 0.3 <= t <= b + 1.0 and p.says(det.names[k]) for (a, b), p in zip(bspans, fold_b))

    def thresholds(head):
        det = Detector(km, head=head)
        sc, ends, hours = stream_scores(det, bpcm)
        return calibrate([(sc, ends, lambda k, t: says(k, t, det))], hours, CALIBRATED_FA_H, det.names)["thresholds"]

    # an operating point a server could give each version: per word, the lowest threshold at which
    # it fires no more often on synthetic speech of the training voices than the shipped model at its own
    # operating point (the aggregator's reference too: ModelRegistry.operating)
    from edge.detect import bundle_thresholds, count_events
    from edge.operating import matched as matched_points

    def syn_scores(head):
        det = Detector(km, head=head)
        sc, ends, _ = stream_scores(det, syn)
        return det.names, sc, ends

    names, sc0, ends0 = syn_scores(None)
    own = bundle_thresholds(km.bundle.manifest) or {}
    ref_counts = [count_events(sc0[:, k], own.get(n, 0.7), ends0) for k, n in enumerate(names)]

    def matched(head):
        return matched_points(*syn_scores(head)[1:], ref_counts, names)

    streaming = {}
    for name in ["shipped model", f"federated (topk_int8, {sims['topk_int8']['rounds']} rounds)",
                 f"federated (dense_f32, {sims['dense_f32']['rounds']} rounds)", "centralised (pooled examples)"]:
        head = None if name == "shipped model" else EmbeddingHead(systems[name])
        for point in ["0.7", MATCHED] + ([f"calibrated {CALIBRATED_FA_H:g} FA/h"] if fold_b else []):
            if point == MATCHED:  # a federated version: the thresholds its aggregator published with it
                thr = ({n: own.get(n, 0.7) for n in names} if head is None else operating[name]["thresholds"]
                       if operating.get(name) else matched(head))
            else:
                thr = 0.7 if point == "0.7" else thresholds(head)
            st = {v: B.score_positives(detect_pcm(Detector(km, head=head, threshold=thr), p), sp, c)["balanced"]
                  for v, (p, sp, c) in streams.items()}
            if real:
                st["real speech FA/h"] = B.false_accepts(detect_pcm(Detector(km, head=head, threshold=thr), real_pcm),
                                                         real_spans, real)["fa_per_hour"]
            if isinstance(thr, dict):
                st["thresholds"] = thr
            streaming[(name, point)] = st

    fleet_mean = {n: float(np.mean([t[v]["balanced"] for v in FLEET_VOICES])) for n, t in table.items()}

    def gains(t):  # points over the shipped model: the fleet's voices, the outside voice, the test split
        base = table["shipped model"]
        fm = float(np.mean([t[v]["balanced"] for v in FLEET_VOICES]))
        return {"fleet": round(100 * (fm - fleet_mean["shipped model"]), 1),
                **{g: round(100 * (t[g]["balanced"] - base[g]["balanced"]), 1) for g in OUTSIDE_VOICES + ("test split",)}}

    spread = {}
    for codec in CODECS:
        name = next(n for n in table if n.startswith(f"federated ({codec},"))
        runs = [{"seed": 0, "published": sims[codec]["published"], "joined": sims[codec]["joined"],
                 **gains(table[name])}] + \
            [{"seed": sd, "published": pub, "joined": j, **gains(scores(h))} for sd, h, pub, j in repeats[codec]]
        spread[codec] = {"runs": runs, **{f"{k}_mean": round(float(np.mean([r[k] for r in runs])), 2)
                                          for k in ("fleet",) + OUTSIDE_VOICES + ("test split",)}}
    rows = result_rows(table, fleet_mean, spread, streaming, sims, dense_frame,
                       real_spans[-1][1] / 3600 if real else None, CODECS, TOPK)
    det = [f["detections"] for f in fleet]
    src = {k: int(sum((f["source"] == k).sum() for f in fleet)) for k in ("labelled", "augmented", "ambient", "detected")}
    detail = {"table": table, "schedules": spread, "streaming": {f"{n} @ {p}": v for (n, p), v in streaming.items()}, "sims": sims, "dense_frame_bytes": dense_frame,
              "devices": [{"voice": u.voice, "pitch": round(u.pitch, 3), "room": u.room.__dict__,
                           "examples": int(len(f["y"])), "detections": f["detections"]} for u, f in zip(users, fleet)],
              "examples_by_source": src, "detections_kept": sum(d["kept"] for d in det),
              "detections_kept_correct": sum(d["kept_correct"] for d in det),
              "prepare_seconds": round(t_prep, 1), "seconds": round(time.time() - t0, 1),
              "settings": {"devices": DEVICES, "rounds": ROUNDS, "clients_per_round": CLIENTS, "lr": LR,
                           "local_epochs": EPOCHS, "topk_fraction": TOPK, "trainer": cfg0.head_tensors,
                           "negative_share": cfg0.negative_share, "keep_absent": cfg0.keep_absent,
                           "rehearsal_per_command": cfg0.rehearsal_per_command}}
    rows.append(row("fl_voices run", "wall seconds", round(time.time() - t0, 1), "s", None, None, ratio=None,
                    examples_by_source=src, detections_kept=detail["detections_kept"],
                    detections_kept_correct=detail["detections_kept_correct"]))
    if quick:
        print(json.dumps(rows, indent=1, default=str))
        return 0
    out = Path(__file__).resolve().parent / "results" / "fl_voices_detail.json"
    out.write_text(json.dumps(detail, indent=1, default=str) + "\n")
    write_results("fl_voices", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
