"""The aggregator's rehearsal set (issue 18): embeddings of the voices the shipped model was trained on,
shipped with every version, which devices train on beside their own examples so that federated rounds
do not forget those voices."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from edge.errors import EdgelearnError
from edge.fl.model import REHEARSAL_FILE, head_logits, load_rehearsal, shipped_head_trainer
from edge.store import BundleError

STATUS = {"battery": 1.0, "charging": True, "network": "wifi"}


def _labels(n=37):
    return [f"w{i}" for i in range(n - 2)] + ["_unknown_", "_silence_"]


def _rehearsal(params, n, seed):
    """n embeddings the head names confidently, with the labels it gives them."""
    from edge.fl.model import head_logits

    X = (np.random.default_rng(seed).standard_normal((n, params["proj.w"].shape[0])) * 2).astype(np.float32)
    return X, head_logits(params, X).argmax(1).astype(np.int64)


def _aggregator(tmp_path, rehearsal):
    from host.aggregator.config import AggregatorConfig
    from host.aggregator.inprocess import make_state, small_params

    params = small_params(0)
    state, keys = make_state(tmp_path, AggregatorConfig(clients_per_round=1), n_devices=1, params=params,
                             rehearsal=rehearsal(params) if callable(rehearsal) else rehearsal)
    return state, params, next(iter(keys.items()))


class Recording:
    """A trainer that records what it was given and trains as the shipped-head task does."""

    def __init__(self, labels):
        self.inner, self.seen = shipped_head_trainer(labels), None

    def train(self, params, X, y, task, rng):
        self.seen = (np.array(X), np.array(y))
        return self.inner.train(params, X, y, task, rng)


def test_every_version_ships_the_rehearsal_set_and_devices_train_on_it(tmp_path):
    from edge.fl import FLClient
    from host.aggregator.app import build_app
    from host.aggregator.inprocess import InProcessTransport

    state, params, (dev, key) = _aggregator(tmp_path, lambda p: _rehearsal(p, 30, 1))
    Xr, yr = np.load(state / REHEARSAL_FILE)["X"], np.load(state / REHEARSAL_FILE)["y"]
    local = (np.random.default_rng(2).standard_normal((20, 64)).astype(np.float32), np.arange(20) % 5)
    trainer = Recording(_labels())
    app = build_app(state, tick_interval=0)
    with InProcessTransport(app) as t:
        c = FLClient(t, dev, key, tmp_path / "dev", trusted_keys=state / "keys", data=local, trainer=trainer)
        task = c.checkin(STATUS)["task"]
        delta, n = c.train(task)
        assert n == 20  # the update is weighted by the device's own examples, not the shipped ones
        X, y = trainer.seen
        assert len(y) == 50 and np.array_equal(X[:20], local[0]) and np.array_equal(X[20:], Xr)
        assert np.array_equal(y[20:], yr)
        b = c.store.current()
        assert b.manifest["extra"]["rehearsal"] == {"file": REHEARSAL_FILE, "rows": 30}
        v = app.state.aggregator.rounds.publish_params({k: v + 0.01 for k, v in params.items()}, "test")
        c.ensure_model(v)  # the next version carries the same set, and the device installs it
        nb = c.store.current()
        assert nb.version == v and np.array_equal(load_rehearsal(nb, params)[0], Xr)


def test_a_version_without_a_rehearsal_set_trains_on_the_device_examples_alone(tmp_path):
    from edge.fl import FLClient
    from host.aggregator.app import build_app
    from host.aggregator.inprocess import InProcessTransport

    state, params, (dev, key) = _aggregator(tmp_path, None)
    local = (np.random.default_rng(2).standard_normal((20, 64)).astype(np.float32), np.arange(20) % 5)
    trainer = Recording(_labels())
    with InProcessTransport(build_app(state, tick_interval=0)) as t:
        c = FLClient(t, dev, key, tmp_path / "dev", trusted_keys=state / "keys", data=local, trainer=trainer)
        _, n = c.train(c.checkin(STATUS)["task"])
        assert n == 20 and len(trainer.seen[1]) == 20
        assert "rehearsal" not in c.store.current().manifest["extra"]


def test_rehearsal_keeps_what_the_head_knew():
    """Local examples that contradict the head (a new voice) pull it away from what it named right;
    the same training with rehearsal rows of those voices keeps far more of it."""
    from host.aggregator.inprocess import small_params

    params = small_params(0)
    X_old, y_old = _rehearsal(params, 400, 1)
    rng = np.random.default_rng(3)
    X_new = (rng.standard_normal((200, 64)) * 2).astype(np.float32)
    y_new = rng.integers(0, 6, 200)  # the device's voice: its words land where others' words were
    task = {"learning_rate": 0.1, "local_epochs": 5, "batch_size": 16}

    def old_accuracy(rehearse):
        X, y = X_new, y_new
        if rehearse:
            X, y = np.concatenate([X, X_old[:200]]), np.concatenate([y, y_old[:200]])
        new = shipped_head_trainer(_labels()).train(params, X, y, task, np.random.default_rng(0))
        return float(np.mean(head_logits({**params, **new}, X_old[200:]).argmax(1) == y_old[200:]))

    plain, rehearsed = old_accuracy(False), old_accuracy(True)
    assert plain < 0.8 and rehearsed > plain + 0.1, (plain, rehearsed)


@pytest.mark.parametrize("bad, why", [
    (lambda p: (np.zeros((5, 32), np.float32), np.zeros(5, np.int64)), "needs finite"),
    (lambda p: (np.zeros((5, 64), np.float32), np.full(5, 99)), "labels from 0 to 36"),
    (lambda p: (np.full((5, 64), np.nan, np.float32), np.zeros(5, np.int64)), "needs finite"),
    (lambda p: (np.zeros((5, 64), np.float32), np.zeros(4, np.int64)), "needs finite"),
])
def test_a_rehearsal_set_that_does_not_fit_is_one_sentence_and_writes_nothing(tmp_path, bad, why):
    with pytest.raises(EdgelearnError, match=why) as e:
        _aggregator(tmp_path, bad)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "agg").exists()


def test_a_version_whose_rehearsal_set_does_not_fit_is_not_installed(tmp_path):
    from edge.atomic import atomic_write, npz_bytes
    from edge.fl import FLClient
    from host.aggregator.app import build_app
    from host.aggregator.inprocess import InProcessTransport

    state, params, (dev, key) = _aggregator(tmp_path, lambda p: _rehearsal(p, 10, 1))
    app = build_app(state, tick_interval=0)
    with InProcessTransport(app) as t:
        c = FLClient(t, dev, key, tmp_path / "dev", trusted_keys=state / "keys", data=None)
        v1 = int(c.checkin(STATUS)["task"]["model_version"])
        c.ensure_model(v1)
        # an operator's mistake after init: the file the next version ships no longer fits the head
        atomic_write(state / REHEARSAL_FILE, npz_bytes({"X": np.zeros((3, 16), np.float32), "y": np.zeros(3)}))
        v2 = app.state.aggregator.rounds.publish_params({k: v + 0.01 for k, v in params.items()}, "test")
        with pytest.raises(BundleError, match="rehearsal set rehearsal.npz does not fit its head"):
            c.ensure_model(v2)
        assert c.current_version() == v1


@pytest.mark.parametrize("args, says", [
    (["--rehearsal", "missing.npz"], "--rehearsal missing.npz does not exist"),
    (["--rehearsal", "x.npz", "--rehearsal-corpus", "4"], "both name a rehearsal set"),
    (["--rehearsal-corpus", "-3"], "--rehearsal-corpus -3 is negative"),
])
def test_bad_rehearsal_options_are_one_sentence(tmp_path, args, says):
    r = subprocess.run([sys.executable, "-m", "edge.cli", "aggregator", "init", "--state", str(tmp_path / "s"),
                        *args], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


def test_rehearsal_rows_take_each_command_from_the_training_voices_and_nest():
    from host.fleet.data import EmbeddingSet, rehearsal_rows
    from host.fleet.simulate import SimConfig, simulated_rehearsal

    rng = np.random.default_rng(0)
    y = np.concatenate([np.repeat(np.arange(37), 6), np.repeat(np.arange(37), 6)]).astype(np.int16)
    split = np.array(["train"] * 222 + ["val"] * 222)
    data = EmbeddingSet(rng.standard_normal((444, 64)).astype(np.float32), y, np.array(["espeak:x"] * 444), split)
    small, large = rehearsal_rows(data, [2, 5], 2), rehearsal_rows(data, [2, 5], 5)
    assert (split[large] == "train").all() and list(y[large]) == [2] * 5 + [5] * 5
    assert set(small) <= set(large)  # a smaller set is part of a larger one
    labels = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"] + _labels()[10:]
    rows = simulated_rehearsal(data, SimConfig(rehearsal_per_command=3), labels)
    assert len(rows) == 30 and sorted(set(y[rows])) == list(range(10))
    with pytest.raises(EdgelearnError, match="has 6 clips of label 2, fewer than 7"):
        rehearsal_rows(data, [2], 7)
