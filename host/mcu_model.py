"""The MCU model variant: a tiny temporal CNN for ESP32-class boards running pure MicroPython.

DS-CNN-S (2.66 M MACs) needs ~7 s per window at the esp32 profile's
0.4 M MAC/s. This variant is a temporal CNN on the MFCC map (as TC-ResNet):
a 5x10 convolution spanning all coefficients (49x10 -> 23x1), two stride-2
temporal convolutions (32 -> 32 -> 48 channels), average pooling to a 48-d
embedding and a dense classifier: ~128 k MACs and ~13 k int8 weights, so one
window costs ~0.3 s on the board. (A one-block DS-CNN of the same cost sees
only ~0.3 s of audio before global pooling and learned much worse.) Average pooling is an ``AveragePooling2D``
over the whole map (TFLite ``AVERAGE_POOL_2D``, whose integer rounding is
simple to match exactly) rather than ``GlobalAveragePooling2D`` (``MEAN``).

The exported int8 model has two outputs, ``embedding`` (32) and ``logits``
(37): the board takes softmax in float on 37 numbers, so no int8 softmax
kernel is needed. Besides the ``.tflite`` the export writes the partitioner's
tensor blob (``weights.elb``, docs/partition.md) and ``graph.json``, the op
list with activation quantisation that the blob does not carry
(docs/firmware.md).

    $ nice -n 10 python -m host.mcu_model --out build/mcu --epochs 30 --max-minutes 10
    $ python -m host.mcu_model --export-only --out build/mcu --bundle models/kws-mcu
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

MODEL_ID = "kws-mcu-tcnn"
CHANNELS = (32, 32, 48)
# Ops the portable kernels run (edge/portable/model.py); anything else in the graph is an error.
SUPPORTED_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "AVERAGE_POOL_2D", "RESHAPE", "FULLY_CONNECTED")


_SHAPE_OPS = ("SHAPE", "STRIDED_SLICE", "PACK", "CONCATENATION")


def build_mcu_dscnn(num_classes: int, channels=CHANNELS, input_shape=(49, 10, 1), dropout=0.1):
    """Keras model with outputs ``[embedding, probs]`` (the contract of host.train.train)."""
    from tensorflow import keras
    from tensorflow.keras import layers as L

    c0, c1, c2 = channels
    inp = keras.Input(shape=input_shape, name="features")
    # (5 x 10) valid: a temporal convolution over all 10 coefficients at once (49x10 -> 23x1)
    x = L.Conv2D(c0, (5, input_shape[1]), strides=(2, 1), padding="valid", use_bias=False, name="conv0")(inp)
    for i, (c, k) in enumerate(((c1, 5), (c2, 3)), start=1):
        x = L.BatchNormalization(name=f"bn{i - 1}")(x)
        x = L.ReLU(name=f"relu{i - 1}")(x)
        x = L.Conv2D(c, (k, 1), strides=(2, 1), padding="same", use_bias=False, name=f"conv{i}")(x)
    x = L.BatchNormalization(name="bn2")(x)
    x = L.ReLU(name="relu2")(x)
    x = L.AveragePooling2D(pool_size=(x.shape[1], x.shape[2]), name="pool")(x)
    emb = L.Flatten(name="embedding")(x)
    h = L.Dropout(dropout, name="dropout")(emb)
    logits = L.Dense(num_classes, name="classifier")(h)
    probs = L.Softmax(name="probs")(logits)
    return keras.Model(inp, [emb, probs], name="mcu_tcnn")


def export_model(model):
    """The deployable graph: ``[embedding, logits]`` (no softmax on the board)."""
    from tensorflow import keras
    return keras.Model(model.input, [model.get_layer("embedding").output,
                                     model.get_layer("classifier").output], name="mcu_dscnn_export")


def graph_spec(g) -> dict:
    """The op list the board runs: tensor names, shapes, options and activation quantisation."""
    from host.partition.graph import ModelError

    t = g.tensors

    def q(i):
        ten = t[i]
        return [float(ten.scales[0]), int(ten.zero_points[0])] if ten.scales else None

    # Keras' Flatten with a dynamic batch computes the new shape at run time
    # (SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE); every tensor here has a
    # static shape, so that arithmetic is dropped when it only feeds RESHAPE's shape input.
    shape_only = set()
    for layer in g.layers:
        if layer.op == "SHAPE" or (layer.op in _SHAPE_OPS and any(i in shape_only for i in layer.inputs)):
            shape_only.update(layer.outputs)
    for layer in g.layers:
        for pos, i in enumerate(layer.inputs):
            if i in shape_only and layer.op not in _SHAPE_OPS and not (layer.op == "RESHAPE" and pos == 1):
                raise ModelError(f"{g.path}: a computed shape feeds {layer.op}",
                                 fix="use static shapes (keras Reshape instead of Flatten)")
    ops = []
    for layer in g.layers:
        if layer.op in _SHAPE_OPS and set(layer.outputs) <= shape_only:
            continue
        if layer.op not in SUPPORTED_OPS:
            raise ModelError(f"{g.path}: op {layer.op} has no portable int8 kernel",
                             fix="use host.mcu_model.build_mcu_dscnn or add the kernel to edge/portable/kernels.py")
        ins = [i for i in layer.inputs if i >= 0]
        if layer.op == "RESHAPE":
            ins = ins[:1]
        op = {"op": layer.op, "inputs": [t[i].name for i in ins], "output": t[layer.outputs[0]].name,
              "in_shape": list(t[ins[0]].shape), "out_shape": list(t[layer.outputs[0]].shape),
              "in_q": q(ins[0]), "out_q": q(layer.outputs[0])}
        op.update({k: (list(v) if isinstance(v, tuple) else v) for k, v in layer.params.items()})
        ops.append(op)
    inp, outs = t[g.inputs[0]], [t[i] for i in g.outputs]
    return {"format": "edgelearn-mcu-graph", "version": 1,
            "input": {"name": inp.name, "shape": list(inp.shape), "q": q(g.inputs[0])},
            "outputs": [{"name": o.name, "shape": list(o.shape), "q": q(o.index),
                         "role": "embedding" if o.shape[-1] == CHANNELS[-1] else "logits"} for o in outs],
            "ops": ops}


def export(work: Path, corpus=None) -> dict:
    """``work/model.keras`` -> ``mcu_int8.tflite``, ``weights.elb``, ``graph.json``; returns quant metrics."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tensorflow import keras

    from host.data.corpus import build_corpus
    from host.partition.blob import write_blob
    from host.partition.graph import load_graph
    from host.quantize import calibration_features
    from host.train import evaluate_model

    corpus = corpus or build_corpus(progress=False)
    scale = json.loads((work / "frontend.json").read_text())["scale"]
    model = keras.models.load_model(work / "model.keras", compile=False)
    calib = calibration_features(corpus, scale)
    (work / "mcu_int8.tflite").write_bytes(_to_tflite(export_model(model), calib))
    g = load_graph(work / "mcu_int8.tflite")
    write_blob(g, work / "weights.elb")
    (work / "graph.json").write_text(json.dumps(graph_spec(g), separators=(",", ":")))
    metrics = evaluate_model(int8_predictor(work / "mcu_int8.tflite"), corpus, scale, ("espeak", "festival"))
    metrics.update(macs=int(g.total_macs), weight_bytes=int(g.weight_bytes),
                   tflite_bytes=(work / "mcu_int8.tflite").stat().st_size,
                   blob_bytes=(work / "weights.elb").stat().st_size)
    (work / "quant_metrics.json").write_text(json.dumps(metrics, indent=1))
    return metrics


def int8_predictor(path: Path, batch: int = 256):
    """``feats (N,49,10) -> (embedding, probs)`` through LiteRT on the exported int8 model."""
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(path), num_threads=1)
    inp = it.get_input_details()[0]
    it.resize_tensor_input(inp["index"], [batch, 49, 10, 1])
    it.allocate_tensors()
    outs = sorted(it.get_output_details(), key=lambda o: o["shape"][-1] != CHANNELS[-1])  # embedding first

    def predict(feats):
        embs, probs = [], []
        s, z = inp["quantization"]
        for a in range(0, len(feats), batch):
            x = feats[a:a + batch]
            n = len(x)
            x = np.concatenate([x, np.zeros((batch - n,) + x.shape[1:], x.dtype)]).reshape(batch, 49, 10, 1)
            it.set_tensor(inp["index"], np.clip(np.round(x / s + z), -128, 127).astype(np.int8))
            it.invoke()
            e, lg = ((it.get_tensor(o["index"])[:n].astype(np.float32) - o["quantization"][1])
                     * o["quantization"][0] for o in outs)
            p = np.exp(lg - lg.max(-1, keepdims=True))
            embs.append(e)
            probs.append(p / p.sum(-1, keepdims=True))
        return np.concatenate(embs), np.concatenate(probs)

    return predict


def _to_tflite(model, calib):
    from host.quantize import to_tflite
    return to_tflite(model, calib)


def bundle_files(work: Path) -> dict:
    return {"mcu_int8.tflite": work / "mcu_int8.tflite", "weights.elb": work / "weights.elb",
            "graph.json": work / "graph.json"}


def manifest(work: Path, version: int) -> dict:
    """Bundle manifest for the MCU variant (sign with host.bundle.build_bundle)."""
    from edge import features as F
    from host.data.words import LABELS

    scale = json.loads((work / "frontend.json").read_text())["scale"]
    train_m = json.loads((work / "metrics.json").read_text())
    quant_m = json.loads((work / "quant_metrics.json").read_text())
    spec = json.loads((work / "graph.json").read_text())
    return {
        "model_id": MODEL_ID, "version": version, "labels": LABELS,
        "frontend": {**F.PARAMS, "normalize": {"kind": "window-mean-removal+scale",
                                               "scale": [float(s) for s in scale]}},
        "target": "esp32",
        "partitions": [
            {"name": "encoder", "role": "encoder", "file": "mcu_int8.tflite", "format": "tflite",
             "placement": "cpu", "precision": "int8", "inputs": [spec["input"]], "outputs": spec["outputs"]},
            {"name": "encoder-mcu", "role": "encoder", "file": "weights.elb", "format": "mpy-blob",
             "placement": "mcu", "precision": "int8", "graph": "graph.json",
             "inputs": [spec["input"]], "outputs": spec["outputs"]}],
        "trainable": {"strategy": "prototypes+bias", "tensors": ["classifier"],
                      "embedding_dim": CHANNELS[-1]},
        "quantization": {"scheme": "full-integer int8, per-channel weights",
                         "calibration": "600 training-split clips", "fallback_layers": []},
        "extra": {"metrics": {"train": train_m, "quant": quant_m}},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("build") / "mcu")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--max-minutes", type=float, default=10.0)
    p.add_argument("--export-only", action="store_true")
    p.add_argument("--corpus", type=Path, help="a rendered corpus directory (default: build_corpus())")
    args = p.parse_args(argv)
    from host.data.corpus import build_corpus, load_corpus
    corpus = load_corpus(args.corpus) if args.corpus else build_corpus()
    if not args.export_only:
        from host.train import train
        train(args.out, epochs=args.epochs, max_minutes=args.max_minutes, build=build_mcu_dscnn, threads=1,
              corpus=corpus)
    print(json.dumps(export(args.out, corpus), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
