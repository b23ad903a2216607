"""Tiny ONNX models and signed bundles shaped like the keyword spotter, for the
serving shim's tests and benchmarks (built in milliseconds with onnx.helper,
no TensorFlow).

The full model maps ``features`` (N, 49, 10, 1) to ``embedding`` (N, 64) and
``logits`` (N, labels). ``broken=True`` adds a term that is NaN whenever a
row's mean feature exceeds 0.5: it passes the shim's warm-up check (a seeded
standard-normal input, mean ~ 0) and fails on such traffic, the way a model
breaks on real data that its smoke test never covered.

    >>> make_full_model("m.onnx", n_labels=4)
    >>> make_toy_bundle(tmp / "b3", priv_key, version=3)        # signed, with a cloud half
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

LABELS = ["yes", "no", "_silence_", "_unknown_"]
EMBED = 64


def _save(graph, path) -> Path:
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="edgelearn-toymodels")
    model.ir_version = 9  # what onnxruntime >= 1.20 reads
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return Path(path)


def _init(name, arr):
    from onnx import numpy_helper
    return numpy_helper.from_array(np.asarray(arr), name)


def make_full_model(path, n_labels: int = len(LABELS), broken: bool = False, seed: int = 0,
                    dead: bool = False) -> Path:
    """``dead=True``: zeroed classifier weights, so every answer is uniform (fails warm-up)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((490, EMBED)) / np.sqrt(490)).astype(np.float32)
    w2 = (rng.standard_normal((EMBED, n_labels)) * 2.0 / np.sqrt(EMBED)).astype(np.float32) * (not dead)
    inits = [_init("shape", np.array([-1, 490], np.int64)), _init("w1", w1), _init("b1", np.zeros(EMBED, np.float32)),
             _init("w2", w2), _init("b2", np.linspace(-0.5, 0.5, n_labels).astype(np.float32) * (not dead))]
    nodes = [helper.make_node("Reshape", ["features", "shape"], ["flat"]),
             helper.make_node("MatMul", ["flat", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["pre"]),
             helper.make_node("Relu", ["pre"], ["embedding"]),
             helper.make_node("MatMul", ["embedding", "w2"], ["z"])]
    if broken:
        inits += [_init("half", np.float32(0.5)), _init("zero", np.float32(0.0))]
        nodes += [helper.make_node("ReduceMean", ["flat"], ["mean"], axes=[1], keepdims=1),
                  helper.make_node("Sub", ["half", "mean"], ["gap"]), helper.make_node("Log", ["gap"], ["lg"]),
                  helper.make_node("Mul", ["lg", "zero"], ["poison"]),
                  helper.make_node("Add", ["z", "poison"], ["z2"]), helper.make_node("Add", ["z2", "b2"], ["logits"])]
    else:
        nodes.append(helper.make_node("Add", ["z", "b2"], ["logits"]))
    graph = helper.make_graph(
        nodes, "toy_kws" + ("_broken" if broken else ""),
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 49, 10, 1])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["N", EMBED]),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", n_labels])], inits)
    return _save(graph, path)


def make_cloud_half(path, n_labels: int = len(LABELS), seed: int = 1) -> Path:
    """The cloud half of a split model: activation (N, 8, 8) at the cut -> logits."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((64, n_labels)) * 2.0 / 8).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["activation", "shape"], ["flat"]),
         helper.make_node("MatMul", ["flat", "w"], ["logits"])], "toy_cloud_half",
        [helper.make_tensor_value_info("activation", TensorProto.FLOAT, ["N", 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", n_labels])],
        [_init("shape", np.array([-1, 64], np.int64)), _init("w", w)])
    return _save(graph, path)


def make_toy_bundle(out_dir, private_key_path, version: int = 1, broken: bool = False,
                    cloud_half: bool = True, model_id: str = "kws-toy", seed: int = 0, dead: bool = False) -> Path:
    """A signed bundle (host.bundle.build_bundle) with the full model and a cloud half."""
    import tempfile

    from host.bundle import build_bundle

    with tempfile.TemporaryDirectory(prefix="edgelearn-toy-") as tmp:
        tmp = Path(tmp)
        files = {"model.onnx": make_full_model(tmp / "model.onnx", broken=broken, seed=seed, dead=dead)}
        parts = [{"name": "full", "file": "model.onnx", "format": "onnx", "placement": "cpu", "precision": "fp32"}]
        if cloud_half:
            files["cloud.onnx"] = make_cloud_half(tmp / "cloud.onnx")
            parts.append({"name": "cloud", "file": "cloud.onnx", "format": "onnx", "placement": "cloud",
                          "precision": "fp32"})
        manifest = {"model_id": model_id, "version": version, "labels": LABELS, "partitions": parts}
        return build_bundle(out_dir, files, manifest, private_key_path)
