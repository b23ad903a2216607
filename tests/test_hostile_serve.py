"""Non-finite and out-of-range inputs to the serving shim (issue 19, item 8): NaN, ±Inf and numbers that
overflow the input's datatype (1e39 for FP32) are one 400 for every OIP datatype, in JSON and in the
binary extension, on every endpoint, and counted in /metrics; finite in-range values still decode."""

from __future__ import annotations

import json
import math

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from host.serve.protocol import DTYPES, ModelSpec, ProtocolError, TensorSpec, parse_infer_request

HYP = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
FLOATS = ("FP16", "FP32", "FP64")
INTS = tuple(d for d in DTYPES if d[0] in "IU")
NUMERIC = FLOATS + INTS
RAW = "@@raw@@"


def spec(dt: str) -> ModelSpec:
    return ModelSpec("m", "1", [TensorSpec("x", dt, [-1, 4])], [TensorSpec("y", "FP32", [-1, 4])])


def json_body(dt: str, values: list, raw: str | None = None) -> bytes:
    doc = {"inputs": [{"name": "x", "datatype": dt, "shape": [len(values) // 4, 4], "data": values}]}
    b = json.dumps(doc)
    return (b.replace(json.dumps(RAW), raw) if raw is not None else b).encode()


def binary_body(dt: str, arr: np.ndarray) -> tuple[bytes, str]:
    blob = np.ascontiguousarray(arr).astype(DTYPES[dt].newbyteorder("<")).tobytes()
    head = json.dumps({"inputs": [{"name": "x", "datatype": dt, "shape": list(arr.shape),
                                   "parameters": {"binary_data_size": len(blob)}}]}).encode()
    return head + blob, str(len(head))


def refused(body, header, dt, reason):
    with pytest.raises(ProtocolError) as e:
        parse_infer_request(body, header, spec(dt), 8)
    assert e.value.status == 400, e.value.message
    assert e.value.reason == reason, (e.value.reason, e.value.message)
    assert "'x'" in e.value.message or "JSON" in e.value.message, e.value.message
    return e.value.message


rows = st.integers(1, 3)
bad_float = st.sampled_from([math.nan, math.inf, -math.inf])


# --- protocol level: every datatype ------------------------------------------------------------------
@HYP
@given(dt=st.sampled_from(FLOATS), n=rows, bad=bad_float, where=st.data(), payload=st.integers(1, 2**22 - 1))
def test_binary_nan_and_inf_are_refused_for_every_float_type(dt, n, bad, where, payload):
    arr = np.zeros((n, 4), DTYPES[dt])
    i = where.draw(st.integers(0, arr.size - 1))
    if math.isnan(bad) and dt == "FP32":  # any NaN bit pattern, not only the canonical one
        arr.view(np.uint32).flat[i] = 0x7F800000 | payload
    else:
        arr.flat[i] = bad
    msg = refused(*binary_body(dt, arr), dt, "non_finite")
    assert f"element {i}" in msg


overflow = {"FP16": st.floats(65520, 1e308), "FP32": st.floats(3.5e38, 1e308)}


@HYP
@given(dt=st.sampled_from(FLOATS), n=rows, sign=st.sampled_from([1, -1]), where=st.data())
@example(dt="FP32", n=1, sign=1, where=None)
def test_json_numbers_that_overflow_the_float_type_are_refused(dt, n, sign, where):
    i = where.draw(st.integers(0, 4 * n - 1)) if where is not None else 0
    values = [0.5] * (4 * n)
    if dt == "FP64":  # a double overflows only in the JSON text itself
        values[i] = RAW
        raw = where.draw(st.sampled_from(["1e400", "-1e400", "1e99999"])) if where is not None else "1e400"
        refused(json_body(dt, values, raw), None, dt, "non_finite")
        return
    v = where.draw(overflow[dt]) if where is not None else 1e39
    values[i] = sign * v
    msg = refused(json_body(dt, values), None, dt, "non_finite")
    assert f"element {i}" in msg


@HYP
@given(dt=st.sampled_from(NUMERIC), token=st.sampled_from(["NaN", "Infinity", "-Infinity"]))
def test_nan_and_infinity_literals_are_refused_as_non_finite(dt, token):
    values = [1] * 4
    values[2] = RAW
    refused(json_body(dt, values, token), None, dt, "non_finite")


def _outside(dt):
    info = np.iinfo(DTYPES[dt])
    return (st.integers(int(info.max) + 1, int(info.max) + 2**70) | st.integers(int(info.min) - 2**70, int(info.min) - 1)
            | st.floats(float(info.max) * 2 + 2, 1e300) | st.sampled_from([0.5, -1.5, 1e-300, 3.25]))


@HYP
@given(dt=st.sampled_from(INTS), where=st.data())
@example(dt="INT64", where=None)  # found by this test: -2^63 - 1 parses to the double -2^63, in range
def test_json_values_outside_an_integer_type_are_refused(dt, where):
    if where is None:
        refused(json_body(dt, [1] * 7 + [-(2**63) - 1]), None, dt, "out_of_range")
        return
    v = where.draw(_outside(dt))
    i = where.draw(st.integers(0, 7))
    values = [1] * 8
    values[i] = v
    msg = refused(json_body(dt, values), None, dt, "out_of_range")
    assert dt in msg


@HYP
@given(n=rows, where=st.data())
def test_binary_bool_bytes_other_than_0_and_1_are_refused(n, where):
    raw = np.zeros((n, 4), np.uint8)
    raw.flat[where.draw(st.integers(0, raw.size - 1))] = where.draw(st.integers(2, 255))
    head = json.dumps({"inputs": [{"name": "x", "datatype": "BOOL", "shape": [n, 4],
                                   "parameters": {"binary_data_size": raw.size}}]}).encode()
    refused(head + raw.tobytes(), str(len(head)), "BOOL", "out_of_range")


def _inside(dt):
    d = DTYPES[dt]
    if d.kind == "f":
        m = float(np.finfo(d).max)
        return st.floats(-m, m, width=8 * d.itemsize) | st.sampled_from([m, -m, 0.0, -0.0])
    info = np.iinfo(d)
    return st.integers(int(info.min), int(info.max))


@HYP
@given(dt=st.sampled_from(NUMERIC), data=st.data(), binary=st.booleans())
def test_finite_in_range_values_still_decode_exactly(dt, data, binary):
    values = data.draw(st.lists(_inside(dt), min_size=4, max_size=4))
    want = np.array(values, dtype=DTYPES[dt]).reshape(1, 4)
    if binary:
        req = parse_infer_request(*binary_body(dt, want), spec(dt), 8)
    else:
        req = parse_infer_request(json_body(dt, values), None, spec(dt), 8)
    got = req.inputs["x"]
    assert got.dtype == DTYPES[dt]
    np.testing.assert_array_equal(got, want)


# --- a live shim on loopback: every endpoint, counted in /metrics --------------------------------------
@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from host.keys import generate_keypair
    from host.serve.app import Server
    from host.serve.background import BackgroundServer
    from host.serve.config import ServeConfig
    from bench._toymodels import make_toy_bundle

    tmp = tmp_path_factory.mktemp("serve-hostile")
    priv, pub = generate_keypair(tmp / "keys")
    bundle = make_toy_bundle(tmp / "b1", priv, version=1)
    with BackgroundServer(Server(ServeConfig(replicas=1, max_batch_size=4), trusted_keys=pub), bundle=bundle) as url:
        with httpx.Client(base_url=url, timeout=30) as c:
            yield c


# (path, input name, shape without the batch) of every endpoint that takes a tensor
ENDPOINTS = [("/v2/models/kws-toy/infer", "features", [49, 10, 1]),
             ("/v2/models/kws-toy/versions/1/infer", "features", [49, 10, 1]),
             ("/v2/models/kws-toy.head/infer", "embedding", [64]),
             ("/v2/models/kws-toy.cloud/infer", "activation", [8, 8]),
             ("/v2/cascade/kws-toy", "features", [49, 10, 1]),
             ("/v2/cascade/kws-toy", "embedding", [64]),
             ("/v2/split/kws-toy", "activation", [8, 8])]


def refusals(c) -> float:
    r = c.get("/metrics")
    assert r.status_code == 200
    return sum(s.value for f in text_string_to_metric_families(r.text) for s in f.samples
               if s.name == "edgelearn_serve_rejections_total" and s.labels.get("reason") == "non_finite")


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(ep=st.sampled_from(ENDPOINTS), binary=st.booleans(), data=st.data())
@example(ep=ENDPOINTS[0], binary=True, data=None)   # the reported +Inf
def test_live_endpoints_refuse_non_finite_inputs_and_count_them(live, ep, binary, data):
    path, name, tail = ep
    shape = [1] + tail
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    i = data.draw(st.integers(0, x.size - 1)) if data is not None else 0
    before = refusals(live)
    if binary:
        x.flat[i] = data.draw(bad_float) if data is not None else math.inf
        blob = x.tobytes()
        head = json.dumps({"inputs": [{"name": name, "datatype": "FP32", "shape": shape,
                                       "parameters": {"binary_data_size": len(blob)}}]}).encode()
        r = live.post(path, content=head + blob, headers={"Inference-Header-Content-Length": str(len(head))})
    else:
        values = x.ravel().tolist()
        values[i] = RAW
        raw = data.draw(st.sampled_from(["1e39", "-1e39", "3.5e38", "1e400", "NaN", "-Infinity"]))
        body = json.dumps({"inputs": [{"name": name, "datatype": "FP32", "shape": shape, "data": values}]})
        r = live.post(path, content=body.replace(json.dumps(RAW), raw).encode(),
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert name in err or "JSON" in err, err
    assert "\n" not in err
    assert refusals(live) == before + 1
    # and the server keeps answering finite input
    x.flat[i] = 0.25
    blob = x.tobytes()
    head = json.dumps({"inputs": [{"name": name, "datatype": "FP32", "shape": shape,
                                   "parameters": {"binary_data_size": len(blob)}}]}).encode()
    ok = live.post(path, content=head + blob, headers={"Inference-Header-Content-Length": str(len(head))})
    assert ok.status_code == 200, ok.text


SHIPPED = __import__("pathlib").Path(__file__).resolve().parents[1] / "models" / "kws-dscnn-s"


@pytest.mark.skipif(not (SHIPPED / "manifest.json").exists(), reason="models/kws-dscnn-s is not built")
def test_the_shipped_model_no_longer_labels_infinity(tmp_path):
    """The report: +Inf features to the shipped model were answered 200 with a plausible label."""
    from edge.kws import default_trusted_keys
    from host.serve.app import Server
    from host.serve.background import BackgroundServer
    from host.serve.config import ServeConfig

    with BackgroundServer(Server(ServeConfig(replicas=1), trusted_keys=default_trusted_keys()), bundle=SHIPPED) as url:
        meta = httpx.get(f"{url}/v2/models/kws-dscnn-s").json()
        inp = meta["inputs"][0]
        shape = [1] + inp["shape"][1:]
        for bad in (math.inf, -math.inf, math.nan):
            x = np.full(shape, bad, np.float32)
            head = json.dumps({"inputs": [{"name": inp["name"], "datatype": "FP32", "shape": shape,
                                           "parameters": {"binary_data_size": x.nbytes}}]}).encode()
            r = httpx.post(f"{url}/v2/cascade/kws-dscnn-s", content=head + x.tobytes(),
                           headers={"Inference-Header-Content-Length": str(len(head))}, timeout=60)
            assert r.status_code == 400, r.text
        assert "non_finite" in httpx.get(f"{url}/metrics").text
