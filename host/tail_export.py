"""Cut the encoder for on-device training: an int8 backbone plus a float tail the device trains.

The backbone is the network up to the last depthwise-separable block (output:
the 25x5x64 feature map after ``pw3_relu``), converted to full-int8 TFLite.
The tail prefix is the same network one layer further (through ``dw4_relu``), also
int8: a device whose adapted tail keeps the base's dw4 runs it instead of the
backbone plus a float depthwise layer in numpy (docs/edge-runtime.md).
The tail — depthwise 3x3 (``dw4``), pointwise 1x1 (``pw4``), average pooling
and the classifier — is written as float32 numpy arrays with batch norm folded
in, so a device (edge/adapt) can run bias-only, adapter, LoRA, sparse or full
updates on it without TensorFlow. ``tail_forward`` is the numpy reference.

    >>> files = export_tail(model, calib, out_dir)   # backbone_int8.tflite, tail.npz, PREFIX_FILE
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CUT_LAYER = "pw3_relu"
PREFIX_LAYER = "dw4_relu"
PREFIX_FILE = "backbone_dw4_int8.tflite"


def _fold(layer, bn):
    """Weights and bias of a bias-free conv followed by batch norm, folded together."""
    gamma, beta, mean, var = bn.get_weights()
    s = gamma / np.sqrt(var + bn.epsilon)
    w = layer.get_weights()[0]
    return (w * s.reshape((1,) * (w.ndim - 1) + (-1,)) if type(layer).__name__ == "Conv2D"
            else w * s.reshape(1, 1, -1, 1)), beta - mean * s


def tail_arrays(model) -> dict:
    dw_w, dw_b = _fold(model.get_layer("dw4"), model.get_layer("dw4_bn"))
    pw_w, pw_b = _fold(model.get_layer("pw4"), model.get_layer("pw4_bn"))
    cls_w, cls_b = model.get_layer("classifier").get_weights()
    return {"dw4_w": dw_w[:, :, :, 0].astype(np.float32), "dw4_b": dw_b.astype(np.float32),
            "pw4_w": pw_w[0, 0].astype(np.float32), "pw4_b": pw_b.astype(np.float32),
            "cls_w": cls_w.astype(np.float32), "cls_b": cls_b.astype(np.float32)}


def tail_forward(t: dict, x: np.ndarray):
    """(N, 25, 5, 64) backbone output -> (embedding (N, 64), probs (N, classes)), float32."""
    n, h, w, c = x.shape
    p = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    y = np.zeros_like(x)
    for i in range(3):
        for j in range(3):
            y += p[:, i:i + h, j:j + w, :] * t["dw4_w"][i, j]
    y = np.maximum(y + t["dw4_b"], 0.0)
    z = np.maximum(y @ t["pw4_w"] + t["pw4_b"], 0.0)
    emb = z.mean(axis=(1, 2))
    logits = emb @ t["cls_w"] + t["cls_b"]
    e = np.exp(logits - logits.max(1, keepdims=True))
    return emb.astype(np.float32), (e / e.sum(1, keepdims=True)).astype(np.float32)


def export_tail(model, calib: np.ndarray, out_dir) -> dict:
    from tensorflow import keras

    from host.quantize import to_tflite

    out_dir = Path(out_dir)
    backbone = keras.Model(model.input, model.get_layer(CUT_LAYER).output, name="backbone")
    (out_dir / "backbone_int8.tflite").write_bytes(to_tflite(backbone, calib))
    arrays = tail_arrays(model)
    np.savez(out_dir / "tail.npz", **arrays)
    # The folded numpy tail must reproduce Keras on the float backbone output.
    feats = backbone.predict(calib[:64], verbose=0)
    _, probs = tail_forward(arrays, feats)
    ref = model.predict(calib[:64], verbose=0)[1]
    err = float(np.abs(probs - ref).max())
    if err > 1e-3:
        raise RuntimeError(f"folded tail differs from Keras by {err}")
    return {"backbone": out_dir / "backbone_int8.tflite", "tail": out_dir / "tail.npz",
            "prefix": export_prefix(model, calib, out_dir), "max_abs_err_vs_keras": err}


def export_prefix(model, calib: np.ndarray, out_dir) -> Path:
    """The int8 network through ``PREFIX_LAYER`` (the backbone plus dw4 and its ReLU) as
    ``PREFIX_FILE``, calibrated on the same clips as the backbone."""
    from tensorflow import keras

    from host.quantize import to_tflite

    from edge.atomic import atomic_write

    path = Path(out_dir) / PREFIX_FILE
    prefix = keras.Model(model.input, model.get_layer(PREFIX_LAYER).output, name="tail_prefix")
    atomic_write(path, to_tflite(prefix, calib))  # `--reuse` trusts a file that exists: never a half one
    return path
