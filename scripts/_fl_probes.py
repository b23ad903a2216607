"""Two probes of ``scripts/fl_sweep.py`` (issue 18, development data only), moved out of it unchanged:
``central`` (``--central``: the bench's centralised head on the pooled examples of chosen voices'
devices, slt's development gain) and ``rehearsal_converted`` (``--rehearsal-convert N``: the
aggregator's rehearsal set also shipped as voice conversions, patched into the in-process
aggregator). Their measurements are in fl_sweep.py's docstring."""

from __future__ import annotations

import json

import numpy as np


def central(fleet, emb, labels, slt, s0) -> None:
    """The upper bound by who is heard: the bench's centralised head (the device trainer on the pooled
    examples and the rehearsal set, bench fl_voices's ``task``) from every device, from the devices of
    each voice alone and from all but rms's; slt's development gain, two trainer seeds each."""
    import bench.fl_voices as FV
    from edge.fl.model import head_logits
    from host.fleet.data import extract_head
    from host.fleet.simulate import SimConfig, device_trainer, simulated_rehearsal
    from host.fleet.voices import FLEET_VOICES, command_recall

    cfg = SimConfig(task="shipped-head", rehearsal_per_command=FV.REHEARSAL)
    task = {"learning_rate": FV.LR, "local_epochs": FV.ROUNDS * FV.EPOCHS, "batch_size": 16}
    rr = simulated_rehearsal(emb, cfg, labels)
    shipped = extract_head()
    pools = {"all": FLEET_VOICES, "no rms": tuple(v for v in FLEET_VOICES if v != "rms"),
             **{f"{v} only": (v,) for v in FLEET_VOICES}}
    for name, voices in pools.items():
        fs = [f for f in fleet if f["voice"] in voices]
        X = np.concatenate([f["X"] for f in fs] + [emb.X[rr]])
        y = np.concatenate([f["y"] for f in fs] + [emb.y[rr].astype(np.int64)])
        gains = []
        for seed in range(2):
            h = {**shipped, **device_trainer(cfg, labels).train(shipped, X, y, task, np.random.default_rng(seed))}
            gains.append(round(100 * (command_recall(head_logits(h, slt[0]), slt[1], labels)["balanced"] - s0), 1))
        print(json.dumps({"central": name, "slt_dev_gain": gains}), flush=True)


def rehearsal_converted(emb, km, labels, n: int) -> None:
    """Experiment: the aggregator's rehearsal set (bench fl_voices's ``REHEARSAL`` clips of each command
    by the training voices) also carries ``n`` voice conversions of each of its clips (``FL_CONVERT``'s
    ranges, every copy converted), so every round's devices rehearse a shorter vocal tract too.
    Patched into ``host.aggregator.inprocess.make_state`` for the whole process."""
    import bench.fl_voices as FV
    import host.aggregator.inprocess as I
    from edge.adapt.ambient import augment
    from edge.fl.local import FL_CONVERT
    from host.data.corpus import default_cache_dir
    from host.fleet.data import _find_corpus
    from host.fleet.simulate import SimConfig, simulated_rehearsal

    rows = simulated_rehearsal(emb, SimConfig(task="shipped-head", rehearsal_per_command=FV.REHEARSAL), labels)
    train = emb.rows("train")
    assert np.array_equal(train, np.arange(train[0], train[0] + len(train)))  # one block, in eval_clips' order
    x, _, _ = _find_corpus(default_cache_dir())[0].eval_clips("train")
    clips = x[rows - train[0]]
    conv = augment(clips, n + 1, np.random.default_rng(5), convert=(1.0,) + FL_CONVERT[1:], speed=(1.0, 1.0),
                   shift_s=0.0, gain_db=(0.0, 0.0), clean_share=1.0).reshape(len(clips), n + 1, -1)[:, 1:]
    conv = conv.reshape(len(clips) * n, -1)
    Xc = np.concatenate([km.infer(km.features(conv[a:a + 256]))[0] for a in range(0, len(conv), 256)])
    yc = np.repeat(emb.y[rows], n)
    orig = I.make_state

    def make_state(*a, rehearsal=None, **kw):
        if rehearsal is not None:
            rehearsal = (np.concatenate([rehearsal[0], Xc.astype(rehearsal[0].dtype)]),
                         np.concatenate([rehearsal[1], yc.astype(rehearsal[1].dtype)]))
        return orig(*a, rehearsal=rehearsal, **kw)

    I.make_state = make_state
    print(json.dumps({"rehearsal_converted": len(yc)}), flush=True)
