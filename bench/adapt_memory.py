"""Peak memory (tracemalloc) and step time of each adaptation strategy on the real conv tail, same data.

The tail is the shipped bundle's: float dw4 -> pw4 -> pool -> classifier (tail.npz) on
the int8 backbone's (25, 5, 64) output; the data are backbone outputs of corpus test
clips, held int8 in a feature cache. Adam, batch 16. Reference: full fine-tune of the
same tail. Three memory figures per strategy:

* ``peak``: tracemalloc peak of a whole step (forward included), all allocations,
  from before the trainer existed: what a device must have free to train;
* ``beyond inference``: numpy bytes from the end of the forward pass on (the
  definition of ``host.partition.training``; the forward is the inference arena);
* the trainer's own exact accounting (``last_bytes``).

It also compares, per example, measured bytes with ``host.partition.training``'s
prediction through ``check_measured`` (dw4 frozen, one-byte masks: the tail that
model describes) and shows what training dw4 as well adds.

    $ OPENBLAS_NUM_THREADS=1 nice -n 10 edgelearn bench adapt_memory

One BLAS thread (as on a device; set before numpy loads, or threadpoolctl does it
here): with two threads on a shared machine the step times are mostly noise.
"""

from __future__ import annotations

import statistics
import time
import tracemalloc

import numpy as np

from bench.common import row, write_results

STRATS = ("bias-only", "residual-adapter", "lora", "sparse", "full")
BATCH = 16
DOMAIN = np.lib.tracemalloc_domain


def _numpy_bytes() -> int:
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, DOMAIN)])
    return sum(s.size for s in snap.statistics("filename"))


def local_features(n=256):
    """int8 backbone outputs and labels of corpus test clips (the device's feature cache)."""
    from edge.adapt.conv import Backbone
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys
    from host.data.corpus import build_corpus

    bundle = load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys())
    x, y, _ = build_corpus(progress=False).eval_clips("test")
    pick = np.random.default_rng(0).choice(len(x), n, replace=False)
    km, bb = KeywordModel(bundle), Backbone(bundle)
    return bundle, bb, bb(km.features(x[pick])), y[pick]


def measure(base, qparams, strategy, x, y, chosen, train_dw=True, pack=True):
    from edge.adapt.conv import ConvTail
    from edge.adapt.convtrain import ConvTrainer

    def make():
        tail = ConvTail(dict(base), qparams=qparams, train_dw=train_dw, pack_masks=pack)
        return ConvTrainer(tail, strategy, "adam", sparse_weights=chosen)

    peak_np = [0]

    def probe(_tag=None):
        peak_np[0] = max(peak_np[0], _numpy_bytes())

    tracemalloc.start()
    before_np = _numpy_bytes()
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    tr = make()
    tr.step(x[:BATCH], y[:BATCH])
    raw = tracemalloc.get_traced_memory()[1] - before
    tr.step(x[:BATCH], y[:BATCH], probe=probe)
    beyond = peak_np[0] - before_np
    tracemalloc.stop()
    return {"peak": raw, "beyond": beyond, "acct": tr.step_bytes(), "names": tr.names, "trainer": tr}


def time_steps(res, x, y, rounds=60):
    """Step times, strategies interleaved round-robin so machine load hits them alike.

    Also times the plain inference forward of the same batch through the same tail
    (``forward``): every strategy has to run it each step, since the trained
    tensors change what it computes, so ``full step / forward`` bounds how much
    faster than full any strategy's step can be.
    """
    times = {s: [] for s in res}
    fwd = []
    tail = res["full"]["trainer"].tail
    for i in range(rounds):
        a = (i * BATCH) % (len(x) - BATCH)
        for s, r in res.items():
            t = time.perf_counter()
            r["trainer"].step(x[a:a + BATCH], y[a:a + BATCH])
            times[s].append(time.perf_counter() - t)
        t = time.perf_counter()
        tail.forward(x[a:a + BATCH], chunk=res["full"]["trainer"].forward_chunk)
        fwd.append(time.perf_counter() - t)
    for s, r in res.items():
        r["ms"] = statistics.median(times[s][5:]) * 1e3
        r["ms_min"] = min(times[s]) * 1e3
    return statistics.median(fwd[5:]) * 1e3


def host_check(base, qparams, x, y, rows):
    from edge.adapt.conv import ConvTail
    from edge.adapt.convtrain import ConvTrainer
    from host.partition.training import TailOp, check_measured, training_memory

    ops = [TailOp("linear", 0, "pw4", 125, 64, 64, True), TailOp("pool", 1, "pool", 125, 64, 64, False),
           TailOp("linear", 2, "cls", 1, 64, base["cls_w"].shape[1], False)]
    for train_dw in (False, True):
        for s in STRATS:
            peak = [0]

            def probe(_tag=None):
                peak[0] = max(peak[0], _numpy_bytes())

            tracemalloc.start()
            before = _numpy_bytes()
            tail = ConvTail(dict(base), qparams=qparams, train_dw=train_dw, pack_masks=train_dw)
            tr = ConvTrainer(tail, s, "adam", sparse_weights=["cls_w"] if s == "sparse" else ())
            tr.step(x[:1], y[:1], probe=probe)
            tracemalloc.stop()
            pred = training_memory(ops, s, "adam", rank=4)
            [r] = check_measured({s: pred}, {s: peak[0] - before})
            scope = "whole tail (dw4 trains)" if train_dw else "dw4 frozen (host model's tail)"
            rows.append(row("adapt_memory", f"{s} bytes per example, {scope}, measured vs predicted",
                            r["measured"], "B", "host.partition.training prediction", r["predicted"],
                            ratio=r["ratio"], within_10pct=r["ok"]))


def main():
    try:  # optional: present wherever scikit-learn is; otherwise set OPENBLAS_NUM_THREADS=1
        from threadpoolctl import threadpool_limits
    except ImportError:
        print("note: threadpoolctl missing; set OPENBLAS_NUM_THREADS=1 for one BLAS thread")
        return _main()
    with threadpool_limits(limits=1):
        return _main()


def _main():
    from edge.adapt.conv import ConvTail, load_tail
    from edge.adapt.convtrain import choose_sparse

    bundle, bb, x, y = local_features()
    base = load_tail(bundle)
    chosen = choose_sparse(ConvTail(base, qparams=bb.qparams), x[:BATCH], y[:BATCH], 48 * 1024, "adam")
    res = {s: measure(base, bb.qparams, s, x, y, chosen if s == "sparse" else ()) for s in STRATS}
    fwd_ms = time_steps(res, x, y)
    full = res["full"]
    rows = [row("adapt_memory", "inference forward of the batch (every strategy's step runs it)", round(fwd_ms, 3),
                "ms", "full fine-tune step", round(full["ms"], 3), ratio=full["ms"] / fwd_ms,
                note="ratio = the most any strategy's step can gain on full's while it recomputes the forward")]
    for s in STRATS:
        r = res[s]
        rows.append(row("adapt_memory", f"{s}: tracemalloc peak of a step (adam, batch {BATCH})", r["peak"], "B",
                        "full fine-tune", full["peak"], tensors=r["names"]))
        rows.append(row("adapt_memory", f"{s}: bytes beyond inference (numpy, from end of forward)",
                        r["beyond"], "B", "full fine-tune", full["beyond"]))
        rows.append(row("adapt_memory", f"{s}: trainer's exact accounting", r["acct"], "B",
                        "full fine-tune", full["acct"]))
        rows.append(row("adapt_memory", f"{s}: step time (median of 55, interleaved)", round(r["ms"], 3), "ms",
                        "full fine-tune", round(full["ms"], 3)))
        rows.append(row("adapt_memory", f"{s}: step time (fastest of 60)", round(r["ms_min"], 3), "ms",
                        "full fine-tune", round(full["ms_min"], 3)))
    host_check(base, bb.qparams, x, y, rows)
    write_results("adapt_memory", rows)
    return rows


if __name__ == "__main__":
    main()
