"""The DS-CNN keyword encoder (Keras), in the "Hello Edge" DS-CNN-S shape.

Input: normalised MFCC ``(49, 10, 1)``. A 10x4 stride-2 convolution, then four
depthwise-separable blocks of 64 channels, global average pooling to the 64-d
embedding, and a dense classifier over the 37 labels. Two outputs, named
``embedding`` and ``probs``, so the device gets both from one invocation.

    >>> model = build_dscnn(num_classes=37)        # ~24 k parameters
"""

from __future__ import annotations


def build_dscnn(num_classes: int, channels: int = 64, blocks: int = 4,
                input_shape=(49, 10, 1), dropout: float = 0.1, name: str = "dscnn_s"):
    import tensorflow as tf
    from tensorflow import keras
    from tensorflow.keras import layers as L

    inp = keras.Input(shape=input_shape, name="features")
    x = L.Conv2D(channels, (10, 4), strides=(2, 2), padding="same", use_bias=False,
                 name="conv0")(inp)
    x = L.BatchNormalization(name="conv0_bn")(x)
    x = L.ReLU(name="conv0_relu")(x)
    for i in range(1, blocks + 1):
        x = L.DepthwiseConv2D((3, 3), padding="same", use_bias=False, name=f"dw{i}")(x)
        x = L.BatchNormalization(name=f"dw{i}_bn")(x)
        x = L.ReLU(name=f"dw{i}_relu")(x)
        x = L.Conv2D(channels, (1, 1), use_bias=False, name=f"pw{i}")(x)
        x = L.BatchNormalization(name=f"pw{i}_bn")(x)
        x = L.ReLU(name=f"pw{i}_relu")(x)
    emb = L.GlobalAveragePooling2D(name="embedding")(x)
    h = L.Dropout(dropout, name="dropout")(emb)
    logits = L.Dense(num_classes, name="classifier")(h)
    probs = L.Softmax(name="probs")(logits)
    model = keras.Model(inp, [emb, probs], name=name)
    del tf
    return model


def count_macs(model) -> int:
    """Multiply-accumulates of one inference (convolutions and dense layers)."""
    total = 0
    for layer in model.layers:
        cls = type(layer).__name__
        if cls in ("Conv2D", "DepthwiseConv2D"):
            out = layer.output.shape
            k = layer.kernel_size[0] * layer.kernel_size[1]
            cin = layer.input.shape[-1]
            per = k * (cin if cls == "Conv2D" else 1)
            total += out[1] * out[2] * out[3] * per
        elif cls == "Dense":
            total += layer.input.shape[-1] * layer.units
    return int(total)
