"""The shim on a live loopback port, driven by the official Triton HTTP client (tritonclient)."""

from __future__ import annotations

import subprocess
import sys

import httpx
import numpy as np
import onnxruntime as ort
import pytest

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

from host.keys import generate_keypair  # noqa: E402
from host.serve.app import Server  # noqa: E402
from host.serve.background import BackgroundServer  # noqa: E402
from host.serve.config import ServeConfig  # noqa: E402
from bench._toymodels import LABELS, make_toy_bundle  # noqa: E402

MODEL = "kws-toy"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    priv, pub = generate_keypair(tmp / "keys")
    bundle = make_toy_bundle(tmp / "b1", priv, version=1)
    cfg = ServeConfig(replicas=2, max_batch_size=8, max_body_bytes=64 << 10,
                      tenant_overrides={"tight": (0.5, 2)})
    with BackgroundServer(Server(cfg, trusted_keys=pub), bundle=bundle) as url:
        yield type("Live", (), {"url": url, "bundle": bundle, "pub": pub,
                                "client": httpclient.InferenceServerClient(url[len("http://"):])})


def reference(bundle, name, feeds):
    sess = ort.InferenceSession(str(bundle / name), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def features(n=2, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 49, 10, 1)).astype(np.float32)


def test_metadata_and_health(live):
    c = live.client
    assert c.is_server_live() and c.is_server_ready()
    assert c.is_model_ready(MODEL) and c.is_model_ready(MODEL, "1")
    assert not c.is_model_ready("nope")
    meta = c.get_server_metadata()
    assert meta["name"] == "edgelearn" and "binary_tensor_data" in meta["extensions"]
    m = c.get_model_metadata(MODEL)
    assert m["versions"] == ["1"]
    assert m["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 49, 10, 1]}]
    assert [o["name"] for o in m["outputs"]] == ["embedding", "logits"]
    assert c.get_model_metadata(MODEL, "1") == m
    assert {x["name"] for x in [c.get_model_metadata(f"{MODEL}.head"), c.get_model_metadata(f"{MODEL}.cloud")]} \
        == {f"{MODEL}.head", f"{MODEL}.cloud"}


@pytest.mark.parametrize("binary", [False, True])
def test_infer_matches_onnxruntime(live, binary):
    x = features(3, seed=int(binary))
    inp = httpclient.InferInput("features", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    outs = [httpclient.InferRequestedOutput("logits", binary_data=binary),
            httpclient.InferRequestedOutput("embedding", binary_data=not binary)]
    res = live.client.infer(MODEL, [inp], outputs=outs, request_id="req-7")
    want = reference(live.bundle, "model.onnx", {"features": x})
    np.testing.assert_allclose(res.as_numpy("logits"), want["logits"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res.as_numpy("embedding"), want["embedding"], rtol=1e-5, atol=1e-5)
    r = res.get_response()
    assert r["id"] == "req-7" and r["model_version"] == "1"
    res2 = live.client.infer(MODEL, [inp], model_version="1")  # all outputs, versioned route
    np.testing.assert_allclose(res2.as_numpy("logits"), want["logits"], rtol=1e-5, atol=1e-5)


def _client_error(live, match, model=MODEL, version="", name="features", shape=(1, 49, 10, 1), dtype="FP32"):
    inp = httpclient.InferInput(name, list(shape), dtype)
    inp.set_data_from_numpy(np.zeros(shape, {"FP32": np.float32, "FP64": np.float64}[dtype]))
    with pytest.raises(InferenceServerException, match=match) as e:
        live.client.infer(model, [inp], model_version=version)
    return e.value


def test_protocol_errors_reach_the_client(live):
    _client_error(live, r"unexpected input 'feats' for model 'kws-toy'; expected: features", name="feats")
    _client_error(live, r"has shape \[1, 49, 10\], model expects \[-1, 49, 10, 1\]", shape=(1, 49, 10))
    _client_error(live, r"datatype 'FP64', model 'kws-toy' expects FP32", dtype="FP64")
    _client_error(live, r"batch size 9 is outside 1..8", shape=(9, 49, 10, 1))
    e = _client_error(live, r"unknown model 'nope'; served: kws-toy", model="nope")
    assert e.status() == "404"
    e = _client_error(live, r"model 'kws-toy' has no version '7'; loaded: 1", version="7")
    assert e.status() == "404"
    assert live.client.is_server_ready()  # and the server keeps serving
    test_infer_matches_onnxruntime(live, True)


def test_malformed_and_oversized_bodies(live):
    url = f"{live.url}/v2/models/{MODEL}/infer"
    r = httpx.post(url, content=b'{"inputs": [')
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
    r = httpx.post(url, content=b'{"inputs": []}', headers={"Inference-Header-Content-Length": "x"})
    assert r.status_code == 400 and "must be an integer" in r.json()["error"]
    r = httpx.post(url, content=b"0" * (65 << 10))
    assert r.status_code == 413 and "the limit is 65536" in r.json()["error"]

    def chunks():  # no Content-Length: the limit must hold while streaming too
        for _ in range(70):
            yield b"1" * 1024
    r = httpx.post(url, content=chunks())
    assert r.status_code == 413 and "exceeds the limit of 65536 bytes" in r.json()["error"]
    assert httpx.get(f"{live.url}/v2/models/nope/ready").status_code == 404
    assert httpx.get(f"{live.url}/v2/health/ready").json() == {"ready": True}


def _oip(name, arr, binary=False):
    return {"inputs": [{"name": name, "shape": list(arr.shape), "datatype": "FP32", "data": arr.ravel().tolist()}]}


def test_cascade_from_features_and_from_embedding(live):
    x = features(4, seed=3)
    want = reference(live.bundle, "model.onnx", {"features": x})
    r = httpx.post(f"{live.url}/v2/cascade/{MODEL}", json=_oip("features", x))
    assert r.status_code == 200, r.text
    out = {o["name"]: o for o in r.json()["outputs"]}
    assert out["label"]["data"] == [LABELS[i] for i in want["logits"].argmax(1)]
    p = np.array(out["probabilities"]["data"]).reshape(4, len(LABELS))
    e = np.exp(want["logits"] - want["logits"].max(1, keepdims=True))
    np.testing.assert_allclose(p, e / e.sum(1, keepdims=True), rtol=1e-4, atol=1e-6)
    r2 = httpx.post(f"{live.url}/v2/cascade/{MODEL}", json=_oip("embedding", want["embedding"]))
    assert r2.status_code == 200, r2.text
    out2 = {o["name"]: o for o in r2.json()["outputs"]}
    assert out2["label"]["data"] == out["label"]["data"]
    np.testing.assert_allclose(out2["probabilities"]["data"], out["probabilities"]["data"], rtol=1e-4, atol=1e-6)
    r3 = httpx.post(f"{live.url}/v2/cascade/{MODEL}", json=_oip("mfcc", x))
    assert r3.status_code == 400 and "cascade input(s) ['mfcc'] not recognised" in r3.json()["error"]


def test_split_runs_the_cloud_half(live):
    act = np.random.default_rng(5).standard_normal((2, 8, 8)).astype(np.float32)
    want = reference(live.bundle, "cloud.onnx", {"activation": act})
    r = httpx.post(f"{live.url}/v2/split/{MODEL}", json=_oip("activation", act))
    assert r.status_code == 200, r.text
    out = {o["name"]: o for o in r.json()["outputs"]}
    np.testing.assert_allclose(np.array(out["logits"]["data"]).reshape(2, -1), want["logits"], rtol=1e-5, atol=1e-5)
    assert out["label"]["data"] == [LABELS[i] for i in want["logits"].argmax(1)]
    body = {**_oip("activation", act), "parameters": {"partition": "edge"}}
    r = httpx.post(f"{live.url}/v2/split/{MODEL}", json=body)
    assert r.status_code == 400 and "partition 'edge' is not a cloud partition" in r.json()["error"]
    r = httpx.post(f"{live.url}/v2/split/{MODEL}", json=_oip("features", features(1)))
    assert r.status_code == 400 and "unexpected input 'features'" in r.json()["error"]


def test_tenant_quota_answers_429_with_retry_after(live):
    url = f"{live.url}/v2/models/{MODEL}/infer"
    body = _oip("features", features(1))
    codes = [httpx.post(url, json=body, headers={"X-Tenant": "tight"}) for _ in range(4)]
    assert [c.status_code for c in codes[:2]] == [200, 200]
    assert codes[2].status_code == 429 and int(codes[2].headers["retry-after"]) >= 1
    assert "tenant 'tight' is over its quota of 0.5 requests/s" in codes[2].json()["error"]
    assert httpx.post(url, json=body, headers={"X-Tenant": "roomy"}).status_code == 200


def test_metrics(live):
    text = httpx.get(f"{live.url}/metrics").text
    for series in ['edgelearn_serve_requests_total{model="kws-toy",status="200"',
                   "edgelearn_serve_request_seconds_bucket", "edgelearn_serve_batch_size_bucket",
                   'edgelearn_serve_queue_depth{model="kws-toy",version="1"} 0.0',
                   'edgelearn_serve_breaker_state{model="kws-toy",replica="0",state="closed",version="1"} 1.0',
                   'edgelearn_serve_replica_healthy{model="kws-toy",replica="1",version="1"} 1.0',
                   'edgelearn_serve_canary_weight{model="kws-toy",version="1"} 1.0']:
        assert series in text, series
    httpx.post(f"{live.url}/v2/models/{MODEL}/infer", json=_oip("features", features(1)),
               headers={"X-Tenant": "tight"})
    assert 'reason="quota",tenant="tight"' in httpx.get(f"{live.url}/metrics").text


def test_cli_refuses_a_tampered_bundle(live, tmp_path):
    import shutil
    bad = shutil.copytree(live.bundle, tmp_path / "bad")
    (bad / "model.onnx").write_bytes(b"not a model")
    res = subprocess.run([sys.executable, "-m", "edge.cli", "serve", "--bundle", str(bad), "--pubkey",
                          str(live.pub), "--port", "0"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "edgelearn serve: " in res.stderr and "model.onnx" in res.stderr
