"""The federated tail as a small ONNX model, so the serving shim can serve each new version.

A published version carries ``head.onnx`` (partition ``fl-head``, placement
``cloud``): embedding (N, 64) -> proj -> relu -> [residual adapter] ->
classifier -> logits, with any LoRA factors merged into the weights (the
effective weights are read off ``edge.adapt.EmbeddingHead`` itself, so whatever the
device computes is what the cloud serves). A device sends the embedding of a
clip it is unsure about to ``/v2/split/<model>`` with ``partition: fl-head``.

    >>> write_head_onnx(params, "head.onnx")
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

PARTITION = "fl-head"


def effective_layers(params: dict) -> dict:
    """Dense weights of the tail with LoRA merged: {proj.w, proj.b, classifier.w, classifier.b, [adapter.a, adapter.b]}."""
    from edge.adapt.head import EmbeddingHead

    t = EmbeddingHead({k: np.asarray(v, np.float64) for k, v in params.items()})
    out = {}
    for layer in ("proj", "classifier"):
        d = t.p(f"{layer}.w").shape[0]
        b = t._linear(np.zeros((1, d)), layer)[0]
        out[f"{layer}.w"] = (t._linear(np.eye(d), layer) - b).astype(np.float32)
        out[f"{layer}.b"] = b.astype(np.float32)
    if t.p("adapter.a") is not None:
        out["adapter.a"] = np.asarray(t.p("adapter.a"), np.float32)
        out["adapter.b"] = np.asarray(t.p("adapter.b"), np.float32)
    return out


def write_head_onnx(params: dict, path) -> dict:
    """Write the ONNX model; returns the partition entry for the manifest."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = effective_layers(params)
    dim, classes = w["proj.w"].shape[0], w["classifier.w"].shape[1]
    inits = [numpy_helper.from_array(v, k.replace(".", "_")) for k, v in w.items()]
    nodes = [helper.make_node("MatMul", ["embedding", "proj_w"], ["z1m"]),
             helper.make_node("Add", ["z1m", "proj_b"], ["z1"]),
             helper.make_node("Relu", ["z1"], ["h"])]
    h = "h"
    if "adapter.a" in w:
        nodes += [helper.make_node("MatMul", ["h", "adapter_a"], ["u"]),
                  helper.make_node("Relu", ["u"], ["v"]),
                  helper.make_node("MatMul", ["v", "adapter_b"], ["vb"]),
                  helper.make_node("Add", ["h", "vb"], ["h2"])]
        h = "h2"
    nodes += [helper.make_node("MatMul", [h, "classifier_w"], ["lm"]),
              helper.make_node("Add", ["lm", "classifier_b"], ["logits"])]
    graph = helper.make_graph(
        nodes, "fl_head", [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["N", dim])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="edgelearn")
    model.ir_version = 8
    onnx.checker.check_model(model)
    Path(path).write_bytes(model.SerializeToString())
    return {"name": PARTITION, "role": "head", "file": Path(path).name, "format": "onnx",
            "placement": "cloud", "precision": "float32",
            "inputs": [{"name": "embedding", "shape": [-1, dim], "dtype": "float32"}],
            "outputs": [{"name": "logits", "shape": [-1, classes], "dtype": "float32", "role": "logits"}]}
