"""Each federated version's tail as ONNX equals what the device computes (LoRA merged, adapter kept)."""

import numpy as np
import pytest

from edge.fl import head_logits
from host.aggregator.head_onnx import write_head_onnx

ort = pytest.importorskip("onnxruntime")


def params(seed, adapter=False, lora=False):
    rng = np.random.default_rng(seed)
    p = {"proj.w": rng.standard_normal((64, 64)).astype(np.float32) * 0.2,
         "proj.b": rng.standard_normal(64).astype(np.float32) * 0.1,
         "classifier.w": rng.standard_normal((64, 37)).astype(np.float32) * 0.2,
         "classifier.b": rng.standard_normal(37).astype(np.float32) * 0.1}
    if adapter:
        p["adapter.a"] = rng.standard_normal((64, 8)).astype(np.float32) * 0.2
        p["adapter.b"] = rng.standard_normal((8, 64)).astype(np.float32) * 0.2
    if lora:
        for layer, out in (("proj", 64), ("classifier", 37)):
            p[f"{layer}.lora_a"] = rng.standard_normal((64, 4)).astype(np.float32) * 0.2
            p[f"{layer}.lora_b"] = rng.standard_normal((4, out)).astype(np.float32) * 0.2
    return p


@pytest.mark.parametrize("adapter,lora", [(False, False), (True, False), (False, True), (True, True)])
def test_onnx_head_equals_device_tail(tmp_path, adapter, lora):
    p = params(1, adapter, lora)
    part = write_head_onnx(p, tmp_path / "head.onnx")
    assert part["placement"] == "cloud" and part["inputs"][0]["name"] == "embedding"
    x = np.random.default_rng(2).standard_normal((9, 64)).astype(np.float32)
    sess = ort.InferenceSession(str(tmp_path / "head.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(["logits"], {"embedding": x})[0]
    np.testing.assert_allclose(got, head_logits(p, x), rtol=1e-4, atol=1e-4)


def test_published_version_carries_the_onnx_head(tmp_path):
    from edge.bundle import load_bundle
    from host.aggregator.config import AggregatorConfig
    from host.aggregator.inprocess import make_state

    state, _ = make_state(tmp_path, AggregatorConfig(clients_per_round=3), n_devices=2)
    [vdir] = [d for d in (state / "bundles").iterdir() if d.is_dir()]
    b = load_bundle(vdir, trusted_keys=state / "keys")
    part = b.partition("fl-head")
    assert part["placement"] == "cloud" and b.path(part["file"]).exists()


def test_serving_shim_answers_from_a_published_version(tmp_path):
    """What the demo does last: the shim loads the aggregator's newest signed version and serves its head."""
    httpx = pytest.importorskip("httpx")
    from edge.bundle import load_bundle
    from host.aggregator.config import AggregatorConfig
    from host.aggregator.inprocess import make_state, small_params
    from host.serve.app import Server
    from host.serve.background import BackgroundServer
    from host.serve.config import ServeConfig

    p = small_params(3)
    state, _ = make_state(tmp_path, AggregatorConfig(clients_per_round=3), n_devices=2, params=p)
    [vdir] = [d for d in (state / "bundles").iterdir() if d.is_dir()]
    b = load_bundle(vdir, trusted_keys=state / "keys")
    x = np.random.default_rng(4).standard_normal((3, 64)).astype(np.float32)
    body = {"inputs": [{"name": "embedding", "shape": [3, 64], "datatype": "FP32", "data": x.ravel().tolist()}],
            "parameters": {"partition": "fl-head"}}
    with BackgroundServer(Server(ServeConfig(replicas=1), trusted_keys=[str(state / "keys")]),
                          bundle=str(vdir)) as url:
        r = httpx.post(f"{url}/v2/split/{b.model_id}", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = {o["name"]: o["data"] for o in r.json()["outputs"]}
    assert out["label"] == [b.labels[i] for i in head_logits(p, x).argmax(1)]
