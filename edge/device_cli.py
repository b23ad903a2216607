"""``edgelearn device``: detect, enroll, adapt and status on a Linux board.

    $ edgelearn device enroll --state st --keyword "hey edge" --wav a.wav b.wav c.wav d.wav e.wav
    $ edgelearn device detect --state st --wav long.wav --json
    {"keyword": "hey edge", "time_s": 3.42, "score": 0.97}
    $ edgelearn device adapt --state st --data mydata/ --strategy lora --context kitchen
    $ edgelearn device status --state st
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    for name, hlp in (("detect", "stream audio and print detections"),
                      ("enroll", "learn a custom keyword from 3-10 clips"),
                      ("adapt", "adapt the tail on local labelled clips (scheduler-gated)"),
                      ("calibrate", "set base-keyword thresholds by false accepts per hour on audio "
                                    "that says none of them"),
                      ("status", "show the state directory")):
        s = sub.add_parser(name, help=hlp)
        s.add_argument("--bundle", type=Path, default=None, help="bundle dir or .zip (default: shipped)")
        s.add_argument("--pubkey", type=Path, default=None, help="trusted public key file or directory")
        s.add_argument("--backend", default="auto", help="litert | onnxruntime | auto")
        s.add_argument("--state", type=Path, required=True, help="device state directory")
        if name == "detect":
            src = s.add_mutually_exclusive_group(required=True)
            src.add_argument("--wav", type=Path, help="16 kHz mono 16-bit WAV of any length")
            src.add_argument("--mic", action="store_true", help="read the default ALSA device (arecord)")
            s.add_argument("--json", action="store_true", help="one JSON object per detection")
            level = s.add_mutually_exclusive_group()
            level.add_argument("--threshold", type=float, default=0.7, help="base keyword threshold")
            level.add_argument("--sensitivity", type=float, default=None, metavar="FA_PER_HOUR",
                               help="per-keyword thresholds from `device calibrate` for at most this "
                                    "many false accepts per hour")
            s.add_argument("--keywords", default=None, help="comma-separated base keywords, or 'all'")
            s.add_argument("--stride", type=int, default=4, help="hops (20 ms) between encoder runs")
            s.add_argument("--confirm", type=float, default=0.9,
                           help="base-keyword detections at or above this score feed the replay buffer")
            s.add_argument("--no-replay", action="store_true", help="do not feed detections to the replay buffer")
        elif name == "calibrate":
            s.add_argument("--wav", type=Path, nargs="+", required=True,
                           help="16 kHz WAVs of everyday audio that says none of the base keywords "
                                "(TV, conversation; an hour or more)")
            from edge.operating import TARGETS

            s.add_argument("--targets", default=",".join(f"{t:g}" for t in TARGETS),
                           help="false accepts per hour to calibrate for, comma-separated")
        elif name == "enroll":
            s.add_argument("--keyword", required=True, help="the new word or short phrase")
            s.add_argument("--wav", type=Path, nargs="+", required=True, help="3-10 clips of it")
            s.add_argument("--replace", action="store_true", help="re-enrol an existing keyword")
        elif name == "adapt":
            s.add_argument("--data", type=Path, help="DIR/<label>/*.wav with bundle labels")
            s.add_argument("--strategy", default="bias-only",
                           help="bias-only | residual-adapter | lora | sparse | full")
            s.add_argument("--dw4", choices=("auto", "train", "freeze"), default="auto",
                           help="train the tail's depthwise layer too (auto: frozen for bias-only, whose "
                                "forward then starts after pw4, computed once per clip; see docs/edge-runtime.md)")
            s.add_argument("--optimizer", default="sgd", help="sgd | adam")
            s.add_argument("--steps", type=int, default=200)
            s.add_argument("--rank", type=int, default=4)
            s.add_argument("--memory-budget", type=int, default=256 * 1024, help="bytes, for sparse")
            s.add_argument("--replay-bytes", type=int, default=1 << 20, help="replay buffer size (tail inputs)")
            s.add_argument("--distill", type=float, default=0.5,
                           help="weight of the bundle's own outputs in the replay examples' targets "
                                "(0: labels only; see bench/forgetting)")
            s.add_argument("--context", default="default", help="name of this adapted context")
            s.add_argument("--sysfs-root", type=Path, default=Path("/"))
            s.add_argument("--force", action="store_true", help="train now, ignoring the scheduler")
            s.add_argument("--rollback", action="store_true", help="restore the context's previous version")
            s.add_argument("--use", default=None, help="switch the active context ('base' for none)")


def _bundle(args):
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, default_trusted_keys

    return load_bundle(args.bundle or DEFAULT_BUNDLE, trusted_keys=args.pubkey or default_trusted_keys())


def run(args) -> int:
    return {"detect": _detect, "enroll": _enroll, "adapt": _adapt, "status": _status,
            "calibrate": _calibrate}[args.action](args)


def _recover(state_dir, bundle, sched=None):
    """Finish or undo what a crash interrupted in the state directory (``AdaptStore.recover``): a
    commit rolled forward with its energy charged once, staged and temp files of runs that never
    committed removed. Every command that writes the state starts with it."""
    from edge.adapt.store import AdaptStore
    from edge.scheduler import Scheduler

    store = AdaptStore(state_dir, bundle)
    sched = sched or Scheduler(state_dir)
    store.recover(sched.charge)
    return store


def _models(bundle, state_dir, backend):
    """The model detection runs: the bundle's encoder, or backbone + the active adapted conv tail."""
    from edge.adapt import Tail, TailModel, classifier_from_bundle
    from edge.adapt.store import AdaptStore
    from edge.kws import KeywordModel

    delta = AdaptStore(state_dir, bundle).load()
    if delta and any(k.startswith(("proj.", "classifier.")) for k in delta):  # an embedding-head context
        return KeywordModel(bundle, backend=backend), Tail(classifier_from_bundle(bundle), delta)
    if delta:
        return TailModel(bundle, delta, backend=backend), None
    return KeywordModel(bundle, backend=backend), None


def _replay_feeder(bundle, state_dir, km, args):
    """on_event hook: confirmed base-keyword detections go into the tail replay buffer (weak labels)."""
    import numpy as np

    from edge.adapt import Backbone
    from edge.replay import TAIL_REPLAY, ReplayStore

    bb = Backbone(bundle, backend=args.backend)
    dim = int(np.prod(bb.backend.outputs[0].shape[1:]))
    store = ReplayStore(state_dir, dim=dim, max_bytes=1 << 20, name=TAIL_REPLAY)
    scale, zp = bb.qparams

    def feed(ev, window):
        if ev["keyword"] in km.labels and ev["score"] >= args.confirm and window is not None:
            q = bb(window[None])[0]
            store.add((q.astype(np.float32) - zp) * scale, km.labels.index(ev["keyword"]))

    return feed, store


def _detect(args) -> int:
    import numpy as np

    from edge.audio import open_wav
    from edge.detect import Detector
    from edge.enroll import DeviceState
    from edge.errors import EdgelearnError

    bundle = _bundle(args)
    state = DeviceState.open(args.state, bundle)
    _recover(args.state, bundle)
    km, head = _models(bundle, args.state, args.backend)
    kws = None
    if args.keywords:
        kws = [w for w in km.labels if not w.startswith("_")] if args.keywords == "all" else \
            [w.strip() for w in args.keywords.split(",") if w.strip()]
    feed, replay = (None, None) if args.no_replay else _replay_feeder(bundle, args.state, km, args)
    threshold = args.threshold
    if args.sensitivity is not None:
        from edge.operating import load_points

        threshold = load_points(args.state, _calibrated_for(bundle, args.state)).thresholds(args.sensitivity)
        if kws is not None:
            threshold = {w: t for w, t in threshold.items() if w in kws}
    det = Detector(km, custom=state.custom(dim=_embedding_dim(km)), keywords=kws, threshold=threshold,
                   stride=args.stride, head=head, on_event=feed)

    def show(ev):
        print(json.dumps(ev) if args.json else f"{ev['time_s']:9.2f} s  {ev['keyword']:<16} {ev['score']:.2f}",
              flush=True)

    try:
        if args.wav:  # streamed in 0.1 s chunks (as a mic would be): memory stays bounded at any length
            with open_wav(args.wav, min_samples=1) as wav:
                for chunk in wav.chunks(1600):
                    for ev in det.push(chunk):
                        show(ev)
            for ev in det.flush():
                show(ev)
            return 0
        if shutil.which("arecord") is None:
            raise EdgelearnError("--mic needs `arecord` (ALSA utils), which is not installed",
                                 fix="apt install alsa-utils, or pass --wav FILE")
        proc = subprocess.Popen(["arecord", "-q", "-f", "S16_LE", "-r", "16000", "-c", "1", "-t", "raw"],
                                stdout=subprocess.PIPE)
        try:
            while chunk := proc.stdout.read(3200):
                for ev in det.push(np.frombuffer(chunk[: len(chunk) // 2 * 2], "<i2")):
                    show(ev)
        finally:
            proc.terminate()
        return 0
    finally:
        if replay is not None:
            replay.flush()  # batched writes; the last partial batch is written on the way out


def _calibrated_for(bundle, state_dir) -> dict:
    """What a calibration holds for: the bundle's encoder and the active adapted context."""
    from edge.adapt.store import AdaptStore

    meta = AdaptStore(state_dir, bundle).meta
    active = meta.get("active")
    version = meta["contexts"][active].get("current") if active else None
    return {"model": bundle.model_id, "bundle_version": bundle.manifest.get("version"),
            "context": active, "context_version": version}


def _calibrate(args) -> int:
    from edge.audio import open_wav
    from edge.detect import Detector
    from edge.errors import EdgelearnError
    from edge.operating import calibrate, save_points, stream_scores

    try:
        targets = sorted({float(t) for t in args.targets.split(",") if t.strip()})
    except ValueError:
        raise EdgelearnError(f"--targets {args.targets!r} is not a list of numbers",
                             fix="pass e.g. --targets 0.5,1,2") from None
    if not targets or min(targets) <= 0:
        raise EdgelearnError("--targets needs rates above 0 false accepts per hour", fix="pass e.g. 0.5,1,2")
    bundle = _bundle(args)
    km, head = _models(bundle, args.state, args.backend)
    det = Detector(km, head=head)
    streams, hours = [], 0.0
    for path in args.wav:
        with open_wav(path, min_samples=16000) as w:  # read in pieces: an hour of audio is fine
            sc, ends, h = stream_scores(det, w.chunks(16000 * 60))
        streams.append((sc, ends, None))
        hours += h
    points = [calibrate(streams, hours, t, det.names) for t in targets]
    save_points(args.state, {"for": _calibrated_for(bundle, args.state), "hours": hours,
                             "files": [str(p) for p in args.wav], "points": points})
    print(json.dumps({"hours": round(hours, 3), "points": [
        {"target_fa_h": p["target_fa_h"], "thresholds": p["thresholds"]} for p in points]}))
    if hours < 1.0:
        print(f"warning: {hours * 60:.0f} minutes of audio pin a rate of {min(targets)} per hour "
              "only loosely; calibrate on an hour or more", file=sys.stderr)
    return 0


def _embedding_dim(km) -> int:
    """The size of the embedding custom keywords score (one inference on silence)."""
    import numpy as np

    return int(km.infer(np.zeros((1, 49, 10), np.float32))[0].shape[-1])


def _enroll(args) -> int:
    from edge.audio import read_wav
    from edge.enroll import DeviceState, enroll
    from edge.kws import KeywordModel

    bundle = _bundle(args)
    state = DeviceState.open(args.state, bundle)
    clips = [read_wav(p, min_samples=1) for p in args.wav]
    rep = enroll(KeywordModel(bundle, backend=args.backend), state, args.keyword, clips,
                 clip_names=[str(p) for p in args.wav], replace=args.replace)
    for o in rep["outliers"]:
        print(f"warning: {o['clip']} does not sound like the others (cosine {o['cosine']}); left out",
              file=sys.stderr)
    print(json.dumps(rep))
    return 0


def _load_data(km, root: Path):
    import numpy as np

    from edge.audio import read_wav
    from edge.errors import EdgelearnError
    from edge.features import fit_to_window

    if root is None or not root.is_dir():
        raise EdgelearnError(f"--data {root} is not a directory", fix="pass DIR with DIR/<label>/*.wav")
    xs, ys = [], []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        if d.name not in km.labels:
            raise EdgelearnError(f"{d}: {d.name!r} is not a label of the bundle", fix=f"use one of {km.labels}")
        for f in sorted(d.glob("*.wav")):
            xs.append(fit_to_window(read_wav(f, min_samples=1600)))
            ys.append(km.labels.index(d.name))
    if not xs:
        raise EdgelearnError(f"no WAV clips under {root}/<label>/", fix="add labelled clips")
    return np.stack(xs), np.array(ys)


def _adapt(args) -> int:
    import numpy as np

    from edge.adapt import Backbone, ConvTail, ConvTrainer, load_tail
    from edge.adapt.convtrain import choose_sparse
    from edge.adapt.fcache import cached_features
    from edge.adapt.run import train
    from edge.kws import KeywordModel
    from edge.replay import TAIL_REPLAY, ReplayStore
    from edge.scheduler import Scheduler

    if not 0.0 <= args.distill <= 1.0:
        from edge.errors import EdgelearnError
        raise EdgelearnError(f"--distill {args.distill} is outside 0..1", fix="pass a weight between 0 and 1")
    bundle = _bundle(args)
    sched = Scheduler(args.state, sysfs_root=args.sysfs_root, idle_s=lambda: 10 ** 6)
    store = _recover(args.state, bundle, sched)
    if args.rollback:
        print(json.dumps({"context": args.context, "version": store.rollback(args.context)}))
        return 0
    if args.use:
        store.use(None if args.use == "base" else args.use)
        print(json.dumps({"active": store.meta["active"]}))
        return 0
    km = KeywordModel(bundle, backend=args.backend)
    windows, y = _load_data(km, args.data)
    steps = args.steps
    if not args.force:
        d = sched.decide()
        if d.action != "train":
            print(json.dumps({"status": "deferred", "reason": d.reason}))
            return 0
        steps = min(steps, d.steps)
    bb = Backbone(bundle, backend=args.backend)
    x = cached_features(args.state, bb, km, windows)  # int8; epochs never rerun the backbone
    train_dw = args.dw4 == "train" or (args.dw4 == "auto" and args.strategy != "bias-only")
    tail = ConvTail(load_tail(bundle), store.load(args.context), qparams=bb.qparams, train_dw=train_dw)
    chosen = choose_sparse(tail, x[:32], y[:32], args.memory_budget, args.optimizer) \
        if args.strategy == "sparse" else ()
    tr = ConvTrainer(tail, args.strategy, args.optimizer, rank=args.rank, sparse_weights=chosen)
    # the replay buffer is written once, in the run's commit (nothing on a pause)
    replay = ReplayStore(args.state, dim=int(np.prod(x.shape[1:])), max_bytes=args.replay_bytes,
                         name=TAIL_REPLAY, flush_every=1 << 62)
    teacher = ConvTail(load_tail(bundle), qparams=bb.qparams).probs if args.distill > 0 else None

    def stage():
        replay.add_many(tail.to_float(x), y)
        return {TAIL_REPLAY: replay.staged()}

    res = train(tr, x, y, store, args.context, steps, replay=replay, teacher=teacher, distill=args.distill,
                should_continue=(lambda: True) if args.force else sched.should_continue,
                charge_seq=sched.charged + 1, stage=stage)
    if res["status"] == "done":
        replay.mark_saved()
    store.recover(sched.charge)  # the run's energy, charged once (its record sits beside the result)
    print(json.dumps({**res, "strategy": args.strategy, "tensors": tr.names, "step_bytes": tr.step_bytes()}))
    return 0


def _status(args) -> int:
    from edge.adapt.store import AdaptStore
    from edge.enroll import DeviceState
    from edge.replay import EMBEDDING_REPLAY, TAIL_REPLAY, load_replay
    from edge.scheduler import last_record

    bundle = _bundle(args)
    km_labels = list(bundle.labels)
    state = DeviceState.open(args.state, bundle)
    adapt = AdaptStore(args.state, bundle)  # read-only: status never changes the state
    last = last_record(args.state)
    replay = {}
    for name in (EMBEDDING_REPLAY, TAIL_REPLAY):
        rb = load_replay(Path(args.state) / name)
        if rb is not None:
            replay[name] = {"count": rb.count, "capacity": rb.capacity, "bytes": rb.nbytes,
                            "classes": {km_labels[k] if k < len(km_labels) else k: n
                                        for k, n in sorted(rb.class_counts().items())}}
    from edge.verify import version_for

    current = version_for(bundle)  # what this bundle enrols
    # the second stage each keyword was enrolled with: older versions keep working; re-enrolling
    # (--replace) moves one to the current verifier (docs/edge-runtime.md)
    versions = {k["name"]: k["verify"].get("version", 1) if "verify" in k else None for k in state.keywords}
    verifier = {n: None if v is None else {"version": v, "current": v == current} for n, v in versions.items()}
    print(json.dumps({"bundle": f"{bundle.model_id} v{bundle.version}", "keywords": state.names(),
                      "verifier": verifier, "adapt": adapt.meta, "replay": replay,
                      "last_schedule": last}, indent=1))
    return 0
