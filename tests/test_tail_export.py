"""host/tail_export.py on a small untrained DS-CNN: the int8 backbone, the float tail, and the int8
tail prefix (through dw4's ReLU) that an adapted context runs instead of the float depthwise layer."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    pytest.importorskip("tensorflow")
    from tensorflow import keras

    from host.model import build_dscnn
    from host.tail_export import export_tail

    keras.utils.set_random_seed(0)
    model = build_dscnn(6, channels=16)
    calib = np.random.default_rng(0).standard_normal((48, 49, 10, 1)).astype(np.float32)
    out = tmp_path_factory.mktemp("tail")
    return export_tail(model, calib, out), calib


def test_the_prefix_is_the_backbone_plus_dw4_in_int8(exported):
    from edge.backends import dequantize, load, quantize
    from host.tail_export import PREFIX_FILE, tail_forward

    files, calib = exported
    assert files["prefix"].name == PREFIX_FILE and files["max_abs_err_vs_keras"] < 1e-3
    bb, pre = load(files["backbone"]), load(files["prefix"])
    x = calib[:16]
    feat = dequantize(bb.invoke(quantize(x, bb.inputs[0]))[0], bb.outputs[0])
    y1 = dequantize(pre.invoke(quantize(x, pre.inputs[0]))[0], pre.outputs[0])
    assert y1.shape == feat.shape == (16, 25, 5, 16) and pre.outputs[0].dtype == np.int8
    # the float tail's dw4 + ReLU on the int8 backbone's output, against the prefix's int8 output
    with np.load(files["tail"]) as z:
        t = {k: z[k] for k in z.files}
    p = np.pad(feat, ((0, 0), (1, 1), (1, 1), (0, 0)))
    ref = sum(p[:, i:i + 25, j:j + 5] * t["dw4_w"][i, j] for i in range(3) for j in range(3))
    ref = np.maximum(ref + t["dw4_b"], 0.0)
    step = float(pre.outputs[0].scale)
    assert np.abs(y1 - ref).max() < 4 * step + 0.02 * np.abs(ref).max()
    assert np.corrcoef(y1.ravel(), ref.ravel())[0, 1] > 0.99
    # and the tail run from it ends where the tail run from the backbone does
    emb, _ = tail_forward(t, feat)
    assert emb.shape == (16, 16)
