"""EmbeddingHead trainers: exact gradients, LoRA merge, replay, byte accounting, store/rollback, pause/resume."""

from __future__ import annotations

import numpy as np
import pytest

from edge.adapt import EmbeddingHead, Trainer, choose_sparse, mix_replay
from edge.adapt.run import train
from edge.adapt.store import AdaptStore
from edge.errors import EdgelearnError
from edge.portable.replay import ReplayBuffer

DIM, C = 16, 6


class FakeBundle:
    model_id, version = "m", 3


def base(seed=0):
    rng = np.random.default_rng(seed)
    return {"proj.w": np.eye(DIM, dtype=np.float32), "proj.b": np.zeros(DIM, np.float32),
            "classifier.w": rng.standard_normal((DIM, C)).astype(np.float32),
            "classifier.b": rng.standard_normal(C).astype(np.float32) * 0.1}


def data(n=48, seed=1):
    rng = np.random.default_rng(seed)
    return np.abs(rng.standard_normal((n, DIM))).astype(np.float32), rng.integers(0, C, n)


def loss(tail, x, y):
    p = tail.probs(x)
    return float(-np.log(p[np.arange(len(y)), y]).mean())


@pytest.mark.parametrize("strategy", ["bias-only", "residual-adapter", "lora", "full"])
def test_gradients_match_finite_differences(strategy):
    x, y = data()
    tail = EmbeddingHead({k: v.astype(np.float64) for k, v in base().items()})
    tr = Trainer(tail, strategy, "sgd", lr=0.0)
    rng = np.random.default_rng(5)
    for n in tr.names:  # move off the zero init so every path has a gradient
        tail.delta[n] = tail.delta[n].astype(np.float64) + 0.05 * rng.standard_normal(tail.delta[n].shape)
    logits, cache = tail.forward(x.astype(np.float64), keep=True)
    from edge.adapt.trainer import _dlogits
    g = tail.backward(cache, _dlogits(logits, y), set(tr.names))
    for n in tr.names:
        p = tail.delta[n]
        idx = tuple(rng.integers(0, s) for s in p.shape)
        old = p[idx]
        p[idx] = old + 1e-6
        up = loss(tail, x.astype(np.float64), y)
        p[idx] = old - 1e-6
        down = loss(tail, x.astype(np.float64), y)
        p[idx] = old
        assert g[n][idx] == pytest.approx((up - down) / 2e-6, rel=1e-4, abs=1e-8), n


@pytest.mark.parametrize("strategy", ["bias-only", "residual-adapter", "lora", "full"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_training_reduces_loss_and_starts_from_base(strategy, optimizer):
    x, y = data()
    b = base()
    tail = EmbeddingHead(b)
    start = tail.probs(x)
    tr = Trainer(tail, strategy, optimizer)
    np.testing.assert_allclose(tail.probs(x), start, atol=1e-6)  # zero-init adapters: no change yet
    losses = [tr.step(x, y) for _ in range(60)]
    assert losses[-1] < 0.9 * losses[0]
    assert all(np.array_equal(b[k], base()[k]) for k in b)  # the base is never modified


def test_lora_merged_equals_unmerged():
    x, y = data()
    tail = EmbeddingHead(base())
    tr = Trainer(tail, "lora", "adam", rank=3)
    for _ in range(30):
        tr.step(x, y)
    merged = EmbeddingHead(base(), tail.merged())
    assert not any(".lora_" in k for k in merged.delta)
    np.testing.assert_allclose(merged.probs(x), tail.probs(x), atol=1e-5)


def test_byte_accounting_is_exact_and_ordered():
    x, y = data(n=32)
    got = {}
    for s in ("bias-only", "residual-adapter", "lora", "full"):
        tr = Trainer(EmbeddingHead(base()), s, "adam")
        tr.step(x, y)
        got[s] = tr.last_bytes
        n_params = sum(tr.tail.delta[k].size for k in tr.names)
        assert got[s]["params"] == got[s]["grads"] == 4 * n_params
        assert got[s]["optimizer_state"] == 8 * n_params
    assert got["bias-only"]["activations"] == 32 * DIM  # one bool ReLU mask, no stored inputs
    total = {s: sum(v.values()) for s, v in got.items()}
    assert total["bias-only"] < total["lora"] < total["full"]


def test_sparse_respects_memory_budget():
    x, y = data()
    tail = EmbeddingHead(base())
    chosen = choose_sparse(tail, x, y, memory_budget=4 * 2 * (DIM * C + C + DIM), optimizer="sgd")
    assert "proj.w" not in chosen and chosen
    tr = Trainer(tail, "sparse", "sgd", sparse_tensors=chosen)
    assert tr.names == chosen
    with pytest.raises(EdgelearnError, match="fits no tail tensor"):
        choose_sparse(tail, x, y, memory_budget=8, optimizer="sgd")


def test_replay_is_mixed_into_every_batch():
    rb = ReplayBuffer(DIM, 4096)
    xr, yr = data(20, seed=9)
    for v, lab in zip(xr, yr):
        rb.add(list(v), int(lab))
    x, y = data(8)
    bx, by = mix_replay(x, y, rb, 8)
    assert bx.shape == (16, DIM) and set(by[8:]) <= set(yr)
    assert mix_replay(x, y, None, 8)[0].shape == (8, DIM)


def test_store_contexts_and_rollback(tmp_path):
    st = AdaptStore(tmp_path, FakeBundle)
    assert st.load() == {}
    v1 = st.save("kitchen", {"proj.b": np.ones(DIM, np.float32)})
    v2 = st.save("kitchen", {"proj.b": np.full(DIM, 2.0, np.float32)})
    st.save("car", {"classifier.b": np.ones(C, np.float32)})
    assert (v1, v2) == (1, 2)
    again = AdaptStore(tmp_path, FakeBundle)
    assert set(again.load()) == {"classifier.b"}
    assert again.load("kitchen")["proj.b"][0] == 2.0
    again.rollback("kitchen")
    assert AdaptStore(tmp_path, FakeBundle).load("kitchen")["proj.b"][0] == 1.0
    with pytest.raises(EdgelearnError, match="not usable"):
        again.save("../evil", {})

    class Other:
        model_id, version = "m", 4
    with pytest.raises(EdgelearnError, match="trained on bundle"):
        AdaptStore(tmp_path, Other)


def test_pause_and_resume_equal_an_uninterrupted_run(tmp_path):
    x, y = data()
    ref = Trainer(EmbeddingHead(base()), "lora", "adam")
    r = train(ref, x, y, AdaptStore(tmp_path / "a", FakeBundle), "ctx", steps=40, batch=8, checkpoint_every=7)
    assert r["status"] == "done"
    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        return calls["n"] % 13 != 0  # a condition breaks every 13 checks

    store = AdaptStore(tmp_path / "b", FakeBundle)
    res = {"status": "paused"}
    rounds = 0
    while res["status"] == "paused":
        tr = Trainer(EmbeddingHead(base()), "lora", "adam")  # a fresh process each time
        res = train(tr, x, y, store, "ctx", steps=40, batch=8, should_continue=flaky, checkpoint_every=7)
        rounds += 1
    assert rounds > 2
    a = AdaptStore(tmp_path / "a", FakeBundle).load("ctx")
    b = store.load("ctx")
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], atol=1e-6)
    assert not (tmp_path / "b" / "adapt" / "checkpoint.npz").exists()


def test_soft_targets_are_exact_gradients_and_one_hot_targets_equal_labels():
    from edge.adapt.trainer import _dlogits, _xent
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((5, C))
    y = rng.integers(0, C, 5)
    onehot = np.eye(C)[y]
    np.testing.assert_allclose(_dlogits(logits, y, onehot), _dlogits(logits, y), atol=1e-12)
    assert _xent(logits, y, onehot) == pytest.approx(_xent(logits, y))
    soft = rng.dirichlet(np.ones(C), 5)
    g = _dlogits(logits, y, soft)
    for i, j in ((0, 1), (3, 4)):
        up, down = logits.copy(), logits.copy()
        up[i, j] += 1e-6
        down[i, j] -= 1e-6
        assert g[i, j] == pytest.approx((_xent(up, y, soft) - _xent(down, y, soft)) / 2e-6, rel=1e-5)
    tr = Trainer(EmbeddingHead(base()), "full", "sgd")
    with pytest.raises(EdgelearnError, match="soft targets have shape"):
        tr.step(*data(4), targets=np.ones((4, C + 1)))


def test_distillation_on_replay_keeps_the_old_models_outputs(tmp_path):
    # local data whose labels disagree with the base model; replay holds what the base saw.
    # Distilling the base on the replay examples must keep its outputs there closer than
    # replaying labels alone (and labels alone closer than no replay).
    x, _ = data(64, seed=2)
    y = np.zeros(64, np.int64)                      # the local context says "class 0" to everything
    xr, _ = data(60, seed=9)
    ref = EmbeddingHead(base())
    p0 = ref.probs(xr)
    yr = p0.argmax(1)
    rb = ReplayBuffer(DIM, 8192)
    for v, lab in zip(xr, yr):
        rb.add(list(v), int(lab))

    def drift(name, teacher, replay):
        tail = EmbeddingHead(base())
        tr = Trainer(tail, "full", "adam", lr=0.01)
        r = train(tr, x, y, AdaptStore(tmp_path / name, FakeBundle), "ctx",
                  steps=60, batch=8, replay=replay, replay_n=8, teacher=teacher, distill=1.0)
        assert r["status"] == "done"
        p = tail.probs(xr)
        return float(np.mean(np.sum(p0 * (np.log(p0) - np.log(p)), axis=1)))   # KL(base || adapted)

    none, labels, kd = drift("none", None, None), drift("labels", None, rb), drift("kd", ref.probs, rb)
    assert kd < labels < none
