"""The pausable training loop: checkpoints atomically, stops when told, resumes exactly.

``should_continue()`` is asked before every step (the scheduler's check); when it
says no, the trainer's full state (delta, optimiser moments, step count, data
cursor) is checkpointed atomically and the loop returns ``"paused"``. Calling
again with the same context resumes from the checkpoint. On completion the
adapted delta (LoRA merged) becomes the context's new version and the
checkpoint is removed, in one commit (``AdaptStore.save``). A run whose loss diverges (``diverged``:
not finite, or far above where it started) commits nothing and returns ``"diverged"``: the version
before it stays active, and no checkpoint of it is kept.

A checkpoint is resumed only by the same run: the same context, strategy, optimiser,
tensors, step count, the same data (a digest) and the same starting version (``base``), so
a checkpoint left by a run that committed just before a crash is never resumed on top of the
version it produced. A checkpoint that does not fit the trainer's state is ignored.

Energy: with ``charge_seq`` (the scheduler's next charge sequence) every step is charged
once: a pause records ``{"seq", "steps"}`` (the steps since the last charge) in the
checkpoint, the commit records the rest beside the new version, and the caller applies them
with ``AdaptStore.recover(scheduler.charge)``; a crash between the record and the scheduler's
write replays the charge, which the sequence makes idempotent.

    >>> res = train(trainer, x, y, store, "default", steps=200, should_continue=sched.ok)
    >>> res["status"], res["steps_done"]
    ('paused', 57)
"""

from __future__ import annotations

import hashlib
from contextlib import nullcontext

import numpy as np

from edge.adapt.sampling import Batches
from edge.adapt.trainer import mix_replay
from edge.atomic import state_lock
from edge.errors import EdgelearnError


def data_digest(x, y) -> str:
    h = hashlib.sha256(np.ascontiguousarray(x).tobytes())
    h.update(str(np.shape(x)).encode() + np.asarray(y, np.int64).tobytes())
    return h.hexdigest()[:16]


# A run has diverged, and is not committed, when a loss or a trained tensor is not finite, or when
# its last losses (the mean of up to ``DIVERGE_LAST`` steps, so one hard batch does not count) are
# above ``DIVERGE_FACTOR`` times its first loss and above chance (ln of the classes). Batch noise and
# replayed examples move the loss by a small factor; a learning rate too large (or of the wrong sign)
# moves it by orders of magnitude (0.28 -> 4.9e29 at --lr 1e30, 0.27 -> 749 at --lr -1). The chance
# floor keeps a run that starts near 0 loss (data already fit) from being refused for batch noise.
DIVERGE_FACTOR, DIVERGE_LAST = 10.0, 10


def _finite(arrays) -> bool:
    return all(np.all(np.isfinite(v)) for v in arrays if np.asarray(v).dtype.kind == "f")


def diverged(losses, first, n_classes: int) -> str | None:
    """Why a run's losses say it diverged (see ``DIVERGE_FACTOR``), or None."""
    if not losses or first is None:
        return None
    last = float(np.mean(losses[-DIVERGE_LAST:]))
    if not (np.isfinite(last) and np.isfinite(first)):
        return f"the loss became {last:g}"
    limit = max(DIVERGE_FACTOR * first, float(np.log(max(n_classes, 2))))
    if last > limit:
        return f"the loss rose from {first:.3g} to {last:.3g} (over {limit:.3g})"
    return None


def _fits(state: dict, ck: dict) -> bool:
    """Does a checkpoint hold exactly the tensors (names, shapes) of this trainer's state?"""
    return set(ck) - {"cursor"} == set(state) and all(np.shape(ck[k]) == np.shape(v) for k, v in state.items())


def train(trainer, x, y, store, context: str, steps: int, batch: int = 16, replay=None,
          replay_n: int = 16, should_continue=lambda: True, checkpoint_every: int = 50,
          seed: int = 0, teacher=None, distill: float = 0.5, charge_seq: int | None = None,
          stage=None, balance: bool = False, negatives=(), negative_share: float | None = None,
          negative_distill: float = 0.0, record: dict | None = None) -> dict:
    """Run ``steps`` steps (or resume them); see the module docstring.

    With ``teacher`` (``x -> probs`` of the model before adapting, e.g. the bundle's tail), the
    replay examples' targets are ``(1 - distill) * label + distill * teacher(x)``: the replay
    keeps the old model's outputs, not only its labels (dark experience replay, Buzzega et al.
    2020; learning without forgetting, Li & Hoiem 2016). The local examples keep their labels.

    A conv-tail trainer (``ConvTrainer``) gets its inputs prepared once per run: the part of the
    tail no trained tensor changes (``ConvTrainer.prepare``), for the local examples and every
    replay slot, and the teacher's posteriors per replay slot (``ReplayPool``).

    ``stage``: a callable giving ``{path relative to the state directory: bytes}`` to commit with
    the new version (the replay buffer with this run's examples); ``charge_seq``: see the module
    docstring.

    ``balance``, ``negatives`` (label ids, e.g. ``_unknown_`` and ``_silence_``), ``negative_share``:
    how each batch draws the local examples (``edge.adapt.sampling.Batches``); ``negative_distill``
    (with ``teacher``): the local examples labelled ``negatives`` get the targets
    ``(1 - w) * label + w * teacher(x)``, so the tail keeps the base model's view of the place's
    own audio as well as its label.

    ``record``: more of the run's record, committed with the version and matched on resume (the
    device's ``trained_on``: the bundle and head the tail ends in, ``edge.adapt.delta.trained_on``).
    """
    info = {**(record or {}), "context": context, "strategy": trainer.strategy, "optimizer": trainer.optimizer,
            "steps": steps, "n": int(len(x)), "distill": float(distill) if teacher is not None else 0.0,
            "tensors": list(trainer.names), "base": store.current(context), "data": data_digest(x, y)}
    batches = Batches(y, batch, seed=seed, balance=balance, negatives=negatives, negative_share=negative_share)
    negative_distill = float(negative_distill) if teacher is not None and negatives else 0.0
    if not 0.0 <= negative_distill <= 1.0:
        raise EdgelearnError(f"negative distillation weight {negative_distill} is outside 0..1",
                             fix="pass a weight between 0 and 1")
    if not batches.plain:
        info["sampling"] = batches.describe()
    if negative_distill > 0:
        info["negative_distill"] = negative_distill
    done, charged, losses, first = 0, 0, [], None  # first: the run's first loss (kept across a pause)
    ck, ck_info = store.load_checkpoint()
    if ck is not None and {k: ck_info.get(k) for k in info} == info and _fits(trainer.state(), ck):
        ck_done, ck_charged = ck_info.get("done"), ck_info.get("charged", 0)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (ck_done, ck_charged)) \
                and 0 <= ck_charged <= ck_done <= steps:
            trainer.load_state({k: v for k, v in ck.items() if k != "cursor"})
            done, charged = ck_done, ck_charged
            first = ck_info.get("loss_first") if isinstance(ck_info.get("loss_first"), float) else None
    local_soft = None  # the teacher's posteriors on the local negatives (rows of x; others unused)
    if negative_distill > 0:
        neg = np.nonzero(np.isin(np.asarray(y), list(negatives)))[0]
        if len(neg):
            local_soft = np.zeros((len(x), trainer.tail.n_classes), np.float32)
            for a in range(0, len(neg), 256):
                local_soft[neg[a:a + 256]] = teacher(np.asarray(x[neg[a:a + 256]]))
            is_neg = np.zeros(len(x), bool)
            is_neg[neg] = True
    pool, conv = None, hasattr(trainer, "replay_pool")
    if conv:  # the conv tail: its frozen prefix and the teacher's posteriors are computed once per run
        pool = trainer.replay_pool(replay, np.shape(x)[1:], teacher if distill > 0 else None)
        x = trainer.prepare(x)
    n_classes = trainer.tail.n_classes

    def give_up(why: str) -> dict:
        """A diverged run: nothing committed, its checkpoint (if any) removed, its energy returned to
        charge (``charge``: the caller's scheduler books it; nothing else records it)."""
        store.clear_checkpoint()
        return {"status": "diverged", "steps_done": done, "loss_first": first,
                "loss": losses[-1] if losses else None,
                "reason": f"training diverged: {why}; nothing was committed, the model in use is unchanged; "
                          "lower --lr",
                "charge": {"seq": charge_seq, "steps": done - charged} if charge_seq is not None else None}

    while done < steps:
        if not should_continue():
            if not _finite(trainer.state().values()):
                return give_up("a trained tensor is not finite")
            charge = {"seq": charge_seq, "steps": done - charged} if charge_seq is not None else None
            store.save_checkpoint(trainer.state(), {**info, "done": done, "charged": done if charge else charged,
                                                    "charge": charge, "loss_first": first})
            return {"status": "paused", "steps_done": done, "loss": losses[-1] if losses else None}
        idx = batches(done)
        soft = None
        if pool is not None:
            bx, by, soft = pool.mix(x[idx], y[idx], replay_n)
        elif conv:  # nothing to replay
            bx, by = x[idx], y[idx]
        else:
            bx, by = mix_replay(x[idx], y[idx], replay, replay_n)
            if teacher is not None and distill > 0 and len(by) > len(idx):
                soft = teacher(bx[len(idx):])
        targets = None
        if soft is not None or local_soft is not None:
            targets = np.eye(trainer.tail.n_classes, dtype=np.float32)[by]
        if soft is not None:
            r = slice(len(idx), None)
            targets[r] = (1.0 - distill) * targets[r] + distill * soft
        if local_soft is not None:
            rows = np.nonzero(is_neg[idx])[0]
            w = negative_distill
            targets[rows] = (1.0 - w) * targets[rows] + w * local_soft[idx[rows]]
        with np.errstate(over="ignore", invalid="ignore"):  # a diverging run is reported below, not warned
            losses.append(trainer.step(bx, by, targets=targets))
        first = losses[-1] if first is None else first
        done += 1
        if not np.isfinite(losses[-1]):  # no step can bring it back
            return give_up(f"the loss became {losses[-1]:g} at step {done}")
        if done % checkpoint_every == 0 and done < steps:
            if not _finite(trainer.state().values()):  # never a checkpoint a later run would warn about
                return give_up(f"a trained tensor is not finite at step {done}")
            store.save_checkpoint(trainer.state(), {**info, "done": done, "charged": charged, "loss_first": first})
    why = diverged(losses, first, n_classes)
    merged = trainer.tail.merged()
    if why is None and not _finite(merged.values()):
        why = "a trained tensor is not finite"
    if why is not None:
        return give_up(why)
    charge = {"seq": charge_seq, "steps": done - charged} if charge_seq is not None else None
    # The staged files (the replay buffer: a merge of the file as it is now) are made and renamed
    # into place under the state lock, so another process's replay flush cannot land in between
    # and be overwritten by the commit (lock order: the state's, then the adapt store's).
    with state_lock(store.state) if stage is not None else nullcontext():
        version = store.save(context, merged, {**info, "final_loss": losses[-1] if losses else None},
                             stage=stage() if stage is not None else None, charge=charge)
    return {"status": "done", "steps_done": done, "version": version,
            "loss_first": first, "loss": losses[-1] if losses else None}
