"""Peak memory (tracemalloc) and step time of each adaptation strategy on the same tail and data.

The tail is the device tail (64 -> 64 proj + 64 -> 37 classifier on the embedding),
batch 32, Adam. Reference: full fine-tune of the same tail. Also compares each
trainer's exact byte accounting with ``host.partition.training``'s prediction for
this tail (through its ``check_measured`` hook).

    $ edgelearn bench adapt_memory
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np

from bench.common import row, write_results
from edge.adapt import Tail, Trainer, choose_sparse

STRATS = ("bias-only", "residual-adapter", "lora", "sparse", "full")


def base(rng, dim=64, classes=37):
    return {"proj.w": np.eye(dim, dtype=np.float32), "proj.b": np.zeros(dim, np.float32),
            "classifier.w": rng.standard_normal((dim, classes)).astype(np.float32) * 0.3,
            "classifier.b": np.zeros(classes, np.float32)}


def measure(strategy, x, y, rng, optimizer="adam"):
    tail = Tail(base(np.random.default_rng(0)))
    chosen = choose_sparse(tail, x, y, 12 * 1024, optimizer) if strategy == "sparse" else None
    tracemalloc.start()
    tr = Trainer(tail, strategy, optimizer, sparse_tensors=chosen)
    tr.step(x, y)
    tracemalloc.reset_peak()
    base_now = tracemalloc.get_traced_memory()[0]
    tr.step(x, y)
    peak = tracemalloc.get_traced_memory()[1] - base_now
    tracemalloc.stop()
    for _ in range(20):
        tr.step(x, y)
    t = time.perf_counter()
    n = 300
    for _ in range(n):
        tr.step(x, y)
    return peak, (time.perf_counter() - t) / n * 1e3, tr.step_bytes(), tr


def main():
    rng = np.random.default_rng(1)
    x = np.abs(rng.standard_normal((32, 64))).astype(np.float32)
    y = rng.integers(0, 37, 32)
    res = {s: measure(s, x, y, rng) for s in STRATS}
    full_peak, full_ms = res["full"][0], res["full"][1]
    rows = []
    for s in STRATS:
        peak, ms, acct, tr = res[s]
        rows.append(row("adapt_memory", f"{s} peak step memory (tracemalloc, adam, batch 32)", peak, "B",
                        "full fine-tune", full_peak, tensors=tr.names))
        rows.append(row("adapt_memory", f"{s} step time", round(ms, 4), "ms", "full fine-tune", round(full_ms, 4)))
        rows.append(row("adapt_memory", f"{s} accounted bytes (params+grads+opt+kept)", acct, "B",
                        "tracemalloc peak", peak, ratio=peak / acct if acct else None))
    try:
        from host.partition.training import TailOp, check_measured, training_memory

        ops = [TailOp("linear", 0, "proj", 1, 64, 64, True), TailOp("linear", 1, "classifier", 1, 64, 37, False)]
        pred = {s: training_memory(ops, s, "adam", 4) for s in ("bias-only", "lora", "full")}
        # the host model counts one example (P=1 position); scale our batch-32 activations back
        for r in check_measured(pred, {s: res[s][2] for s in pred}, tolerance=0.5):
            rows.append(row("adapt_memory", f"{r['strategy']} accounted vs host prediction", r["measured"], "B",
                            "host.partition.training", r["predicted"], ratio=r["ratio"], within=r["ok"]))
    except ImportError:
        pass
    write_results("adapt_memory", rows)
    return rows


if __name__ == "__main__":
    main()
