"""OIP v2 request parsing and response encoding, JSON and binary, with every refusal."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from host.serve.protocol import (InferRequest, ModelSpec, ProtocolError, TensorSpec, encode_infer_response,
                                 parse_infer_request)

SPEC = ModelSpec("kws", "3", [TensorSpec("features", "FP32", [-1, 49, 10, 1])],
                 [TensorSpec("embedding", "FP32", [-1, 64]), TensorSpec("logits", "FP32", [-1, 4])])


def _json_body(x, **extra):
    item = {"name": "features", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
    item.update(extra.pop("item", {}))
    return json.dumps({"inputs": [item], **extra}).encode()


def _binary_body(x, outputs=None, name="features", size=None):
    raw = x.astype("<f4").tobytes()
    head = {"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32",
                        "parameters": {"binary_data_size": len(raw) if size is None else size}}]}
    if outputs:
        head["outputs"] = outputs
    h = json.dumps(head).encode()
    return h + raw, str(len(h))


def refused(status, match, body, header=None, spec=SPEC, max_batch=8):
    with pytest.raises(ProtocolError, match=match) as e:
        parse_infer_request(body, header, spec, max_batch)
    assert e.value.status == status


def test_json_and_binary_inputs_decode_identically():
    x = np.random.default_rng(0).standard_normal((2, 49, 10, 1)).astype(np.float32)
    a = parse_infer_request(_json_body(x, id="r1"), None, SPEC, 8)
    body, hl = _binary_body(x)
    b = parse_infer_request(body, hl, SPEC, 8)
    assert a.id == "r1" and a.batch == b.batch == 2
    np.testing.assert_array_equal(a.inputs["features"], x)
    np.testing.assert_array_equal(b.inputs["features"], x)
    assert b.inputs["features"].dtype == np.float32


def test_nested_json_data_is_accepted():
    x = np.ones((1, 49, 10, 1), np.float32)
    body = json.dumps({"inputs": [{"name": "features", "shape": [1, 49, 10, 1], "datatype": "FP32",
                                   "data": x.tolist()}]}).encode()
    assert parse_infer_request(body, None, SPEC, 8).inputs["features"].shape == (1, 49, 10, 1)


def test_wrong_name_shape_datatype_and_count():
    x = np.zeros((1, 49, 10, 1), np.float32)
    refused(400, r"unexpected input 'feats' for model 'kws'; expected: features",
            _json_body(x, item={"name": "feats"}))
    refused(400, r"input 'features' has shape \[1, 49, 10\], model expects \[-1, 49, 10, 1\]",
            _json_body(x, item={"shape": [1, 49, 10], "data": [0.0] * 490}))
    refused(400, r"input 'features' has datatype 'FP64', model 'kws' expects FP32",
            _json_body(x, item={"datatype": "FP64"}))
    refused(400, r"has 489 values, shape \[1, 49, 10, 1\] needs 490", _json_body(x, item={"data": [0.0] * 489}))
    refused(400, r"'data' is not a list of FP32 values", _json_body(x, item={"data": ["a"] * 490}))
    refused(400, r"shape must be a list of non-negative integers", _json_body(x, item={"shape": [1, 49, "10", 1]}))
    refused(400, r"must have a non-empty 'inputs' list", json.dumps({"inputs": []}).encode())
    two = ModelSpec("two", "1", SPEC.inputs + [TensorSpec("gain", "FP32", [-1])], SPEC.outputs)
    refused(400, r"missing input\(s\) gain for model 'two'", _json_body(x), spec=two)


def test_malformed_json_and_binary_headers():
    refused(400, r"not valid JSON", b"{\"inputs\": [")
    refused(400, r"must be a JSON object", b"[1, 2]")
    x = np.zeros((1, 49, 10, 1), np.float32)
    body, hl = _binary_body(x)
    refused(400, r"Inference-Header-Content-Length must be an integer", body, "ten")
    refused(400, r"Inference-Header-Content-Length is 99999 but the body has", body, "99999")
    refused(400, r"binary_data_size 1960 runs past the end", body[:-4], hl)
    refused(400, r"binary_data_size is 1956 bytes, shape \[1, 49, 10, 1\] of FP32 needs 1960",
            *_binary_body(x, size=1956)[:1], hl)
    refused(400, r"4 bytes of binary data after the header are not claimed", body + b"abcd", hl)


def test_batch_limits_and_duplicate_inputs():
    x = np.zeros((9, 49, 10, 1), np.float32)
    refused(400, r"batch size 9 is outside 1..8; split the request", _json_body(x))
    one = {"name": "features", "shape": [1, 49, 10, 1], "datatype": "FP32", "data": [0.0] * 490}
    refused(400, r"input 'features' is given twice", json.dumps({"inputs": [one, one]}).encode())


def test_unknown_requested_output():
    x = np.zeros((1, 49, 10, 1), np.float32)
    refused(400, r"unknown output 'probs' for model 'kws'; available: embedding, logits",
            _json_body(x, outputs=[{"name": "probs"}]))


def test_requested_outputs_and_binary_flags():
    x = np.zeros((1, 49, 10, 1), np.float32)
    body, hl = _binary_body(x, outputs=[{"name": "logits", "parameters": {"binary_data": True}},
                                        {"name": "embedding"}])
    req = parse_infer_request(body, hl, SPEC, 8)
    assert req.outputs == {"logits": True, "embedding": False}
    req2 = parse_infer_request(_json_body(x, parameters={"binary_data_output": True}), None, SPEC, 8)
    assert req2.binary_default and req2.outputs == {}


def test_response_json_and_binary_round_trip():
    logits = np.arange(8, dtype=np.float32).reshape(2, 4)
    emb = np.full((2, 64), 0.5, np.float32)
    req = InferRequest("abc", {}, 2, {"logits": True, "embedding": False})
    body, headers = encode_infer_response("kws", "3", req, {"logits": logits, "embedding": emb})
    n = int(headers["inference-header-content-length"])
    head = json.loads(body[:n])
    assert head["id"] == "abc" and head["model_version"] == "3"
    assert [o["name"] for o in head["outputs"]] == ["logits", "embedding"]
    assert head["outputs"][0]["parameters"]["binary_data_size"] == 32
    np.testing.assert_array_equal(np.frombuffer(body[n:], "<f4").reshape(2, 4), logits)
    assert head["outputs"][1]["data"] == [0.5] * 128
    body, headers = encode_infer_response("kws", "3", InferRequest(None, {}, 2), {"logits": logits})
    assert headers["content-type"] == "application/json"
    assert json.loads(body)["outputs"][0]["data"] == list(range(8))


def test_bytes_tensors_both_ways():
    spec = ModelSpec("t", "1", [TensorSpec("s", "BYTES", [-1])], [TensorSpec("s", "BYTES", [-1])])
    raw = b"".join(struct.pack("<I", len(w)) + w for w in (b"yes", b"no"))
    h = json.dumps({"inputs": [{"name": "s", "shape": [2], "datatype": "BYTES",
                                "parameters": {"binary_data_size": len(raw)}}]}).encode()
    req = parse_infer_request(h + raw, str(len(h)), spec, 8)
    assert list(req.inputs["s"]) == [b"yes", b"no"]
    h2 = h.replace(b'"binary_data_size": 13', b'"binary_data_size": 10')
    refused(400, r"BYTES binary data is truncated", h2 + raw[:-3], str(len(h2)), spec=spec)
    req.outputs = {"s": True}
    body, headers = encode_infer_response("t", "1", req, {"s": req.inputs["s"]})
    assert body.endswith(raw)
    body, _ = encode_infer_response("t", "1", InferRequest(None, {}, 2), {"s": req.inputs["s"]})
    assert json.loads(body)["outputs"][0]["data"] == ["yes", "no"]
