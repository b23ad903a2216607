"""The publication gate's metric and reference (``AggregatorConfig.eval_metric`` / ``eval_against``):
a held-out set that is mostly one label hides a lost class from plain accuracy, and losses under the
tolerance add up over rounds unless they are measured against the version federation started from."""

from __future__ import annotations

import numpy as np
import pytest

from edge.errors import EdgelearnError
from host.aggregator.app import build_app
from host.aggregator.config import AggregatorConfig
from edge.fl.model import head_logits
from host.aggregator.inprocess import InProcessTransport, make_state, small_params


def _heldout(p, n=400, seed=0):
    """Held-out embeddings the head ``p`` names right, 90 % of them label 0 (an ``_unknown_``)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 64)).astype(np.float32)
    y = np.where(rng.random(n) < 0.9, 0, 1 + rng.integers(0, 4, n))
    w = p["classifier.w"].copy()
    w[:, :5] = 0.0
    for k in range(5):  # label k fires along its own direction; the others stay near zero
        X[y == k, k] += 6.0
        w[k, k] = 1.0
    return X, y.astype(np.int64), {**p, "classifier.w": w}


def _registry(tmp_path, classes=None, groups=None, **cfg):
    p = small_params()
    X, y, p = _heldout(p)
    held = (X, y) if classes is None and groups is None else (X, y, classes, groups)
    state, _ = make_state(tmp_path, AggregatorConfig(clients_per_round=1, **cfg), n_devices=1, params=p,
                          heldout=held)
    return build_app(state, tick_interval=0), p, X, y


def _swapped(p, a, b):
    """``p`` with labels a and b exchanged: every a is named b and every b is named a."""
    w = p["classifier.w"].copy()
    w[:, [a, b]] = w[:, [b, a]]
    return {**p, "classifier.w": w}


def test_classes_fold_labels_reported_as_one(tmp_path):
    classes = np.arange(37)
    classes[3:] = 3  # labels 3, 4, ... are all reported as class 3 (`_unknown_`'s 25 other words)
    app, p, X, y = _registry(tmp_path / "folded", classes=classes)
    with InProcessTransport(app):
        reg = app.state.aggregator.registry
        assert reg.check(_swapped(p, 3, 4), 0.0, metric="balanced")[0]  # one unknown word for another
        assert not reg.check(_swapped(p, 2, 3), 0.05, metric="balanced")[0]  # a command for an unknown
    app, p, X, y = _registry(tmp_path / "plain")
    with InProcessTransport(app):
        assert not app.state.aggregator.registry.check(_swapped(p, 3, 4), 0.05, metric="balanced")[0]


def test_balanced_metric_sees_a_lost_minority_label(tmp_path):
    app, p, X, y = _registry(tmp_path)
    with InProcessTransport(app):
        reg = app.state.aggregator.registry
        lost = {**p, "classifier.w": p["classifier.w"].copy()}
        lost["classifier.w"][1, 1] = -1.0  # label 1 (about 2.5 % of the set) is never named again
        ok, acc, ref = reg.check(lost, 0.05)
        assert ok and acc > ref - 0.05  # plain accuracy loses ~2.5 points: under the tolerance
        ok, bal, bref = reg.check(lost, 0.05, metric="balanced")
        assert not ok and bref - bal > 0.15  # one of five labels gone: a fifth of the balanced score


def test_against_start_stops_losses_adding_up(tmp_path):
    app, p, X, y = _registry(tmp_path)
    with InProcessTransport(app):
        agg = app.state.aggregator
        reg = agg.registry
        start = reg.current

        def worse(q, label):  # one step that loses one minority label
            q = {**q, "classifier.w": q["classifier.w"].copy()}
            q["classifier.w"][label, label] = -1.0
            return q

        v2, score = worse(p, 1), (lambda q: reg.accuracy(q, "balanced"))
        v3 = worse(v2, 2)
        step1, step2 = score(p) - score(v2), score(v2) - score(v3)
        tol = 1.5 * max(step1, step2)  # each step alone is under it, the two together are not
        assert min(step1, step2) > 0.1 and step1 + step2 > tol
        assert reg.check(v2, tol, metric="balanced")[0]
        agg.rounds.publish_params(v2, note="test")
        assert reg.start_version() == start and reg.current == start + 1
        ok, new, ref = reg.check(v3, tol, metric="balanced", against="current")
        assert ok and ref == pytest.approx(score(v2))
        ok, new, ref = reg.check(v3, tol, metric="balanced", against="start")
        assert not ok and ref == pytest.approx(score(p))


def test_groups_are_gated_each_on_their_own(tmp_path):
    """A held-out set of two groups (say the val voices and a few rows of another voice family): a
    version that loses one label's rows in the small group only passes a pooled gate, not a grouped one."""
    p = small_params()
    X, y, _ = _heldout(p)
    groups = np.zeros(len(y), np.int64)
    small = np.flatnonzero(y == 1)[: max(2, int((y == 1).sum()) // 4)]
    groups[small] = 1  # a quarter of label 1's rows are the second group
    app, p, X, y = _registry(tmp_path / "grouped", groups=groups)
    moved = {**p, "classifier.w": p["classifier.w"].copy()}
    moved["classifier.w"][:, 1] = 0.0  # label 1 no longer named, in every group
    with InProcessTransport(app):
        reg = app.state.aggregator.registry
        assert reg.groups is not None and int(reg.groups.sum()) == len(small)
        ok, acc, ref = reg.check(moved, 0.05)   # plain accuracy, grouped: group 1 is all label 1
        assert not ok and ref - acc > 0.5       # the worst group's scores are what comes back
        assert reg.check(p, 0.0)[0]             # the start itself passes
    pooled, q, _, _ = _registry(tmp_path / "pooled")
    with InProcessTransport(pooled):
        ok, acc, ref = pooled.state.aggregator.registry.check(moved, 0.05)  # ~2 % of all rows: passes
        assert ok and ref - acc < 0.05


def test_bad_groups_are_one_sentence_and_write_nothing(tmp_path):
    p = small_params()
    X, y, p = _heldout(p)
    for bad in (np.zeros(3, np.int64), np.zeros(len(y), np.float32)):
        with pytest.raises(EdgelearnError, match="held-out groups must be one integer per row"):
            make_state(tmp_path, AggregatorConfig(), n_devices=1, params=p, heldout=(X, y, None, bad))
        assert not (tmp_path / "agg").exists()


def test_bad_gate_settings_are_one_sentence():
    with pytest.raises(EdgelearnError, match="eval_metric='f1'"):
        AggregatorConfig(eval_metric="f1")
    with pytest.raises(EdgelearnError, match="eval_against='best'"):
        AggregatorConfig(eval_against="best")


def test_a_bad_classes_map_is_one_sentence_and_writes_nothing(tmp_path):
    p = small_params()
    X, y, p = _heldout(p)
    with pytest.raises(EdgelearnError, match="classes map has shape"):
        make_state(tmp_path, AggregatorConfig(), n_devices=1, params=p, heldout=(X, y, np.arange(5)))
    assert not (tmp_path / "agg").exists()


def _negatives(p, n=3000, seed=1):
    """Keyword-free speech as embeddings in stream order: label 1's direction now and then, and
    label 2's, strongly enough that the first version fires on some at 0.7."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 64)).astype(np.float32)
    for k, every in ((1, 97), (2, 131)):
        at = np.arange(0, n - 1, every)
        lift = rng.uniform(2.0, 9.0, len(at))
        X[at, k] += lift  # two windows in a row, as a word spans more than one run
        X[at + 1, k] += lift
    ends = np.stack([np.arange(n) * 0.08 + 1.0] * 2, axis=1)
    return {"X": X, "ends": ends, "keywords": [1, 2], "hours": n * 0.08 / 3600}


def test_a_version_is_published_with_thresholds_matched_to_the_first(tmp_path):
    import json

    from edge.bundle import load_bundle
    from edge.detect import count_events
    from edge.device import Device, version_thresholds
    from edge.kws import DEFAULT_BUNDLE

    p = small_params()
    X, y, p = _heldout(p)
    neg = _negatives(p)
    state, _ = make_state(tmp_path, AggregatorConfig(clients_per_round=1), n_devices=1, params=p,
                          heldout=(X, y), negatives=neg)
    app = build_app(state, tick_interval=0)
    with InProcessTransport(app):
        agg = app.state.aggregator
        reg, start = agg.registry, agg.registry.current
        eager = {**p, "classifier.b": p["classifier.b"].copy()}
        eager["classifier.b"][1] += 2.5  # names label 1 far more readily
        v = agg.rounds.publish_params(eager, note="test")
        labels = reg._labels()
    first = json.loads((state / "bundles" / f"v{start}" / "manifest.json").read_text())
    base = json.loads((DEFAULT_BUNDLE / "manifest.json").read_text())  # make_state's base bundle
    own = (base["extra"].get("operating") or {}).get("thresholds", {})
    assert set(own).isdisjoint({labels[1], labels[2], labels[3]})  # (these words are the base's 0.7)
    # the first version keeps the base bundle's own operating point (the shipped one's since version 2)
    assert first["extra"].get("operating") == base["extra"].get("operating")
    op = json.loads((state / "bundles" / f"v{v}" / "manifest.json").read_text())["extra"]["operating"]
    assert op["matched_to_version"] == start and set(op["thresholds"]) == {labels[1], labels[2]} | set(own)
    assert {w: op["thresholds"][w] for w in own} == own  # words without negatives keep the base's

    def probs(q):
        z = head_logits(q, neg["X"])
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)

    ref, new = probs(p), probs(eager)
    for k in (1, 2):
        thr = op["thresholds"][labels[k]]
        assert count_events(new[:, k], thr, neg["ends"]) <= count_events(ref[:, k], 0.7, neg["ends"])
        assert op["reference_events"][labels[k]] == count_events(ref[:, k], 0.7, neg["ends"])
    assert op["thresholds"][labels[1]] > 0.7  # the eager label pays with a higher threshold
    assert count_events(ref[:, 1], 0.7, neg["ends"]) > 0  # (the test means something)

    # a device on that version detects at those thresholds unless told otherwise
    bundle = load_bundle(state / "bundles" / f"v{v}", trusted_keys=[state / "keys" / "aggregator.pub"])
    assert version_thresholds(bundle) == op["thresholds"]
    dev = Device(tmp_path / "st", bundle=bundle)
    det, _ = dev.detector(keywords=[labels[1], labels[2], labels[3]], replay=False)
    assert list(det.thresholds) == [op["thresholds"][labels[1]], op["thresholds"][labels[2]], 0.7]
    det, _ = dev.detector(keywords=[labels[1]], threshold=0.5, replay=False)
    assert list(det.thresholds) == [0.5]
    st = dev.status()["operating_point"]
    assert st == {"thresholds": op["thresholds"], "matched_to_version": start, "in_use": True}
