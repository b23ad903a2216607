"""Training-memory model vs a numpy reference trainer measured with tracemalloc.

The trainer below does one forward + backward + update step of the trainable tail
for every strategy and optimiser. Its memory is numpy's own tracemalloc domain
(array data only: the per-object headers CPython adds do not exist in the
MicroPython or C trainers), sampled after every statement that allocates.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from host.partition.training import (STRATEGIES, TailOp, all_strategies, check_measured,
                                     training_memory)

DOMAIN = np.lib.tracemalloc_domain


class Meter:
    def __init__(self):
        self.peak = 0

    def __call__(self):
        snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, DOMAIN)])
        self.peak = max(self.peak, sum(s.size for s in snap.statistics("filename")))


def _numpy_bytes() -> int:
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, DOMAIN)])
    return sum(s.size for s in snap.statistics("filename"))


def reference_step(ops, frozen, x0, label, strategy, optimizer, rank=4, lr=0.01):
    """One step; returns measured training bytes (peak after forward, minus before init)."""
    m = Meter()
    base = _numpy_bytes()
    chosen = {[o for o in ops if o.kind == "linear"][-1].layer}
    rng = np.random.default_rng(1)
    P = {}   # trainable params per op index: name -> array
    for i, o in enumerate(ops):
        if o.kind != "linear":
            continue
        W, b = frozen[i]
        full = strategy == "full" or (strategy == "sparse" and o.layer in chosen)
        if full:
            P[i] = {"W": W.copy(), "b": b.copy()}
        elif strategy in ("bias-only", "sparse"):
            P[i] = {"b": b.copy()}
        elif strategy == "lora":
            P[i] = {"A": rng.normal(0, .1, (o.cin, rank)).astype(np.float32),
                    "B": np.zeros((rank, o.cout), np.float32)}
        else:
            P[i] = {"A": rng.normal(0, .1, (o.cout, rank)).astype(np.float32),
                    "B": np.zeros((rank, o.cout), np.float32)}
    G = {i: {k: np.empty_like(v) for k, v in d.items()} for i, d in P.items()}
    S = {i: {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in d.items()} for i, d in P.items()} \
        if optimizer == "adam" else {}
    # ---- forward: inference; keep only what backward needs -------------------
    keep = {}
    x = x0
    for i, o in enumerate(ops):
        if o.kind == "pool":
            x = x.mean(axis=0)
            continue
        W, b = frozen[i]
        Wt = P[i]["W"] if "W" in P[i] else W
        bt = P[i]["b"] if "b" in P[i] else b
        y = x @ Wt
        y += bt
        k = {}
        full = strategy == "full" or (strategy == "sparse" and o.layer in chosen)
        # The tail's input lives in the inference arena, which the next inference
        # overwrites: a trainer that needs it keeps its own copy.
        xk = x.copy() if x is x0 and (full or strategy == "lora") else x
        if full:
            k["x"] = xk
        if strategy == "lora":
            u = x @ P[i]["A"]
            t = u @ P[i]["B"]
            y += t
            del t
            k["x"], k["u"] = xk, u
        if strategy == "residual-adapter":
            h = y @ P[i]["A"]
            k["ma"] = h > 0
            np.maximum(h, 0, out=h)
            z = h @ P[i]["B"]
            z += y
            k["y"], k["h"] = y, h
            y = z
        collapse = (not full and strategy in ("bias-only", "sparse") and i == 0
                    and len(ops) > 1 and ops[1].kind == "pool")
        if o.relu:
            if collapse:
                k["count"] = (y > 0).sum(axis=0, dtype=np.float32)
            else:
                k["mask"] = y > 0
            np.maximum(y, 0, out=y)
        keep[i] = k
        x = y
    logits = x
    e = np.exp(logits - logits.max())
    e /= e.sum()
    e[label] -= 1.0
    dy = e
    del x, xk, y, logits, e
    tracemalloc.reset_peak()
    m()
    # ---- backward ---------------------------------------------------------------
    for i in range(len(ops) - 1, -1, -1):
        o = ops[i]
        if o.kind == "pool":
            if i == 0 or "count" in keep.get(i - 1, {}):
                continue  # dy stays the pooled C-vector
            dx = np.empty((o.positions, o.cin), np.float32)
            dx[:] = dy / o.positions
            m()
            dy = dx
            continue
        k = keep.pop(i)
        if "count" in k:
            np.multiply(dy, k["count"] / o.positions, out=G[i]["b"])
            m()
            del k
            continue
        if "mask" in k:
            dy *= k["mask"]
        W = frozen[i][0]
        dx = None
        if i > 0:
            dx = dy @ (P[i]["W"] if "W" in P[i] else W).T
            m()
        if "b" in G[i]:
            dy.sum(axis=0, out=G[i]["b"]) if dy.ndim == 2 else np.copyto(G[i]["b"], dy)
        if "W" in G[i]:
            np.matmul(k["x"].reshape(-1, o.cin).T, dy.reshape(-1, o.cout), out=G[i]["W"])
        if strategy == "lora":
            np.matmul(k["u"].reshape(-1, rank).T, dy.reshape(-1, o.cout), out=G[i]["B"])
            du = dy @ P[i]["B"].T
            m()
            np.matmul(k["x"].reshape(-1, o.cin).T, du.reshape(-1, rank), out=G[i]["A"])
            if dx is not None:
                t = du @ P[i]["A"].T
                m()
                dx += t
                del t
            del du
        if strategy == "residual-adapter":
            np.matmul(k["h"].reshape(-1, rank).T, dy.reshape(-1, o.cout), out=G[i]["B"])
            dh = dy @ P[i]["B"].T
            dh *= k["ma"]
            np.matmul(k["y"].reshape(-1, o.cout).T, dh.reshape(-1, rank), out=G[i]["A"])
            t = dh @ P[i]["A"].T
            m()
            t += dy
            del dh
            if dx is not None:
                dx = t @ W.T  # dx through the frozen weight with the adapter's gradient added
                m()
            del t
        m()
        del k
        dy = dx
        if dy is None:
            break
    # ---- update (in place) --------------------------------------------------------
    for i, d in P.items():
        for name, p in d.items():
            g = G[i][name]
            if optimizer == "sgd":
                g *= lr
                p -= g
            else:
                mo, v = S[i][name]
                mo *= 0.9
                t = 0.1 * g
                m()
                mo += t
                del t
                np.multiply(g, g, out=g)
                v *= 0.999
                v += 0.001 * g
                np.sqrt(v, out=g)
                g += 1e-8
                np.divide(mo, g, out=g)
                g *= lr
                p -= g
            m()
    return m.peak - base


def _tail(cin=64, cout=64, positions=125, emb=64, classes=12, with_emb=True):
    ops = [TailOp("linear", 8, "pw", positions, cin, cout, True),
           TailOp("pool", 9, "pool", positions, cout, cout, False)]
    if with_emb:
        ops.append(TailOp("linear", 10, "emb", 1, cout, emb, True))
        ops.append(TailOp("linear", 11, "cls", 1, emb, classes, False))
    else:
        ops.append(TailOp("linear", 10, "cls", 1, cout, classes, False))
    return ops


def _frozen(ops, seed=0):
    rng = np.random.default_rng(seed)
    return {i: (rng.normal(0, .2, (o.cin, o.cout)).astype(np.float32),
                rng.normal(0, .1, o.cout).astype(np.float32)) for i, o in enumerate(ops) if o.kind == "linear"}


@pytest.fixture(scope="module")
def traced():
    tracemalloc.start()
    yield
    tracemalloc.stop()


@pytest.mark.parametrize("shape", [dict(), dict(with_emb=False), dict(cin=32, cout=48, positions=60)])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_prediction_within_10_percent_of_numpy_trainer(traced, shape, optimizer, strategy):
    ops = _tail(**shape)
    frozen = _frozen(ops)
    x0 = np.random.default_rng(2).normal(size=(ops[0].positions, ops[0].cin)).astype(np.float32)
    measured = reference_step(ops, frozen, x0, 3, strategy, optimizer)
    predicted = training_memory(ops, strategy, optimizer)
    rows = check_measured({strategy: predicted}, {strategy: measured})
    assert rows[0]["ok"], (predicted.as_dict(), measured)


def test_bias_only_is_much_smaller_than_full_tail():
    ops = _tail(with_emb=False)
    mem = all_strategies(ops, "sgd")
    assert mem["full"].total >= 6.5 * mem["bias-only"].total
    assert mem["bias-only"].activations < mem["full"].activations / 50


def test_adam_adds_two_moments_per_parameter():
    ops = _tail()
    for s in STRATEGIES:
        sgd, adam = training_memory(ops, s, "sgd"), training_memory(ops, s, "adam")
        assert adam.optimizer_state == 2 * adam.params and sgd.optimizer_state == 0


def test_hook_rejects_unknown_strategy_and_flags_misses():
    pred = all_strategies(_tail())
    rows = check_measured(pred, {"full": pred["full"].total * 2})
    assert not rows[0]["ok"] and rows[0]["ratio"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="no prediction"):
        check_measured(pred, {"prototype": 1})
