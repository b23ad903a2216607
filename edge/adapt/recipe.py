"""Speaker adaptation of the base commands with negatives (issue 17): the recipe and its training set.

``device adapt --strategy full`` from 3 clips per command and nothing else lifts that voice's
recall to ~90 % but the tail forgets ``_unknown_``: 916-1,430 false accepts per hour on real
speech. The recipe chosen on development data (``scripts/adapt_recipe.py``, numbers in
docs/edge-runtime.md, "Speaker adaptation") keeps the place's own audio in every batch:

- ``training_windows``: the command clips, each ``augment`` times (shifted, sped up or slowed
  down, louder or softer, white noise at 5-30 dB: ``edge.adapt.ambient.augment``), any other
  labelled clips as they are, and the ambient windows (``ambient_windows`` of everyday audio
  that says none of the commands, the audio ``device calibrate`` reads) as ``_unknown_``;
- ``train_options``: batches with ``negative_share`` of ``_unknown_`` / ``_silence_``
  examples and the rest class-balanced over the commands (``edge.adapt.sampling``);
- ``SPEAKER``: the whole tail (``full``), Adam, ``steps`` steps;
- ``verify``: a second stage per command from the same clips (``edge.adapt.verified``: the
  custom keywords' time-order verifier), committed with the version.

``adapt_state`` runs it on a state directory as ``edge.device.Device.adapt`` does (feature
cache, versioned store, replay buffer staged with the commit, energy charged once), without the
scheduler's gate (the caller decides when): the benchmark uses it, and ``Device.adapt`` takes the
same pieces (``training_windows``, ``train_options``).

    >>> w, y = training_windows(windows, y, km.labels, ambient=ambient_windows(["room.wav"]), augment=16)
    >>> train(trainer, cached_features(state, bb, km, w), y, store, "default", 1000,
    ...       **train_options(km.labels))
"""

from __future__ import annotations

import numpy as np

from edge.errors import EdgelearnError

NEGATIVE_LABELS = ("_unknown_", "_silence_")
# chosen on development data only (scripts/adapt_recipe.py); docs/edge-runtime.md, "Speaker adaptation"
SPEAKER = {"strategy": "full", "optimizer": "adam", "steps": 1000, "augment": 16, "balance": True,
           "negative_share": 0.75, "negative_distill": 0.0, "verify": True}


def negative_ids(labels) -> tuple:
    labels = list(labels)
    return tuple(labels.index(w) for w in NEGATIVE_LABELS if w in labels)


def training_windows(windows, y, labels, ambient=None, augment: int = 0, seed: int = 0):
    """(int16 windows, label ids) of a speaker adaptation: the clips of word labels ``augment``
    times each (the clip itself first), the other labelled clips once, then ``ambient`` (1 s int16
    windows) as ``_unknown_``. Deterministic in ``seed`` (the feature cache keys on the audio)."""
    from edge.adapt.ambient import augment as _augment

    windows, y = np.asarray(windows), np.asarray(y, np.int64)
    if len(windows) != len(y):
        raise EdgelearnError(f"{len(windows)} clips and {len(y)} labels", fix="one label per clip")
    neg = np.isin(y, negative_ids(labels))
    parts, ys = [], []
    if augment and augment > 1 and (~neg).any():
        parts.append(_augment(windows[~neg], int(augment), np.random.default_rng(seed)))
        ys.append(np.repeat(y[~neg], int(augment)))
    else:
        parts.append(windows[~neg])
        ys.append(y[~neg])
    parts.append(windows[neg])
    ys.append(y[neg])
    if ambient is not None and len(ambient):
        if "_unknown_" not in list(labels):
            raise EdgelearnError("the bundle has no _unknown_ label for ambient audio", fix="adapt without --ambient")
        parts.append(np.asarray(ambient, windows.dtype))
        ys.append(np.full(len(ambient), list(labels).index("_unknown_"), np.int64))
    return np.concatenate(parts), np.concatenate(ys)


def train_options(labels, balance: bool = True, negative_share: float | None = 0.75,
                  negative_distill: float = 0.0) -> dict:
    """Keyword arguments of ``edge.adapt.run.train`` for the recipe's sampling and distillation."""
    return {"balance": bool(balance), "negatives": negative_ids(labels), "negative_share": negative_share,
            "negative_distill": float(negative_distill)}


def adapt_state(state_dir, bundle, windows, y, *, ambient=None, context: str = "default", backend: str = "auto",
                replay_bytes: int = 1 << 20, distill: float = 0.5, lr: float | None = None, seed: int = 0,
                **recipe) -> dict:
    """Adapt ``state_dir``'s ``context`` to the labelled clips (``windows``: (N, 16000) int16, ``y``:
    label ids) with the speaker recipe (``SPEAKER``, overridden by ``recipe``); returns the run's
    result as ``Device.adapt`` does. Trains now (no scheduler decision)."""
    from edge.adapt import Backbone, ConvTail, ConvTrainer, load_tail
    from edge.adapt.fcache import cached_features
    from edge.adapt.run import train
    from edge.adapt.store import AdaptStore
    from edge.kws import KeywordModel
    from edge.replay import TAIL_REPLAY, ReplayStore
    from edge.scheduler import Scheduler

    unknown = set(recipe) - set(SPEAKER)
    if unknown:
        raise EdgelearnError(f"unknown recipe options {sorted(unknown)}", fix=f"use {sorted(SPEAKER)}")
    r = {**SPEAKER, **recipe}
    km = KeywordModel(bundle, backend=backend)
    sched = Scheduler(state_dir, idle_s=lambda: 10 ** 6)
    store = AdaptStore(state_dir, bundle)
    store.recover(sched.charge)
    w, yy = training_windows(windows, y, km.labels, ambient=ambient, augment=r["augment"], seed=seed)
    bb = Backbone(bundle, backend=backend)
    x = cached_features(state_dir, bb, km, w)
    tail = ConvTail(load_tail(bundle), store.load(context), qparams=bb.qparams,
                    train_dw=r["strategy"] != "bias-only")
    tr = ConvTrainer(tail, r["strategy"], r["optimizer"], lr=lr, seed=seed)
    replay = ReplayStore(state_dir, dim=int(np.prod(x.shape[1:])), max_bytes=replay_bytes, name=TAIL_REPLAY,
                         flush_every=1 << 62)
    teacher = ConvTail(load_tail(bundle), qparams=bb.qparams).probs
    entries = None
    if r["verify"]:
        from edge.adapt.verified import command_entries

        entries = command_entries(bundle, km, windows, y, seed=seed)

    def stage():
        from edge.adapt.verified import entries_bytes, entries_file

        replay.add_many(tail.to_float(x), yy)
        out = {TAIL_REPLAY: replay.staged()}
        if entries:
            out[entries_file(context)] = entries_bytes(entries, tail.merged())
        return out

    res = train(tr, x, yy, store, context, r["steps"], replay=replay, teacher=teacher, distill=distill, seed=seed,
                charge_seq=sched.charged + 1, stage=stage,
                **train_options(km.labels, r["balance"], r["negative_share"], r["negative_distill"]))
    if res["status"] == "done":
        replay.mark_saved()
    store.recover(sched.charge)
    return {**res, "strategy": r["strategy"], "tensors": tr.names, "step_bytes": tr.step_bytes(), "n": int(len(x)),
            "verified": sorted(entries or {})}
