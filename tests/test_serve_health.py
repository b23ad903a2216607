"""Deep-check validation, bundle-to-model loading, and the shipped bundle served for real."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edge.errors import BundleError, EdgelearnError
from host.keys import generate_keypair
from host.serve.loader import check_bundle_path, load_bundle_models
from host.serve.health import check_output, known_input, to_probabilities
from host.serve.protocol import ModelSpec, TensorSpec
from bench._toymodels import make_toy_bundle

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "models" / "kws-dscnn-s"


def test_check_output_catches_nan_uniform_and_drift():
    logits = np.array([[2.0, 0.1, -1.0, 0.3]], np.float32)
    assert check_output({"logits": logits}, "logits", None) == ""
    bad = logits.copy()
    bad[0, 1] = np.nan
    assert "output logits has NaN/Inf" in check_output({"logits": bad}, "logits", None)
    flat = np.zeros((2, 4), np.float32)
    assert "is uniform" in check_output({"logits": flat}, "logits", None)
    assert "differs from this version's reference" in check_output({"logits": logits + 0.1}, "logits",
                                                                     {"logits": logits})
    assert check_output({"logits": logits + 1e-5}, "logits", {"logits": logits}) == ""


def test_quantized_softmax_is_read_as_probabilities():
    p = np.round(np.array([[0.7, 0.2, 0.05, 0.05]]) * 256) / 256 + 0.004  # int8 rounding: sum != 1
    q = to_probabilities(p)
    np.testing.assert_allclose(q.sum(), 1.0)
    assert q[0, 0] == pytest.approx(p[0, 0] / p.sum())  # not a softmax of a softmax
    assert check_output({"probs": p.astype(np.float32)}, "probs", None) == ""
    e = -(to_probabilities(np.zeros((1, 37))) * np.log(1 / 37)).sum()
    assert e == pytest.approx(math.log(37))


def test_known_input_is_fixed_and_follows_the_spec():
    spec = ModelSpec("m", "1", [TensorSpec("features", "FP32", [-1, 49, 10, 1]), TensorSpec("n", "INT64", [-1])], [])
    a, b = known_input(spec), known_input(spec)
    assert a["features"].shape == (2, 49, 10, 1) and a["features"].dtype == np.float32
    assert a["n"].dtype == np.int64
    np.testing.assert_array_equal(a["features"], b["features"])


def test_loader_serves_full_head_and_cloud_half(tmp_path):
    priv, pub = generate_keypair(tmp_path / "keys")
    b = make_toy_bundle(tmp_path / "b", priv, version=5)
    served = load_bundle_models(b, pub, work_dir=tmp_path / "work")
    kinds = {m.name: (m.kind, m.version, m.score_output) for m in served.models}
    assert kinds == {"kws-toy": ("full", "5", "logits"), "kws-toy.head": ("head", "5", "logits"),
                     "kws-toy.cloud": ("split", "5", "logits")}
    head = next(m for m in served.models if m.kind == "head")
    full = ort.InferenceSession(str(b / "model.onnx"))
    x = np.random.default_rng(1).standard_normal((3, 49, 10, 1)).astype(np.float32)
    emb, logits = full.run(["embedding", "logits"], {"features": x})
    np.testing.assert_allclose(ort.InferenceSession(head.path).run(None, {"embedding": emb})[0], logits,
                               rtol=1e-5, atol=1e-5)
    broken = make_toy_bundle(tmp_path / "broken", priv, version=6, broken=True, cloud_half=False)
    names = [m.name for m in load_bundle_models(broken, pub, work_dir=tmp_path / "work").models]
    assert names == ["kws-toy"]  # the poisoned logits depend on the features, so there is no separable head


def test_loader_refuses_bad_bundles(tmp_path):
    priv, pub = generate_keypair(tmp_path / "keys")
    b = make_toy_bundle(tmp_path / "b", priv, version=1)
    with pytest.raises(BundleError, match="no trusted public keys"):
        load_bundle_models(b, None, work_dir=tmp_path)
    bad = shutil.copytree(b, tmp_path / "bad")
    (bad / "cloud.onnx").write_bytes(b"x")
    with pytest.raises(BundleError, match="cloud.onnx"):
        load_bundle_models(bad, pub, work_dir=tmp_path)


def test_rollout_paths_stay_inside_the_rollout_dir(tmp_path):
    (tmp_path / "r" / "v2").mkdir(parents=True)
    assert check_bundle_path("v2", tmp_path / "r") == (tmp_path / "r" / "v2").resolve()
    for p in ("../x", str(tmp_path / "elsewhere"), "v2/../../x"):
        with pytest.raises(EdgelearnError, match="outside the rollout directory"):
            check_bundle_path(p, tmp_path / "r")
    with pytest.raises(EdgelearnError, match="disabled"):
        check_bundle_path("v2", None)


@pytest.mark.skipif(not (SHIPPED / "manifest.json").exists(), reason="models/kws-dscnn-s is not built")
def test_shipped_bundle_is_served_and_matches_onnxruntime(tmp_path):
    httpclient = pytest.importorskip("tritonclient.http")
    from edge.kws import default_trusted_keys
    from host.serve.app import Server
    from host.serve.background import BackgroundServer
    from host.serve.config import ServeConfig

    served = load_bundle_models(SHIPPED, default_trusted_keys(), work_dir=tmp_path)
    full = next(m for m in served.models if m.kind == "full")
    x = np.random.default_rng(2).standard_normal((2, 49, 10, 1)).astype(np.float32)
    sess = ort.InferenceSession(full.path)
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {full.spec.inputs[0].name: x})))
    srv = Server(ServeConfig(replicas=1), trusted_keys=default_trusted_keys())
    with BackgroundServer(srv, bundle=SHIPPED) as url:
        c = httpclient.InferenceServerClient(url[len("http://"):])
        inp = httpclient.InferInput(full.spec.inputs[0].name, list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        res = c.infer(full.name, [inp])
        for name, ref in want.items():
            np.testing.assert_allclose(res.as_numpy(name), ref, rtol=1e-5, atol=1e-5)
