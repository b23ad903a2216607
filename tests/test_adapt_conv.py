"""The conv tail (dw4 -> pw4 -> pool -> classifier): exact gradients, LoRA merge, byte accounting,
and measured step memory against ``host.partition.training``'s prediction through its hook."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from edge.adapt.conv import ConvTail, dwconv
from edge.adapt.prefix import Prefix
from edge.adapt.convreplay import ReplayPool, mix_replay
from edge.adapt.convtrain import ConvTrainer, choose_sparse
from edge.errors import EdgelearnError

STRATS = ("bias-only", "residual-adapter", "lora", "sparse", "full")


def tail_arrays(c=8, k=5, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return {"dw4_w": rng.normal(0, .4, (3, 3, c)).astype(dtype), "dw4_b": rng.normal(0, .1, c).astype(dtype),
            "pw4_w": rng.normal(0, .4, (c, c)).astype(dtype), "pw4_b": rng.normal(0, .1, c).astype(dtype),
            "cls_w": rng.normal(0, .5, (c, k)).astype(dtype), "cls_b": rng.normal(0, .1, k).astype(dtype)}


def data(n=6, h=5, w=3, c=8, k=5, seed=1, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return np.abs(rng.normal(0, 1, (n, h, w, c))).astype(dtype), rng.integers(0, k, n)


def loss(tail, x, y):
    logits, _, _ = tail.forward(x)
    z = logits - logits.max(axis=1, keepdims=True)
    return float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(y)), y]))


def test_forward_matches_the_host_reference():
    from host.tail_export import tail_forward

    t = tail_arrays()
    x, _ = data()
    e_ref, p_ref = tail_forward(t, x)
    e, p = ConvTail(t).infer(x)
    np.testing.assert_allclose(e, e_ref, atol=1e-5)
    np.testing.assert_allclose(p, p_ref, atol=1e-6)
    pad = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    ref = sum(pad[:, i:i + 5, j:j + 3] * t["dw4_w"][i, j] for i in range(3) for j in range(3))
    np.testing.assert_allclose(dwconv(x, t["dw4_w"]), ref, atol=1e-5)


@pytest.mark.parametrize("train_dw", [True, False])
@pytest.mark.parametrize("strategy", STRATS)
def test_gradients_match_finite_differences(strategy, train_dw):
    x, y = data(dtype=np.float64)
    tail = ConvTail(tail_arrays(dtype=np.float64), train_dw=train_dw)
    sw = ["pw4_w", "cls_w"] + (["dw4_w"] if train_dw else []) if strategy == "sparse" else ()
    tr = ConvTrainer(tail, strategy, "sgd", sparse_weights=sw)
    rng = np.random.default_rng(5)
    for n in tr.names:  # move off the zero init so every path has a gradient
        tail.delta[n] = tail.delta[n].astype(np.float64) + 0.1 * rng.standard_normal(tail.delta[n].shape)
        tr.grads[n] = np.zeros_like(tail.delta[n])
    tr.gradients(x, y)
    for n in tr.names:
        p = tail.delta[n]
        for _ in range(3):
            idx = tuple(rng.integers(0, s) for s in p.shape)
            old = p[idx]
            p[idx] = old + 1e-6
            up = loss(tail, x, y)
            p[idx] = old - 1e-6
            down = loss(tail, x, y)
            p[idx] = old
            assert tr.grads[n][idx] == pytest.approx((up - down) / 2e-6, rel=1e-4, abs=1e-9), (n, idx)
    assert ("dw4_b" in tr.names) == (train_dw and strategy in ("bias-only", "sparse", "full"))


@pytest.mark.parametrize("strategy", STRATS)
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_training_reduces_loss_and_starts_from_base(strategy, optimizer):
    x, y = data(n=12)
    b = tail_arrays()
    tail = ConvTail(b)
    start = tail.probs(x)
    tr = ConvTrainer(tail, strategy, optimizer, lr=0.05 if optimizer == "sgd" else 0.01,
                     sparse_weights=["cls_w"] if strategy == "sparse" else ())
    np.testing.assert_allclose(tail.probs(x), start, atol=1e-6)  # zero-init adapters: no change yet
    losses = [tr.step(x, y) for _ in range(80)]
    assert losses[-1] < losses[0] - 0.1 and losses[-1] == min(losses[-10:]) or losses[-1] < 0.8 * losses[0]
    assert all(np.array_equal(b[k], tail_arrays()[k]) for k in b)  # the base is never modified


def test_lora_merged_equals_unmerged_and_adds_nothing_at_inference():
    x, y = data(n=12)
    tail = ConvTail(tail_arrays())
    tr = ConvTrainer(tail, "lora", "adam", rank=3)
    for _ in range(40):
        tr.step(x, y)
    merged = ConvTail(tail_arrays(), tail.merged())
    assert not any(".lora_" in k for k in merged.delta) and set(merged.delta) == {"pw4_w", "cls_w"}
    assert not np.allclose(merged.delta["pw4_w"], tail_arrays()["pw4_w"])  # it did learn something
    np.testing.assert_allclose(merged.probs(x), tail.probs(x), atol=1e-5)


def test_int8_input_is_dequantised_with_the_backbone_qparams():
    t = tail_arrays()
    q = np.random.default_rng(3).integers(-128, 127, (4, 5, 3, 8)).astype(np.int8)
    tail = ConvTail(t, qparams=(0.05, -128))
    np.testing.assert_allclose(tail.probs(q), ConvTail(t).probs((q.astype(np.float32) + 128) * 0.05), atol=1e-6)
    with pytest.raises(EdgelearnError, match="qparams"):
        ConvTail(t).probs(q)


def test_bias_only_keeps_only_bitpacked_masks():
    x, y = data(n=4)
    got = {}
    for s in STRATS:
        tr = ConvTrainer(ConvTail(tail_arrays()), s, "adam", sparse_weights=["pw4_w"] if s == "sparse" else ())
        tr.step(x, y)
        got[s] = tr.last_bytes
        n = sum(tr.tail.delta[k].size for k in tr.names)
        assert got[s]["params"] == got[s]["grads"] == 4 * n and got[s]["optimizer_state"] == 8 * n
    positions = 4 * 5 * 3  # batch x H x W, C = 8 channels: one packed byte per position per mask
    assert got["bias-only"]["activations"] == 2 * positions
    total = {s: sum(v.values()) for s, v in got.items()}
    assert total["bias-only"] < total["lora"] < total["full"]
    assert total["bias-only"] < total["sparse"] < total["full"]


def test_sparse_choice_respects_the_budget_and_always_trains_biases():
    x, y = data(n=8)
    tail = ConvTail(tail_arrays())
    bias_bytes = 4 * 2 * (8 + 8 + 5)
    chosen = choose_sparse(tail, x, y, memory_budget=bias_bytes + 4 * 2 * 8 * 5 + 4 * 8 * 8, optimizer="sgd")
    assert chosen == ["cls_w"]
    assert choose_sparse(tail, x, y, memory_budget=bias_bytes, optimizer="sgd") == []
    assert len(choose_sparse(tail, x, y, memory_budget=10 ** 7, optimizer="adam")) == 3
    with pytest.raises(EdgelearnError, match="biases"):
        choose_sparse(tail, x, y, memory_budget=8, optimizer="sgd")
    with pytest.raises(EdgelearnError, match="not trainable"):
        ConvTrainer(tail, "sparse", sparse_weights=["bogus"])
    with pytest.raises(EdgelearnError, match="labels"):
        ConvTrainer(ConvTail(tail_arrays()), "full").step(x, np.full(len(x), 99))


def test_replay_examples_are_mixed_in_as_tail_inputs():
    from edge.portable.replay import ReplayBuffer

    x, y = data(n=4)
    rb = ReplayBuffer(5 * 3 * 8, 8192)
    for v, lab in zip(x, y):
        rb.add(list(v.ravel()), int(lab))
    bx, by = mix_replay(x, y, rb, 3)
    assert bx.shape == (7, 5, 3, 8) and set(by[4:]) <= set(y)
    np.testing.assert_allclose(bx[4:].max(), x.max(), rtol=0.02)


# --- measured memory vs the host's training-memory model ------------------------------------

DOMAIN = np.lib.tracemalloc_domain


def _numpy_bytes() -> int:
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, DOMAIN)])
    return sum(s.size for s in snap.statistics("filename"))


def measure_step(tail, strategy, optimizer, x, y, sparse_weights=()):
    """numpy bytes a step holds beyond inference: peak from the end of the forward pass on,
    minus what existed before the trainer (the host model's definition)."""
    peak = [0]

    def probe(_tag=None):
        peak[0] = max(peak[0], _numpy_bytes())

    base = _numpy_bytes()
    tr = ConvTrainer(tail, strategy, optimizer, sparse_weights=sparse_weights)
    tr.step(x, y, probe=probe)
    return peak[0] - base, tr


@pytest.fixture(scope="module")
def shipped_shape():
    from host.partition.training import TailOp

    ops = [TailOp("linear", 0, "pw4", 125, 64, 64, True), TailOp("pool", 1, "pool", 125, 64, 64, False),
           TailOp("linear", 2, "cls", 1, 64, 37, False)]
    tracemalloc.start()
    yield ops
    tracemalloc.stop()


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("strategy", STRATS)
def test_measured_step_memory_matches_host_prediction(shipped_shape, strategy, optimizer):
    """dw4 frozen (the tail the host model describes), one example, one-byte masks: within 10 %."""
    from host.partition.training import check_measured, training_memory

    x, y = data(n=1, h=25, w=5, c=64, k=37)
    tail = ConvTail(tail_arrays(c=64, k=37), train_dw=False, pack_masks=False)
    sw = ["cls_w"] if strategy == "sparse" else ()  # the host model's default: the last layer
    measured, tr = measure_step(tail, strategy, optimizer, x, y, sw)
    pred = training_memory(shipped_shape, strategy, optimizer, rank=4)
    [r] = check_measured({strategy: pred}, {strategy: measured})
    assert r["ok"], (pred.as_dict(), measured, tr.last_bytes)
    acct = tr.step_bytes()  # the trainer's own accounting agrees with the measurement too
    assert abs(acct - measured) <= 0.10 * measured, (tr.last_bytes, measured)


def test_whole_tail_costs_more_than_the_host_model_and_bias_only_stays_small(shipped_shape):
    """Training dw4 too (the real tail) needs pw4's P x C mask and gradient map, which the host
    model (no depthwise layers) does not count; bias-only still needs no stored inputs."""
    from host.partition.training import training_memory

    x, y = data(n=1, h=25, w=5, c=64, k=37)
    got = {}
    for s in ("bias-only", "full"):
        got[s], _ = measure_step(ConvTail(tail_arrays(c=64, k=37)), s, "adam", x, y)
        assert got[s] > training_memory(shipped_shape, s, "adam").total
    assert got["full"] > 6.5 * got["bias-only"]


@pytest.mark.parametrize("strategy", STRATS)
def test_chunked_forward_gives_the_same_gradients_and_keeps_the_same_bytes(strategy):
    x, y = data(n=7)
    q = np.round(x * 20).astype(np.int8)  # int8 input: the dequantised copy is kept in chunks too
    got = []
    for chunk in (None, 3):
        tail = ConvTail(tail_arrays(), qparams=(0.05, 0))
        tr = ConvTrainer(tail, strategy, "sgd", sparse_weights=["dw4_w"] if strategy == "sparse" else (),
                         forward_chunk=chunk)
        tr.gradients(q, y)
        got.append(({k: g.copy() for k, g in tr.grads.items()}, tr._kept))
    for k in got[0][0]:
        np.testing.assert_allclose(got[0][0][k], got[1][0][k], rtol=1e-5, atol=1e-7)
    assert got[0][1] == got[1][1]


@pytest.mark.parametrize("strategy", ["bias-only", "lora", "full"])
def test_one_hot_soft_targets_step_exactly_as_labels(strategy):
    x, y = data()
    a, b = ConvTail(tail_arrays()), ConvTail(tail_arrays())
    ta, tb = ConvTrainer(a, strategy, "adam", seed=0), ConvTrainer(b, strategy, "adam", seed=0)
    la = ta.step(x, y)
    lb = tb.step(x, y, targets=np.eye(a.n_classes, dtype=np.float32)[y])
    assert la == pytest.approx(lb, rel=1e-6)
    for n in ta.names:
        np.testing.assert_allclose(a.delta[n], b.delta[n], atol=1e-7)
    with pytest.raises(EdgelearnError, match="soft targets"):
        ta.step(x, y, targets=np.ones((len(y), 2)))


# --- the frozen prefix: computed once per example, the same step ---------------------------

PREFIX_CASES = [("bias-only", False, (), "z2"), ("bias-only", True, (), "x"), ("residual-adapter", True, (), "z2"),
                ("lora", True, (), "y1"), ("sparse", False, ["pw4_w"], "y1"), ("sparse", False, ["cls_w"], "z2"),
                ("sparse", True, ["cls_w"], "x"), ("full", False, (), "y1"), ("full", True, (), "x")]


@pytest.mark.parametrize("strategy,train_dw,sw,stage", PREFIX_CASES)
def test_a_prepared_prefix_gives_the_same_step(strategy, train_dw, sw, stage):
    """The forward starts at the deepest point no trained tensor changes; the step is the same up
    to the prefix's int16 rounding (exactly the same where nothing is skipped)."""
    x, y = data(n=7)
    q = np.round(x * 20).astype(np.int8)
    grads, losses = [], []
    for prepared in (False, True):
        tr = ConvTrainer(ConvTail(tail_arrays(), qparams=(0.05, 0), train_dw=train_dw), strategy, "sgd",
                         sparse_weights=sw)
        assert tr.stage == stage
        xin = tr.prepare(q) if prepared else q
        if prepared:
            assert (xin is q) == (stage == "x") and isinstance(xin, Prefix) == (stage != "x")
        losses.append(tr.gradients(xin, y))
        grads.append({k: g.copy() for k, g in tr.grads.items()})
    assert losses[1] == pytest.approx(losses[0], rel=1e-3)
    for k in grads[0]:
        scale = np.abs(grads[0][k]).max()
        np.testing.assert_allclose(grads[1][k], grads[0][k], atol=2e-3 * scale + 1e-7, err_msg=k)
        if stage == "x":
            np.testing.assert_array_equal(grads[1][k], grads[0][k])


def test_a_prefix_that_skips_trained_tensors_is_refused():
    x, y = data()
    z2 = ConvTrainer(ConvTail(tail_arrays(), train_dw=False), "bias-only").prepare(x)
    assert z2.stage == "z2" and z2.q.dtype == np.int16 and z2.q.shape == (len(x), 15, 8)
    for strategy, train_dw in (("full", False), ("bias-only", True), ("lora", True)):
        with pytest.raises(EdgelearnError, match="prefix skips tensors"):
            ConvTrainer(ConvTail(tail_arrays(), train_dw=train_dw), strategy).step(z2, y)
    with pytest.raises(EdgelearnError, match="different stages"):
        y1 = ConvTrainer(ConvTail(tail_arrays()), "lora").prepare(x)
        Prefix.concat([z2, y1])


def test_bias_only_on_a_prefix_learns_and_never_recomputes_the_frozen_layers(monkeypatch):
    import edge.adapt.conv as conv

    x, y = data(n=12)
    tr = ConvTrainer(ConvTail(tail_arrays(), train_dw=False), "bias-only", "adam", lr=0.05)
    z2 = tr.prepare(x)
    monkeypatch.setattr(conv, "dwconv", lambda *a, **k: pytest.fail("dw4 ran during a step"))
    first = tr.step(z2, y)
    for _ in range(40):
        last = tr.step(z2, y)
    assert last < first and tr.names == ["pw4_b", "cls_b"]


def _replay(x, y):
    from edge.portable.replay import ReplayBuffer

    rb = ReplayBuffer(int(np.prod(x.shape[1:])), 1 << 16)
    for v, lab in zip(x, y):
        rb.add(list(v.ravel()), int(lab))
    return rb


@pytest.mark.parametrize("train_dw", [True, False])
def test_replay_pool_samples_as_mix_replay_and_prepares_once(train_dw):
    """Same class-balanced sequence as mix_replay; teacher posteriors per slot equal teacher(sample)."""
    x, y = data(n=9)
    base = ConvTail(tail_arrays())
    tr = ConvTrainer(ConvTail(tail_arrays(), train_dw=train_dw), "bias-only")
    pool = ReplayPool(_replay(x, y), tr, x.shape[1:], teacher=base.probs)
    ref = _replay(x, y)
    for _ in range(4):
        bx, by, soft = pool.mix(tr.prepare(x[:2]), y[:2], 5)
        rx, ry = mix_replay(x[:2], y[:2], ref, 5)
        np.testing.assert_array_equal(by, ry)
        np.testing.assert_allclose(soft, base.probs(rx[2:]), atol=1e-6)
        if train_dw:  # stage "x": the dequantised slots, as before
            np.testing.assert_allclose(bx, rx, atol=1e-6)
        else:
            assert isinstance(bx, Prefix) and len(bx) == 7
            np.testing.assert_allclose(bx.to_float(), tr.prepare(rx).to_float(), atol=1e-3)
    assert ConvTrainer(ConvTail(tail_arrays()), "full").replay_pool(None, x.shape[1:]) is None


def test_a_paused_run_on_a_prefix_resumes_to_the_same_result(tmp_path):
    from edge.adapt.run import train
    from edge.adapt.store import AdaptStore

    class Bundle:
        model_id, version = "m", 1

    x, y = data(n=10)
    base = ConvTail(tail_arrays())
    results = []
    for pause_at in (None, 7):
        store = AdaptStore(tmp_path / f"s{pause_at}", Bundle())
        calls, rb = iter(range(10 ** 6)), _replay(x, y)  # one buffer: its sampler goes on where it stopped
        tr = ConvTrainer(ConvTail(tail_arrays(), train_dw=False), "bias-only", "adam")
        res = train(tr, x, y, store, "c", 20, batch=4, replay=rb, replay_n=4, teacher=base.probs,
                    should_continue=(lambda: next(calls) != pause_at) if pause_at else (lambda: True))
        if pause_at:
            assert res["status"] == "paused" and res["steps_done"] == 7
            tr = ConvTrainer(ConvTail(tail_arrays(), train_dw=False), "bias-only", "adam")
            res = train(tr, x, y, store, "c", 20, batch=4, replay=rb, replay_n=4, teacher=base.probs)
        assert res["status"] == "done"
        results.append({k: tr.tail.delta[k].copy() for k in tr.names})
    for k in results[0]:
        np.testing.assert_allclose(results[1][k], results[0][k], atol=1e-6)
