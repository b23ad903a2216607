"""Probes of ``scripts/fl_sweep.py`` (issue 18, development data only): two moved out of it unchanged,
``central`` (``--central``: the bench's centralised head on the pooled examples of chosen voices'
devices, slt's development gain) and ``rehearsal_converted`` (``--rehearsal-convert N``: the
aggregator's rehearsal set also shipped as voice conversions, patched into the in-process
aggregator). Their measurements are in docs/fl-sweep.md."""

from __future__ import annotations

import json

import numpy as np


def central(fleet, emb, labels, slt, s0, stream=None) -> None:
    """The upper bound by who is heard: the bench's centralised head (the device trainer on the pooled
    examples and the rehearsal set, bench fl_voices's ``task``) from every device, from the devices of
    each voice alone and from all but rms's; slt's development gain, two trainer seeds each (with
    ``stream``, a ``Streaming``: also the first seed's head as a user meets it)."""
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
        gains, heard = [], {}
        for seed in range(2):
            h = {**shipped, **device_trainer(cfg, labels).train(shipped, X, y, task, np.random.default_rng(seed))}
            gains.append(round(100 * (command_recall(head_logits(h, slt[0]), slt[1], labels)["balanced"] - s0), 1))
            if stream is not None and seed == 0:
                heard = {"streaming": stream(h)}
        print(json.dumps({"central": name, "slt_dev_gain": gains, **heard}), flush=True)


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


class Streaming:
    """``--streaming``: each federated version as a user meets it, on development audio only. The
    shipped Detector's windows of three streams are embedded once (``stream_scores``): the fleet's
    development renders said one after another (``bench.fl_voices._stream``), ~24 min of word pairs
    by the training voices (seed 43; the bench's aggregator matches on seed 41) and the real
    development fold B (the Allison prompts the devices never train on). A head's per-word
    thresholds are matched on the word pairs to the shipped classifier's rate at 0.7 (what an
    aggregator publishes, ``edge.operating.matched``); its events are ``edge.detect.trigger``'s."""

    def __init__(self, km, clips: dict, fold_b: list, pairs: int = 900):
        from bench import _realspeech as R
        from bench.fl_voices import _stream
        from bench.kws_base import synthetic_negatives
        from edge.detect import Detector, count_events
        from edge.operating import stream_scores
        from host.fleet.data import extract_head

        det = Detector(km)
        self.names, self.base = det.names, det.base_idx

        def embed(pcm):
            _, ends, hours, emb = stream_scores(det, pcm, embeddings=True)
            return np.asarray(emb, np.float32), ends, hours

        self.pos = {}
        for v, (x, words) in clips.items():
            pcm, spans, cl = _stream(x, words)
            self.pos[v] = (*embed(pcm)[:2], spans, cl)
        self.syn = embed(synthetic_negatives(n=pairs, seed=43))[:2]
        pcm, self.real_spans = R.concat(fold_b)
        self.real, self.prompts = embed(pcm)[:2], fold_b
        s0 = self.scores(extract_head(), self.syn[0])
        self.ref = [count_events(s0[:, k], 0.7, self.syn[1]) for k in range(len(self.names))]

    def scores(self, head, emb):
        from edge.adapt import EmbeddingHead

        return EmbeddingHead(head).probs(emb)[:, self.base]

    def __call__(self, head) -> dict:
        """Class-balanced streaming recall per fleet voice and false accepts per hour on fold B, at
        0.7 and at the matched per-word thresholds (``thr``)."""
        from bench import _base_streams as B
        from edge.detect import trigger
        from edge.operating import matched

        thr = matched(self.scores(head, self.syn[0]), self.syn[1], self.ref, self.names)
        out = {}
        for point, t in (("0.7", np.full(len(self.names), 0.7)), ("matched", np.array([thr[n] for n in self.names]))):
            rec = {v: B.score_positives(trigger(self.scores(head, e), ends, t, self.names), spans, cl)["balanced"]
                   for v, (e, ends, spans, cl) in self.pos.items()}
            ev = trigger(self.scores(head, self.real[0]), self.real[1], t, self.names)
            out[point] = {"recall": round(100 * float(np.mean(list(rec.values()))), 1),
                          "fa_h": round(B.false_accepts(ev, self.real_spans, self.prompts)["fa_per_hour"], 1)}
        out["thr"] = thr
        return out
