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

Each trainer steps on its inputs as ``device adapt`` feeds them: ``ConvTrainer.prepare``
computes, once per example, the part of the forward no trained tensor changes. For
``bias-only, dw4 frozen`` (the device default) that is dw4 and pw4 before its bias, so
its step is bias, ReLU, pool and classifier; the row ``frozen prefix`` times that
once-per-example cost beside a full step's cost per example.

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
from edge.adapt.strategies import STRATEGIES as STRATS

FROZEN_DW = "bias-only, dw4 frozen"  # device default: pw4_b, cls_b; its forward up to pw4's bias is cached
LABEL = {"bias-only": "bias-only, dw4_b trains"}  # --dw4 train: back-propagates through pw4 every step
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
    """Memory of a step; each trainer gets ``x`` as it trains on it (``prepare``: its frozen prefix).

    The prefix is computed before measuring, as the backbone's output is: both are the
    run's cached data, computed once per example; ``prefix`` (below) measures that once.
    """
    from edge.adapt.conv import ConvTail
    from edge.adapt.convtrain import ConvTrainer

    def make():
        tail = ConvTail(dict(base), qparams=qparams, train_dw=train_dw, pack_masks=pack)
        return ConvTrainer(tail, strategy, "adam", sparse_weights=chosen)

    x = make().prepare(x)
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
    return {"peak": raw, "beyond": beyond, "acct": tr.step_bytes(), "names": tr.names, "trainer": tr,
            "x": x, "stage": tr.stage}


def prefix_cost(trainer, x, rounds=5):
    """One-off cost of the frozen prefix: ms per example (median of rounds), tracemalloc peak, bytes kept."""
    trainer.prepare(x[:1])
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        p = trainer.prepare(x)
        times.append((time.perf_counter() - t) / len(x))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    p = trainer.prepare(x[:BATCH])
    peak = tracemalloc.get_traced_memory()[1] - before - p.nbytes
    tracemalloc.stop()
    return statistics.median(times) * 1e3, peak, p.nbytes // BATCH


def time_steps(res, x, y, rounds=60):
    """Step times, strategies interleaved round-robin so machine load hits them alike.

    Also times the plain inference forward of the same batch through the same tail
    (``forward``): a strategy that trains dw4 (full, bias-only with dw4_b) has to run
    all of it each step, so ``full step / forward`` bounds how much faster than full such
    a strategy's step can be; the others start from their cached frozen prefix.
    """
    times = {s: [] for s in res}
    fwd = []
    tail = res["full"]["trainer"].tail
    for i in range(rounds):
        a = (i * BATCH) % (len(x) - BATCH)
        for s, r in res.items():
            xs = r["x"][a:a + BATCH]
            t = time.perf_counter()
            r["trainer"].step(xs, y[a:a + BATCH])
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
    res[FROZEN_DW] = measure(base, bb.qparams, "bias-only", x, y, (), train_dw=False)
    fwd_ms = time_steps(res, x, y)
    full = res["full"]
    rows = [row("adapt_memory", "inference forward of the batch (a step that trains dw4 runs all of it)",
                round(fwd_ms, 3), "ms", "full fine-tune step", round(full["ms"], 3), ratio=full["ms"] / fwd_ms,
                note="ratio = the most a strategy training dw4 can gain on full's step: it recomputes the forward")]
    ms, peak, per_ex = prefix_cost(res[FROZEN_DW]["trainer"], x)
    rows.append(row("adapt_memory", f"{FROZEN_DW}: frozen prefix (dw4, pw4 before its bias), once per example",
                    round(ms, 4), "ms", "full fine-tune step per example", round(full["ms"] / BATCH, 4),
                    ratio=full["ms"] / BATCH / ms, peak_bytes=peak, bytes_per_example=per_ex,
                    backbone_output_bytes_per_example=int(np.prod(x.shape[1:])),
                    note="computed once per run for each local clip and replay slot, never per step; "
                         "held int8 with a scale, like the backbone output it replaces"))
    for s in (*STRATS, FROZEN_DW):
        r, name = res[s], LABEL.get(s, s)
        rows.append(row("adapt_memory", f"{name}: tracemalloc peak of a step (adam, batch {BATCH})", r["peak"], "B",
                        "full fine-tune", full["peak"], tensors=r["names"], forward_starts_at=r["stage"]))
        rows.append(row("adapt_memory", f"{name}: bytes beyond inference (numpy, from end of forward)",
                        r["beyond"], "B", "full fine-tune", full["beyond"]))
        rows.append(row("adapt_memory", f"{name}: trainer's exact accounting", r["acct"], "B",
                        "full fine-tune", full["acct"]))
        rows.append(row("adapt_memory", f"{name}: step time (median of 55, interleaved)", round(r["ms"], 3), "ms",
                        "full fine-tune", round(full["ms"], 3)))
        rows.append(row("adapt_memory", f"{name}: step time (fastest of 60)", round(r["ms_min"], 3), "ms",
                        "full fine-tune", round(full["ms_min"], 3)))
    host_check(base, bb.qparams, x, y, rows)
    write_results("adapt_memory", rows)
    return rows


if __name__ == "__main__":
    main()
