"""The adapted-context model (edge.adapt.TailModel): int8 through dw4 when the delta keeps dw4, the
float depthwise layer otherwise, and old bundles without the tail prefix."""

from __future__ import annotations

import numpy as np
import pytest

from edge import features as F
from edge.adapt import TailModel
from edge.adapt.conv import prefix_partition
from edge.bundle import load_bundle
from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys


@pytest.fixture(scope="module")
def bundle():
    return load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys())


@pytest.fixture(scope="module")
def feats(bundle):
    from host.data import synth

    words = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go", "seven", "marvin"]
    clips = synth.render(synth.Voice("espeak", "en-us"), [(w, 1.0, 1.0) for w in words])
    rng = np.random.default_rng(0)
    noise = (rng.standard_normal((4, 16000)) * 300).astype(np.float32)  # and four windows of noise
    wins = np.concatenate([np.stack([F.fit_to_window(c) for c in clips]).astype(np.float32), noise])
    return F.normalize(F.mfcc(wins), KeywordModel(bundle).scale).astype(np.float32)


def _cos(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_the_shipped_bundle_runs_dw4_in_int8_close_to_the_float_layer(bundle, feats):
    assert prefix_partition(bundle)["cut"] == "dw4_relu"
    tm = TailModel(bundle, {})
    assert tm.prefix is not None
    emb, probs = tm.infer(feats)
    ref_emb, ref_probs = tm.tail.infer(tm.backbone(feats))   # the float depthwise layer
    # dw4's output rounded to int8 (0.08 a step) instead of float: the same model within that rounding
    assert _cos(emb, ref_emb).min() > 0.999
    assert np.abs(probs - ref_probs).max() < 0.05
    assert (probs.argmax(1) == ref_probs.argmax(1)).mean() >= 0.9
    enc_emb, _ = KeywordModel(bundle).infer(feats)         # and the int8 encoder, which rounds there too
    assert _cos(emb, enc_emb).min() > 0.995


def test_an_adapted_delta_that_keeps_dw4_changes_the_output_through_the_prefix(bundle, feats):
    base = TailModel(bundle, {})
    t = base.tail
    delta = {"pw4_b": t.p("pw4_b") + 0.3, "cls_b": t.p("cls_b") + np.linspace(-1, 1, t.n_classes, dtype=np.float32)}
    tm = TailModel(bundle, delta)
    assert tm.prefix is not None
    emb, probs = tm.infer(feats)
    ref_emb, ref_probs = tm.tail.infer(tm.backbone(feats))
    assert _cos(emb, ref_emb).min() > 0.999 and np.abs(probs - ref_probs).max() < 0.05
    assert np.abs(probs - base.infer(feats)[1]).max() > 0.05   # the delta is applied, not the base


@pytest.mark.parametrize("name", ["dw4_b", "dw4_w"])
def test_a_delta_that_trains_dw4_runs_the_float_layer_exactly(bundle, feats, name):
    t = TailModel(bundle, {}).tail
    tm = TailModel(bundle, {name: t.p(name) * np.float32(1.1)})
    assert tm.prefix is None
    emb, probs = tm.infer(feats)
    ref_emb, ref_probs = tm.tail.infer(tm.backbone(feats))
    np.testing.assert_array_equal(emb, ref_emb)
    np.testing.assert_array_equal(probs, ref_probs)


def test_a_bundle_without_the_tail_prefix_runs_the_float_layer(bundle, feats, bundle_without):
    old = bundle_without(bundle, "tail-prefix")
    assert prefix_partition(old) is None
    tm = TailModel(old, {})
    assert tm.prefix is None
    emb, probs = tm.infer(feats)
    np.testing.assert_array_equal(probs, tm.tail.infer(tm.backbone(feats))[1])
    np.testing.assert_allclose(emb, TailModel(bundle, {}).infer(feats)[0], atol=0.05 * np.abs(emb).max())
