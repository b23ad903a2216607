"""Full-integer int8 TFLite and int8 ONNX (QDQ) from a trained model (``quantize``);
``edgelearn quantize`` (``host/commands/quantize.py``) runs it.

TFLite: the TFLite converter with a representative dataset from the training
split, per-channel weights, int8 input and outputs. ONNX: tf2onnx export, ONNX
Runtime ``quant_pre_process`` then ``quantize_static`` (QDQ, per-channel, int8
activations and weights) calibrated on the same clips. Each int8 model is
scored beside fp32 on the same clips; if one loses more than ``max_drop``
points, the layers with the largest quantisation error (per-layer outputs
compared against fp32) are kept in float, one at a time, until it does not.

    >>> quantize("build/kws", "build/kws")["metrics"]
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

CALIBRATION_CLIPS = 600


def calibration_features(corpus, scale, n=CALIBRATION_CLIPS, seed=1) -> np.ndarray:
    """Representative inputs: placed, noised training clips of every class."""
    from host.augment import features_for
    from host.data import noise as N
    from host.data.corpus import add_background

    rng = np.random.default_rng(seed)
    idx = corpus.select("train")
    pick = rng.choice(idx, min(n, idx.size), replace=False)
    pool = [corpus.utterance(i) for i in corpus.select("train", kinds=("filler",))]
    x = np.stack([N.place(rng, corpus.utterance(i)) for i in pick] +
                 [np.zeros(16000, np.float32)] * (len(pick) // 30))
    x = add_background(rng, x, pool, speech_rows=len(pick))
    return features_for(np.clip(x, -32768, 32767), scale)[..., None]


def to_tflite(model, calib: np.ndarray | None, denylist=()) -> bytes:
    import tensorflow as tf

    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    if calib is None:
        return conv.convert()
    conv.optimizations = [tf.lite.Optimize.DEFAULT]

    def rep():
        for i in range(len(calib)):
            yield [calib[i:i + 1].astype(np.float32)]

    conv.representative_dataset = rep
    if denylist:
        # Selective quantisation: the named layers stay float (the model then
        # needs float kernels too, so it is no longer for int8-only targets).
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8,
                                          tf.lite.OpsSet.TFLITE_BUILTINS]
        debug_opts = tf.lite.experimental.QuantizationDebugOptions(
            denylisted_nodes=list(denylist))
        dbg = tf.lite.experimental.QuantizationDebugger(
            converter=conv, debug_dataset=rep, debug_options=debug_opts)
        return dbg.get_nondebug_quantized_model()
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = tf.int8
    conv.inference_output_type = tf.int8
    return conv.convert()


def tflite_layer_errors(model, calib: np.ndarray) -> list[tuple[str, float]]:
    """Per-layer quantisation error (RMSE / scale) from TFLite's QuantizationDebugger."""
    import tensorflow as tf

    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([calib[i:i + 1]] for i in range(min(100, len(calib))))
    dbg = tf.lite.experimental.QuantizationDebugger(converter=conv, debug_dataset=conv.representative_dataset)
    dbg.run()
    import csv
    import io

    buf = io.StringIO()
    dbg.layer_statistics_dump(buf)
    rows = list(csv.DictReader(io.StringIO(buf.getvalue())))
    out = []
    for r in rows:
        rmse, scale = float(r.get("mean_squared_error", 0) or 0) ** 0.5, float(r.get("scale", 1) or 1)
        out.append((r["tensor_name"], rmse / scale if scale else rmse))
    return sorted(out, key=lambda t: -t[1])


def to_onnx(model, path: Path) -> Path:
    import tensorflow as tf
    import tf2onnx

    spec = (tf.TensorSpec((None,) + tuple(model.input.shape[1:]), tf.float32, name="features"),)
    tf2onnx.convert.from_keras(model, input_signature=spec, opset=17, output_path=str(path))
    return path


def quantize_onnx(fp32: Path, out: Path, calib: np.ndarray, exclude=()) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = out.with_name(out.stem + ".pre.onnx")
    quant_pre_process(str(fp32), str(pre), skip_symbolic_shape=True)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(calib[i:i + 1].astype(np.float32) for i in range(len(calib)))

        def get_next(self):
            x = next(self.it, None)
            return None if x is None else {"features": x}

    quantize_static(str(pre), str(out), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8, nodes_to_exclude=list(exclude),
                    extra_options={"ActivationSymmetric": False, "WeightSymmetric": True})
    pre.unlink(missing_ok=True)
    return out


def onnx_node_errors(fp32: Path, int8: Path, calib: np.ndarray) -> list[tuple[str, float]]:
    """Nodes of the fp32 model ranked worst first by the SQNR (dB) of their int8 output (ORT's qdq_loss_debug).

    Names are node names, as ``quantize_static(nodes_to_exclude=...)`` wants.
    """
    import onnx
    from onnxruntime.quantization.qdq_loss_debug import (collect_activations, compute_activation_error,
                                                         create_activation_matching,
                                                         modify_model_output_intermediate_tensors)

    tmp_a, tmp_b = fp32.with_suffix(".dbg.onnx"), int8.with_suffix(".dbg.onnx")
    modify_model_output_intermediate_tensors(str(fp32), str(tmp_a))
    modify_model_output_intermediate_tensors(str(int8), str(tmp_b))
    feeds = [{"features": calib[i:i + 1].astype(np.float32)} for i in range(min(50, len(calib)))]
    try:
        a = collect_activations(str(tmp_a), feeds)
        b = collect_activations(str(tmp_b), feeds)
    finally:
        tmp_a.unlink(missing_ok=True)
        tmp_b.unlink(missing_ok=True)
    errs = compute_activation_error(create_activation_matching(b, a))
    producer = {out: node.name for node in onnx.load(str(fp32)).graph.node for out in node.output}
    ranked = [(producer[t], float(v["xmodel_err"])) for t, v in errs.items()
              if t in producer and "xmodel_err" in v and np.isfinite(v["xmodel_err"])]
    return sorted(ranked, key=lambda t: t[1])


class Scorer:
    """Score a model on the fixed val/test/unseen clips with any predict(features) function."""

    def __init__(self, corpus, scale):
        from host.augment import features_for

        self.sets = {}
        for split in ("val", "test", "unseen"):
            x, y, _ = corpus.eval_clips(split)
            self.sets[split] = (features_for(x, scale)[..., None], y)

    def score(self, predict_probs) -> dict:
        from host.evaluate import accuracy12

        return {s: accuracy12(predict_probs(f), y) for s, (f, y) in self.sets.items()}


def tflite_predictor(model_bytes: bytes):
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=model_bytes, num_threads=2)
    inp = it.get_input_details()[0]
    probs_out = [o for o in it.get_output_details() if o["shape"][-1] != 64][0]
    it.resize_tensor_input(inp["index"], [256, 49, 10, 1])
    it.allocate_tensors()

    def predict(feats):
        res = []
        for a in range(0, len(feats), 256):
            x = feats[a:a + 256]
            n = len(x)
            if n < 256:
                x = np.concatenate([x, np.zeros((256 - n,) + x.shape[1:], x.dtype)])
            s, z = inp["quantization"]
            if inp["dtype"] == np.int8:
                x = np.clip(np.round(x / s + z), -128, 127).astype(np.int8)
            it.set_tensor(inp["index"], x.astype(inp["dtype"]))
            it.invoke()
            o = it.get_tensor(probs_out["index"])[:n]
            if probs_out["dtype"] == np.int8:
                so, zo = probs_out["quantization"]
                o = (o.astype(np.float32) - zo) * so
            res.append(o)
        return np.concatenate(res)

    return predict


def onnx_predictor(path: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    probs_name = [o.name for o in sess.get_outputs() if o.shape[-1] != 64][0]
    del names

    def predict(feats):
        return np.concatenate([sess.run([probs_name], {"features": feats[a:a + 512].astype(np.float32)})[0]
                               for a in range(0, len(feats), 512)])

    return predict


def check_inputs(model_dir, out_dir, max_drop: float = 1.0) -> None:
    """One EdgelearnError, before TensorFlow loads, for a --model that is not a training output directory,
    an --out that is a file, or a --max-drop that is not a number of points >= 0."""
    from edge.errors import EdgelearnError

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    made_by = "pass the directory `edgelearn train --out DIR` wrote (it holds model.keras and frontend.json)"
    if not model_dir.exists():
        raise EdgelearnError(f"--model {model_dir} does not exist", fix=made_by)
    if not model_dir.is_dir():
        raise EdgelearnError(f"--model {model_dir} is a file, not a training output directory", fix=made_by)
    missing = [n for n in ("model.keras", "frontend.json") if not (model_dir / n).is_file()]
    if missing:
        raise EdgelearnError(f"--model {model_dir} has no {' or '.join(missing)}, so it is not a training "
                             "output directory", fix=made_by)
    if out_dir.exists() and not out_dir.is_dir():
        raise EdgelearnError(f"--out {out_dir} is a file", fix="pass a directory for the quantised models")
    if not 0 <= max_drop < float("inf"):
        raise EdgelearnError(f"--max-drop {max_drop} is not a number of accuracy points of 0 or more",
                             fix="pass e.g. --max-drop 1.0")


def quantize(model_dir, out_dir, max_drop: float = 1.0, corpus=None) -> dict:
    check_inputs(model_dir, out_dir, max_drop)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tensorflow import keras

    from edge.errors import EdgelearnError
    from host.data.corpus import build_corpus

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    try:
        model = keras.models.load_model(model_dir / "model.keras")
        scale = json.loads((model_dir / "frontend.json").read_text())["scale"]
    except (ValueError, KeyError, TypeError, OSError) as e:
        raise EdgelearnError(f"--model {model_dir}: model.keras or frontend.json cannot be read ({e})",
                             fix="train it again with `edgelearn train`") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus = corpus or build_corpus()
    calib = calibration_features(corpus, scale)
    scorer = Scorer(corpus, scale)
    fp32 = scorer.score(lambda f: model.predict(f, batch_size=1024, verbose=0)[1])
    metrics: dict = {"fp32": fp32, "fallback": {}}

    (out_dir / "encoder_fp32.tflite").write_bytes(to_tflite(model, None))
    tfl = to_tflite(model, calib)
    metrics["int8_tflite"] = scorer.score(tflite_predictor(tfl))
    deny: list[str] = []
    if fp32["test"] - metrics["int8_tflite"]["test"] > max_drop / 100:
        for name, _err in tflite_layer_errors(model, calib)[:4]:
            deny.append(name)
            tfl = to_tflite(model, calib, denylist=deny)
            metrics["int8_tflite"] = scorer.score(tflite_predictor(tfl))
            if fp32["test"] - metrics["int8_tflite"]["test"] <= max_drop / 100:
                break
    metrics["fallback"]["tflite"] = deny
    (out_dir / "encoder_int8.tflite").write_bytes(tfl)

    onnx_fp32 = to_onnx(model, out_dir / "encoder_fp32.onnx")
    onnx_int8 = quantize_onnx(onnx_fp32, out_dir / "encoder_int8.onnx", calib)
    metrics["int8_onnx"] = scorer.score(onnx_predictor(onnx_int8))
    excl: list[str] = []
    if fp32["test"] - metrics["int8_onnx"]["test"] > max_drop / 100:
        for name, _err in onnx_node_errors(onnx_fp32, onnx_int8, calib)[:4]:
            excl.append(name)
            quantize_onnx(onnx_fp32, onnx_int8, calib, exclude=excl)
            metrics["int8_onnx"] = scorer.score(onnx_predictor(onnx_int8))
            if fp32["test"] - metrics["int8_onnx"]["test"] <= max_drop / 100:
                break
    metrics["fallback"]["onnx"] = excl
    metrics["bytes"] = {p.name: p.stat().st_size for p in sorted(out_dir.glob("encoder_*"))}
    (out_dir / "quant_metrics.json").write_text(json.dumps(metrics, indent=1))
    return {"metrics": metrics}
