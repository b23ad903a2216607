"""The ESPHome export's model as micro_wake_word runs it: the trained Keras model turned into a
streaming int8 TFLite model (``streaming_module``, ``convert``: each layer's past frames in resource
variables, one stride of features in, one uint8 probability out), and the checks that it is in
micro_wake_word's format (``tflite_info``, ``check_format``) and runs under TFLite Micro within its
arena (``run_tflm``, ``arena_for``). The recipe that calls them is ``host/export/esphome.py``.
"""

from __future__ import annotations

import numpy as np

from host.export import frontend as FE
from host.export.esphome_config import CHANNELS, DW_K, IN_SCALE, K1, MWW_OPS, N_BLOCKS, STREAMING_OPS, STRIDE


def _folded_weights(model) -> dict:
    g = {l.name: l.get_weights() for l in model.layers if l.get_weights()}
    w1, b1 = g["conv1"]
    return {"w1": (w1 * IN_SCALE).astype(np.float32), "b1": b1,
            "dw": [g[f"dw{i}"] for i in range(N_BLOCKS)], "pw": [g[f"pw{i}"] for i in range(N_BLOCKS)],
            "head": g["head"]}


def streaming_module(model):
    """A tf.Module whose __call__ takes one stride [1, STRIDE, 40] of features and keeps every
    layer's past frames in variables: the model micro_wake_word runs."""
    import tensorflow as tf

    wts = _folded_weights(model)

    class Streaming(tf.Module):
        def __init__(self):
            super().__init__(name="edgelearn_streaming")
            self.s_in = tf.Variable(tf.zeros([1, K1 - STRIDE, 1, FE.CHANNELS]), trainable=False, name="state_in")
            self.s = [tf.Variable(tf.zeros([1, DW_K - 1, 1, CHANNELS]), trainable=False, name=f"state_{i}")
                      for i in range(N_BLOCKS)]
            self.w1 = tf.constant(wts["w1"])
            self.b1 = tf.constant(wts["b1"])
            self.dw = [(tf.constant(k), tf.constant(b)) for k, b in wts["dw"]]
            self.pw = [(tf.constant(k), tf.constant(b)) for k, b in wts["pw"]]
            self.hw, self.hb = tf.constant(wts["head"][0]), tf.constant(wts["head"][1])

        @tf.function(input_signature=[tf.TensorSpec([1, STRIDE, FE.CHANNELS], tf.float32, name="features")])
        def __call__(self, x):
            x = tf.reshape(x, [1, STRIDE, 1, FE.CHANNELS])
            buf = tf.concat([self.s_in, x], axis=1)
            self.s_in.assign(buf[:, STRIDE:])
            y = tf.nn.relu(tf.nn.conv2d(buf, self.w1, strides=[1, STRIDE, 1, 1], padding="VALID") + self.b1)
            for state, (dk, db), (pk, pb) in zip(self.s, self.dw, self.pw):
                buf = tf.concat([state, y], axis=1)
                state.assign(buf[:, 1:])
                y = tf.nn.depthwise_conv2d(buf, dk, strides=[1, 1, 1, 1], padding="VALID") + db
                y = tf.nn.relu(tf.nn.conv2d(y, pk, strides=[1, 1, 1, 1], padding="VALID") + pb)
            y = tf.reshape(y, [1, CHANNELS])
            return tf.sigmoid(tf.matmul(y, self.hw) + self.hb)

        def reset(self):
            self.s_in.assign(tf.zeros_like(self.s_in))
            for s in self.s:
                s.assign(tf.zeros_like(s))

    return Streaming()


def convert(model, calib_feats: list[np.ndarray]) -> bytes:
    """Full-integer TFLite of the streaming model: int8 input, uint8 output, resource variables.

    ``calib_feats``: feature sequences (frames, 40) streamed stride by stride through the model for
    calibration. One calibration row spans the front end's whole range [0, 26], so the input
    quantisation is exactly ESPHome's (scale 26/255, zero point -128; checked)."""
    import tensorflow as tf

    module = streaming_module(model)

    def rep():
        edge = np.zeros((1, STRIDE, FE.CHANNELS), np.float32)
        edge[0, 0, 0], edge[0, 1, 1] = FE.FEATURE_MAX, 0.0
        yield [edge]
        for f in calib_feats:   # the calibrator's interpreter carries the variables from row to row
            f = np.clip(np.asarray(f, np.float32), 0.0, FE.FEATURE_MAX)
            for k in range(len(f) // STRIDE):
                yield [f[None, k * STRIDE:(k + 1) * STRIDE]]

    fn = module.__call__.get_concrete_function()
    conv = tf.lite.TFLiteConverter.from_concrete_functions([fn], module)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = rep
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = tf.int8
    conv.inference_output_type = tf.uint8
    conv.experimental_enable_resource_variables = True
    conv._experimental_variable_quantization = True   # int8 state, as microWakeWord converts (no DEQUANTIZE)
    data = conv.convert()
    info = tflite_info(data)
    scale, zp = info["input_quantization"]
    if info["input_dtype"] != "int8" or zp != FE.INPUT_ZERO_POINT or abs(scale - FE.INPUT_SCALE) > 1e-6:
        raise RuntimeError(f"converted input quantisation {info['input_quantization']} is not ESPHome's "
                           f"({FE.INPUT_SCALE}, {FE.INPUT_ZERO_POINT})")
    return data


# ----------------------------------------------------------------------------- checks

def tflite_info(data: bytes) -> dict:
    """Ops, input/output shapes, dtypes and quantisation of a .tflite (TensorFlow's interpreter)."""
    import tensorflow as tf

    it = tf.lite.Interpreter(model_content=data)
    i, o = it.get_input_details()[0], it.get_output_details()[0]
    return {"ops": sorted({d["op_name"] for d in it._get_ops_details()}),
            "input_shape": [int(v) for v in i["shape"]], "input_dtype": np.dtype(i["dtype"]).name,
            "input_quantization": (float(i["quantization"][0]), int(i["quantization"][1])),
            "output_shape": [int(v) for v in o["shape"]], "output_dtype": np.dtype(o["dtype"]).name,
            "output_quantization": (float(o["quantization"][0]), int(o["quantization"][1]))}


def check_format(data: bytes) -> dict:
    """Raise if the model is not in micro_wake_word's format; return its tflite_info."""
    info = tflite_info(data)
    problems = []
    if info["input_dtype"] != "int8" or len(info["input_shape"]) != 3 or info["input_shape"][0] != 1 \
            or info["input_shape"][2] != FE.CHANNELS:
        problems.append(f"input {info['input_dtype']} {info['input_shape']} (wanted int8 [1, stride, 40])")
    if info["output_dtype"] != "uint8" or info["output_shape"] != [1, 1]:
        problems.append(f"output {info['output_dtype']} {info['output_shape']} (wanted uint8 [1, 1])")
    extra = sorted(set(info["ops"]) - MWW_OPS)
    if extra:
        problems.append(f"ops micro_wake_word does not register: {', '.join(extra)}")
    if not STREAMING_OPS <= set(info["ops"]):
        problems.append("no streaming state in resource variables")
    if problems:
        raise RuntimeError("not a micro_wake_word model: " + "; ".join(problems))
    return info


def run_tflm(path, feats: np.ndarray, arena_size: int) -> np.ndarray:
    """Stream features through the model under TFLite Micro in an arena of ``arena_size`` bytes:
    uint8 output per stride."""
    from tflite_micro.python.tflite_micro import runtime

    it = runtime.Interpreter.from_file(str(path), arena_size=int(arena_size))
    q = FE.quantize(feats)
    out = []
    for k in range(len(q) // STRIDE):
        it.set_input(q[None, k * STRIDE:(k + 1) * STRIDE], 0)
        it.invoke()
        out.append(int(np.asarray(it.get_output(0)).reshape(-1)[0]))
    return np.asarray(out, np.uint8)


def arena_for(path) -> tuple[int, int]:
    """(smallest arena TFLite Micro runs it in, the manifest's tensor_arena_size: that + 10 %, to 16 B)."""
    from edge.backends.tflite_micro import probe_arena_size

    need = probe_arena_size(path)
    return need, int(-(-need * 1.1 // 16) * 16)
