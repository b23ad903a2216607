"""Forgetting: base 12-class accuracy before and after on-device adaptation, with and without replay.

The device: the shipped bundle's int8 backbone + float conv tail. Its local data:
a household of two voices the encoder never trained on (Flite ``awb`` and ``rms``,
the unseen split) saying the 35 words and fillers in their own room (strong reverberation, babble
and fan-like brown noise at 0-10 dB SNR): 60 % of its clips adapt, 40 % measure
the local gain. Base accuracy is ``host.evaluate.accuracy12`` on the corpus test
split (other voices, other rooms). The replay buffer (``edge.replay``, 4 MB of
int8 tail inputs, about 520 slots, class-balanced) holds what the device heard
before: clips of val-split voices. Steps and learning rates were picked on the
val split plus a validation part of the local training clips. With replay, every batch of 16 local examples
gets 16 replay examples mixed in (``edge.adapt.run.train``, as ``device adapt``
does); "replay + distillation" also makes the replay examples' targets half
their label and half the bundle's own tail's posteriors (``teacher=``, dark
experience replay). Same seeds, steps and learning rate for each strategy in
all three runs.

    $ nice -n 10 edgelearn bench forgetting
"""

from __future__ import annotations

import tempfile

import numpy as np

from bench.common import row, write_results

# Chosen on the val split and a validation part of the local training clips (never on the
# test split or the local held-out clips this bench reports): see the module docstring.
STEPS, LR = 80, {"bias-only": 0.003, "lora": 0.001, "full": 0.001}
REPLAY_BYTES = 4 << 20  # about 520 tail inputs of 8 KB: 14 per class
LOCAL_VOICES = ("flite:awb", "flite:rms")
# name -> (strategy, train_dw). "bias-only, dw4 frozen" (device adapt's default since
# 2026-11-30) trains pw4_b and cls_b only, so its forward up to pw4's bias is computed once
# per example (bench/adapt_memory); it uses the learning rate bias-only's was picked with.
STRATEGIES = {"bias-only, dw4_b trains": ("bias-only", True), "bias-only, dw4 frozen": ("bias-only", False),
              "lora": ("lora", True), "full": ("full", True)}


def local_context(corpus, rng):
    """The local voice's clips in its room: reverberant, noisy. (x int16, y, is_train)."""
    from host.data import noise as N

    idx = [i for i in corpus.select("unseen") if corpus.voice[i] in LOCAL_VOICES]
    pool = [corpus.utterance(i) for i in corpus.select("val", kinds=("filler",))]
    h = N.room_impulse(rng, 0.6)
    xs = []
    for i in idx:
        u = np.convolve(corpus.utterance(i).astype(np.float32), h)[: 15500]
        w = N.place(rng, u)
        bg = N.babble(rng, pool, 1)[0] * 0.5 + N.coloured_noise(rng, "brown", (16000,))
        xs.append(N.mix_at_snr(w[None], bg[None].astype(np.float32), rng.uniform(0, 10))[0])
    x = np.clip(np.round(np.stack(xs)), -32768, 32767).astype(np.int16)
    y = np.array([corpus.label_of(i) for i in idx])
    train = rng.random(len(idx)) < 0.6
    return x, y, train


def main():
    from edge.adapt import Backbone, ConvTail, ConvTrainer, load_tail
    from edge.adapt.run import train
    from edge.adapt.store import AdaptStore
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys
    from edge.replay import TAIL_REPLAY, ReplayStore
    from host.data.corpus import build_corpus
    from host.evaluate import accuracy12

    bundle = load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys())
    km, bb = KeywordModel(bundle), Backbone(bundle)
    corpus = build_corpus(progress=False)
    rng = np.random.default_rng(0)

    def feats(pcm):
        return np.concatenate([bb(km.features(pcm[i:i + 256])) for i in range(0, len(pcm), 256)])

    xt, yt, _ = corpus.eval_clips("test")
    ft = feats(xt)
    xl, yl, is_tr = local_context(corpus, rng)
    fl = feats(xl)
    xv, yv, _ = corpus.eval_clips("val")
    fv = feats(xv)
    base = load_tail(bundle)
    ref = ConvTail(base, qparams=bb.qparams)
    acc_base = accuracy12(ref.probs(ft), yt)
    acc_local0 = accuracy12(ref.probs(fl[~is_tr]), yl[~is_tr])
    acc_int8 = accuracy12(km.infer(km.features(xt))[1], yt)
    rows = [row("forgetting", "base 12-class accuracy, corpus test split (backbone int8 + float tail)",
                round(100 * acc_base, 2), "%", "int8 encoder", round(100 * acc_int8, 2), ratio=None),
            row("forgetting", f"local held-out accuracy before adapting ({'+'.join(LOCAL_VOICES)}, reverberant, 0-10 dB)",
                round(100 * acc_local0, 2), "%", None, None)]
    # the chosen setting, and a 3x more aggressive one that shows what replay holds back
    settings = (("", STEPS, LR), (" (3x lr, 3x steps)", 3 * STEPS, {k: 3 * v for k, v in LR.items()}))
    with tempfile.TemporaryDirectory() as d:
        for (tag, steps, lrs), name in ((st, s) for st in settings for s in STRATEGIES):
            strategy, train_dw = STRATEGIES[name]
            res = {}
            for use_replay in (False, True, "distill"):
                st = f"{d}/{name}-{use_replay}-{steps}".replace(" ", "_").replace(",", "")
                replay = None
                if use_replay:
                    replay = ReplayStore(st, dim=25 * 5 * 64, max_bytes=REPLAY_BYTES, name=TAIL_REPLAY)
                    pick = np.random.default_rng(1).permutation(len(fv))
                    replay.add_many(ref.to_float(fv[pick]), yv[pick])
                tail = ConvTail(base, qparams=bb.qparams, train_dw=train_dw)
                tr = ConvTrainer(tail, strategy, "adam", lr=lrs[strategy], seed=0)
                train(tr, fl[is_tr], yl[is_tr], AdaptStore(st, bundle), "local", steps, batch=16,
                      replay=replay, replay_n=16, teacher=ref.probs if use_replay == "distill" else None)
                res[use_replay] = (accuracy12(tail.probs(ft), yt), accuracy12(tail.probs(fl[~is_tr]), yl[~is_tr]))
            for use_replay, label in ((False, "without replay"), (True, "with replay"),
                                      ("distill", "with replay + distillation")):
                acc, loc = res[use_replay]
                rows.append(row("forgetting", f"{name}{tag}, {label}: base accuracy drop (points)",
                                round(100 * (acc_base - acc), 2), "points", "before adapting", 0.0, ratio=None,
                                base_after=round(100 * acc, 2), local_after=round(100 * loc, 2)))
            rows.append(row("forgetting", f"{name}{tag}: local held-out accuracy after adapting, with replay",
                            round(100 * res[True][1], 2), "%", "without replay", round(100 * res[False][1], 2),
                            ratio=None, before=round(100 * acc_local0, 2)))
            rows.append(row("forgetting", f"{name}{tag}: local held-out accuracy after adapting, "
                            "with replay + distillation", round(100 * res["distill"][1], 2), "%",
                            "without replay", round(100 * res[False][1], 2), ratio=None,
                            before=round(100 * acc_local0, 2)))
    write_results("forgetting", rows)
    return rows


if __name__ == "__main__":
    main()
