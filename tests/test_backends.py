"""Interpreter backends agree with each other and with Keras on tiny models built here.

The models (a small conv net, int8 TFLite with a representative dataset, and
float ONNX via tf2onnx) are built once per session in a child process, so the
test process itself never imports TensorFlow.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from edge import backends
from edge.backends import BackendUnavailable, dequantize, load, quantize
from edge.errors import EdgelearnError

ROOT = Path(__file__).resolve().parents[1]

_BUILD = textwrap.dedent("""
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import numpy as np, tensorflow as tf, tf2onnx
    out = sys.argv[1]
    tf.keras.utils.set_random_seed(0)  # Keras 3 initialisers ignore tf.random.set_seed alone
    inp = tf.keras.Input((49, 10, 1))
    x = tf.keras.layers.Conv2D(8, (3, 3), strides=2, padding="same", activation="relu")(inp)
    x = tf.keras.layers.DepthwiseConv2D((3, 3), padding="same", activation="relu")(x)
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    model = tf.keras.Model(inp, tf.keras.layers.Dense(4)(x))
    rep = np.random.default_rng(0).normal(size=(64, 49, 10, 1)).astype(np.float32)
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([r[None]] for r in rep)
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = conv.inference_output_type = tf.int8
    open(out + "/tiny_int8.tflite", "wb").write(conv.convert())
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    open(out + "/tiny_fp32.tflite", "wb").write(conv.convert())
    spec = (tf.TensorSpec((None, 49, 10, 1), tf.float32, name="features"),)
    tf2onnx.convert.from_function(tf.function(lambda t: model(t)), input_signature=spec, opset=17,
                                  output_path=out + "/tiny.onnx")
    test = np.random.default_rng(1).normal(size=(8, 49, 10, 1)).astype(np.float32)
    np.save(out + "/x.npy", test)
    np.save(out + "/y_keras.npy", model(test).numpy())
""")


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    pytest.importorskip("tensorflow", reason="building test models needs the host extra (tensorflow-cpu)")
    pytest.importorskip("tf2onnx", reason="building test models needs tf2onnx (host extra)")
    out = tmp_path_factory.mktemp("tiny_models")
    res = subprocess.run(["nice", "-n", "10", sys.executable, "-c", _BUILD, str(out)], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return {"dir": out, "int8": out / "tiny_int8.tflite", "fp32": out / "tiny_fp32.tflite",
            "onnx": out / "tiny.onnx", "x": np.load(out / "x.npy"), "y": np.load(out / "y_keras.npy")}


def test_importing_edge_backends_imports_no_interpreter():
    code = ("import sys, edge.backends, edge.bundle, edge.store; "
            "print([m for m in ('ai_edge_litert', 'onnxruntime', 'tflite_micro', 'tflite_runtime', 'tensorflow') "
            "if m in sys.modules])")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert res.stdout.strip() == "[]", res.stderr


def test_auto_picks_litert_for_tflite_and_onnxruntime_for_onnx(tiny):
    assert load(tiny["int8"]).name == "litert"
    assert load(tiny["onnx"]).name == "onnxruntime"


def test_int8_litert_and_tflite_micro_agree_within_one_lsb(tiny):
    lit, mic = load(tiny["int8"], backend="litert"), load(tiny["int8"], backend="tflite_micro")
    assert [i.dtype for i in lit.inputs + lit.outputs] == [np.dtype(np.int8)] * 2
    assert (lit.inputs[0].scale, lit.inputs[0].zero_point) == (mic.inputs[0].scale, mic.inputs[0].zero_point)
    assert mic.inputs[0].shape == (1, 49, 10, 1) and lit.inputs[0].shape[1:] == (49, 10, 1)
    q = quantize(tiny["x"], lit.inputs[0])
    a, b = lit.invoke(q)[0], mic.invoke(q)[0]  # batch 8: LiteRT resizes, TFLM loops
    assert a.shape == b.shape == (8, 4) and a.dtype == b.dtype == np.int8
    assert np.abs(a.astype(int) - b.astype(int)).max() <= 1
    one_by_one = np.concatenate([lit.invoke(q[i:i + 1])[0] for i in range(8)])
    np.testing.assert_array_equal(one_by_one, a)  # a resized batch computes the same as single examples


def test_run_quantises_and_dequantises(tiny):
    lit = load(tiny["int8"])
    x = tiny["x"]
    out = lit.run(x)[0]
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, dequantize(lit.invoke(quantize(x, lit.inputs[0]))[0], lit.outputs[0]))
    # int8 vs the float Keras model: quantisation error of a few output steps, not more.
    err = np.abs(out - tiny["y"]).max()
    assert err <= 4 * lit.outputs[0].scale, (err, lit.outputs[0].scale)
    assert np.abs(load(tiny["int8"], backend="tflite_micro").run(x)[0] - out).max() <= lit.outputs[0].scale * 1.01


def test_run1_is_run_for_one_example_and_run_checks_the_rest(tiny):
    """The streaming detector's one-example call (LiteRT skips the batch checks) gives run's outputs
    bit for bit; a batch, a wrong shape or a resized interpreter goes through run and its errors."""
    for path, backend in ((tiny["int8"], "auto"), (tiny["fp32"], "auto"), (tiny["onnx"], "auto"),
                          (tiny["int8"], "tflite_micro")):
        m = load(path, backend=backend)
        for i in range(3):
            x = tiny["x"][i:i + 1]
            for a, b in zip(m.run1(x), m.run(x)):
                np.testing.assert_array_equal(a, b)
    lit = load(tiny["int8"])
    np.testing.assert_array_equal(lit.run1(tiny["x"][:3])[0], lit.run(tiny["x"][:3])[0])  # a batch: run
    np.testing.assert_array_equal(lit.run1(tiny["x"][:1])[0], lit.run(tiny["x"][:1])[0])  # back to one
    with pytest.raises(EdgelearnError, match=r"has shape \(1, 49, 10\), model expects"):
        lit.run1(tiny["x"][:1, :, :, 0])


def test_float_models_match_keras(tiny):
    onnx = load(tiny["onnx"], num_threads=2)
    assert onnx.inputs[0].name == "features" and onnx.inputs[0].shape == (-1, 49, 10, 1)
    np.testing.assert_allclose(onnx.run(tiny["x"])[0], tiny["y"], atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(onnx.invoke(tiny["x"])[0], tiny["y"], atol=1e-5, rtol=1e-4)
    fp32 = load(tiny["fp32"])
    assert not fp32.inputs[0].quantized
    np.testing.assert_allclose(fp32.run(tiny["x"].astype(np.float64))[0], tiny["y"], atol=1e-5, rtol=1e-4)


def test_bad_inputs_are_clear_errors(tiny):
    lit = load(tiny["int8"])
    with pytest.raises(EdgelearnError, match="is int8, got float32.*use run"):
        lit.invoke(tiny["x"])
    with pytest.raises(EdgelearnError, match=r"has shape \(49, 10\), model expects"):
        lit.run(tiny["x"][0, :, :, 0])
    with pytest.raises(EdgelearnError, match="takes 1 input"):
        lit.run(tiny["x"], tiny["x"])
    with pytest.raises(EdgelearnError, match="model file not found"):
        load(tiny["dir"] / "nope.tflite")
    with pytest.raises(EdgelearnError, match="unknown backend 'tpu'"):
        load(tiny["int8"], backend="tpu")
    with pytest.raises(EdgelearnError, match="cannot choose a backend for .bin"):
        load(tiny["x"].tofile(tiny["dir"] / "m.bin") or tiny["dir"] / "m.bin")
    with pytest.raises(EdgelearnError, match="num_threads"):
        load(tiny["int8"], num_threads=0)
    junk = tiny["dir"] / "junk.tflite"
    junk.write_bytes(os.urandom(64))
    with pytest.raises(EdgelearnError, match="junk.tflite: litert cannot load it"):
        load(junk)
    junk_onnx = tiny["dir"] / "junk.onnx"
    junk_onnx.write_bytes(b"not a protobuf")
    with pytest.raises(EdgelearnError, match="junk.onnx: onnxruntime cannot load it"):
        load(junk_onnx)


def test_tflite_runtime_refuses_numpy2_and_names_the_reason():
    mod = backends._module("tflite_runtime")
    with pytest.raises(BackendUnavailable, match=r"NumPy 2\.1\.0.*stopped at 2\.14.*NumPy < 2.*Python 3\.11 aarch64.*litert"):
        mod.check_available("2.1.0")
    try:  # under NumPy 1.x the message names the pip package when it is missing
        import tflite_runtime  # noqa: F401
    except ImportError:
        with pytest.raises(BackendUnavailable, match="needs the package tflite-runtime"):
            mod.check_available("1.26.4")


def test_missing_package_names_pip_package(tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)
    with pytest.raises(BackendUnavailable, match="`pip install ai-edge-litert`"):
        load(tiny["int8"], backend="litert")
    if np.__version__.startswith("1."):
        pytest.skip("tflite_runtime may be usable under NumPy 1.x")
    with pytest.raises(BackendUnavailable, match=r"no backend for \.tflite is usable.*litert.*tflite_runtime"):
        load(tiny["int8"])
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(BackendUnavailable, match="`pip install onnxruntime`"):
        load(tiny["onnx"])
    assert backends.available()["onnxruntime"] is not None


_SMALL_ARENA = """
import sys
from edge.backends import load
from edge.errors import EdgelearnError
try:
    load(sys.argv[1], backend="tflite_micro", arena_size=int(sys.argv[2]))
except EdgelearnError as e:
    print(e)
"""


def test_tflite_micro_arena_probe_and_too_small_arena(tiny):
    from edge.backends.tflite_micro import _trial, default_arena_size, probe_arena_size

    n = probe_arena_size(tiny["int8"])
    assert 0 < n < default_arena_size(tiny["int8"].stat().st_size)
    assert _trial(tiny["int8"], n)[0] and not _trial(tiny["int8"], n - 1)[0]
    assert load(tiny["int8"], backend="tflite_micro", arena_size=n).run(tiny["x"])[0].shape == (8, 4)
    # In a child: a too-small arena may abort the process in some TFLM builds.
    res = subprocess.run([sys.executable, "-c", _SMALL_ARENA, str(tiny["int8"]), str(n // 2)], capture_output=True,
                         text=True, cwd=ROOT)
    assert res.returncode != 0 or "could not allocate tensors in a" in res.stdout, res.stdout + res.stderr
    with pytest.raises(EdgelearnError, match="takes no options"):
        load(tiny["int8"], backend="tflite_micro", arena=5)


def test_truncated_model_is_a_clear_error_on_every_tflite_backend(tiny):
    trunc = tiny["dir"] / "trunc.tflite"
    trunc.write_bytes(tiny["int8"].read_bytes()[:1500])
    with pytest.raises(EdgelearnError, match="trunc.tflite: litert cannot load it"):
        load(trunc, backend="litert")
    # TFLM's C++ does not verify flatbuffers, so this runs in a child that may crash without taking pytest along.
    code = ("import sys\nfrom edge.backends import load\nfrom edge.errors import EdgelearnError\n"
            "try:\n    load(sys.argv[1], backend='tflite_micro')\nexcept EdgelearnError as e:\n    print(e)")
    res = subprocess.run([sys.executable, "-c", code, str(trunc)], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0 and "trunc.tflite: TFLite Micro cannot read it" in res.stdout, res.stdout + res.stderr
