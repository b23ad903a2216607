"""The per-layer fallback machinery of host/quantize.py on a tiny model (the shipped model never needs it)."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tensorflow import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((49, 10, 1), name="features")
    x = keras.layers.Conv2D(8, (3, 3), strides=2, padding="same", name="c1")(inp)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(8, (1, 1), name="c2")(x)
    emb = keras.layers.GlobalAveragePooling2D(name="embedding")(x)
    probs = keras.layers.Softmax(name="probs")(keras.layers.Dense(5, name="classifier")(emb))
    model = keras.Model(inp, [emb, probs])
    calib = np.random.default_rng(0).standard_normal((40, 49, 10, 1)).astype(np.float32)
    return model, calib, tmp_path_factory.mktemp("q")


def test_layer_errors_rank_tflite_tensors(tiny):
    from host.quantize import tflite_layer_errors

    model, calib, _ = tiny
    errs = tflite_layer_errors(model, calib)
    assert errs and all(isinstance(n, str) and e >= 0 for n, e in errs)
    assert [e for _, e in errs] == sorted((e for _, e in errs), reverse=True)


def test_denylisted_layer_stays_float_and_model_still_runs(tiny):
    from ai_edge_litert.interpreter import Interpreter

    from host.quantize import tflite_layer_errors, to_tflite

    model, calib, _ = tiny
    full = to_tflite(model, calib)
    worst = tflite_layer_errors(model, calib)[0][0]
    mixed = to_tflite(model, calib, denylist=[worst])
    assert mixed != full
    it = Interpreter(model_content=mixed)
    it.allocate_tensors()
    d = it.get_input_details()[0]
    it.set_tensor(d["index"], calib[:1].astype(d["dtype"]))
    it.invoke()
    assert any(t["dtype"] == np.float32 for t in it.get_tensor_details())


def test_onnx_qdq_and_node_errors(tiny):
    from host.quantize import onnx_node_errors, quantize_onnx, to_onnx

    model, calib, tmp = tiny
    fp32 = to_onnx(model, tmp / "m.onnx")
    int8 = quantize_onnx(fp32, tmp / "m8.onnx", calib)
    errs = onnx_node_errors(fp32, int8, calib)
    assert errs and all(isinstance(n, str) for n, _ in errs)
    excl = quantize_onnx(fp32, tmp / "m8x.onnx", calib, exclude=[errs[0][0]])
    assert excl.stat().st_size > 0
