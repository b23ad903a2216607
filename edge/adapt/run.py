"""The pausable training loop: checkpoints atomically, stops when told, resumes exactly.

``should_continue()`` is asked before every step (the scheduler's check); when it
says no, the trainer's full state (delta, optimiser moments, step count, data
cursor) is checkpointed atomically and the loop returns ``"paused"``. Calling
again with the same context resumes from the checkpoint. On completion the
adapted delta (LoRA merged) becomes the context's new version and the
checkpoint is removed.

    >>> res = train(trainer, x, y, store, "default", steps=200, should_continue=sched.ok)
    >>> res["status"], res["steps_done"]
    ('paused', 57)
"""

from __future__ import annotations

import numpy as np

from edge.adapt.trainer import mix_replay


def train(trainer, x, y, store, context: str, steps: int, batch: int = 16, replay=None,
          replay_n: int = 16, should_continue=lambda: True, checkpoint_every: int = 50,
          seed: int = 0, teacher=None, distill: float = 0.5) -> dict:
    """Run ``steps`` steps (or resume them); see the module docstring.

    With ``teacher`` (``x -> probs`` of the model before adapting, e.g. the bundle's tail), the
    replay examples' targets are ``(1 - distill) * label + distill * teacher(x)``: the replay
    keeps the old model's outputs, not only its labels (dark experience replay, Buzzega et al.
    2020; learning without forgetting, Li & Hoiem 2016). The local examples keep their labels.

    A conv-tail trainer (``ConvTrainer``) gets its inputs prepared once per run: the part of the
    tail no trained tensor changes (``ConvTrainer.prepare``), for the local examples and every
    replay slot, and the teacher's posteriors per replay slot (``ReplayPool``).
    """
    info = {"context": context, "strategy": trainer.strategy, "optimizer": trainer.optimizer,
            "steps": steps, "n": int(len(x)), "distill": float(distill) if teacher is not None else 0.0,
            "tensors": list(trainer.names)}
    done, losses = 0, []
    ck, ck_info = store.load_checkpoint()
    if ck is not None and {k: ck_info.get(k) for k in info} == info:
        trainer.load_state({k: v for k, v in ck.items() if k != "cursor"})
        done = int(ck_info["done"])
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    pool, conv = None, hasattr(trainer, "replay_pool")
    if conv:  # the conv tail: its frozen prefix and the teacher's posteriors are computed once per run
        pool = trainer.replay_pool(replay, np.shape(x)[1:], teacher if distill > 0 else None)
        x = trainer.prepare(x)
    while done < steps:
        if not should_continue():
            store.save_checkpoint(trainer.state(), {**info, "done": done})
            return {"status": "paused", "steps_done": done, "loss": losses[-1] if losses else None}
        idx = order[(done * batch + np.arange(batch)) % len(x)]
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
        if soft is not None:
            targets = np.eye(trainer.tail.n_classes, dtype=np.float32)[by]
            r = slice(len(idx), None)
            targets[r] = (1.0 - distill) * targets[r] + distill * soft
        losses.append(trainer.step(bx, by, targets=targets))
        done += 1
        if done % checkpoint_every == 0 and done < steps:
            store.save_checkpoint(trainer.state(), {**info, "done": done})
    version = store.save(context, trainer.tail.merged(), {**info, "final_loss": losses[-1] if losses else None})
    store.clear_checkpoint()
    return {"status": "done", "steps_done": done, "version": version,
            "loss_first": losses[0] if losses else None, "loss": losses[-1] if losses else None}
