"""Interpreter backends and bundle verification on a DS-CNN-S-shaped encoder.

Side by side in one run, on the same model and input: each ``edge.backends``
backend against the raw package API it wraps (so the interface's overhead is
visible), LiteRT batch 32 by resize against one-at-a-time, the TFLM arena
found by ``probe_arena_size`` against TFLM's own default (10x model bytes), and
``load_bundle`` (signature + every SHA-256) against bare hashlib over the same
files. The model has untrained weights: speed and memory do not depend on them.

    $ nice -n 10 .venv/bin/python -m bench.backends      # or: edgelearn bench backends
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.common import row, timeit, write_results


def build_models(out: Path) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from host.model import build_dscnn
    from host.quantize import quantize_onnx, to_onnx, to_tflite

    model = build_dscnn(num_classes=37)
    calib = np.random.default_rng(0).normal(size=(64, 49, 10, 1)).astype(np.float32)
    paths = {"int8.tflite": out / "enc_int8.tflite", "fp32.tflite": out / "enc_fp32.tflite",
             "fp32.onnx": out / "enc_fp32.onnx", "int8.onnx": out / "enc_int8.onnx"}
    paths["int8.tflite"].write_bytes(to_tflite(model, calib))
    paths["fp32.tflite"].write_bytes(to_tflite(model, None))
    to_onnx(model, paths["fp32.onnx"])
    quantize_onnx(paths["fp32.onnx"], paths["int8.onnx"], calib)
    return paths


def raw_litert(path: Path, x: np.ndarray):
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(path), num_threads=1)
    it.allocate_tensors()
    i, outs = it.get_input_details()[0]["index"], [d["index"] for d in it.get_output_details()]

    def call():
        it.set_tensor(i, x)
        it.invoke()
        return [it.get_tensor(o) for o in outs]
    return call


def raw_tflm(path: Path, x: np.ndarray, n_out: int):
    from tflite_micro.python.tflite_micro import runtime

    it = runtime.Interpreter.from_file(str(path), arena_size=1 << 20)

    def call():
        it.set_input(x, 0)
        it.invoke()
        return [it.get_output(k) for k in range(n_out)]
    return call


def raw_ort(path: Path, x: np.ndarray):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 1, 1
    sess = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return lambda: sess.run(None, {name: x})


def main() -> int:
    from edge.backends import load, quantize
    from edge.backends.tflite_micro import probe_arena_size
    from edge.bundle import load_bundle
    from host.bundle import build_bundle
    from host.keys import generate_keypair

    rows = []
    with tempfile.TemporaryDirectory(prefix="edgelearn-bench-") as tmp:
        tmp = Path(tmp)
        print("building DS-CNN-S (untrained) as int8/fp32 TFLite and ONNX ...", file=sys.stderr)
        paths = build_models(tmp)
        xf = np.random.default_rng(1).normal(size=(1, 49, 10, 1)).astype(np.float32)
        cases = [("litert int8", "int8.tflite", "litert"), ("tflite_micro int8", "int8.tflite", "tflite_micro"),
                 ("litert fp32", "fp32.tflite", "litert"), ("onnxruntime int8 QDQ", "int8.onnx", "onnxruntime"),
                 ("onnxruntime fp32", "fp32.onnx", "onnxruntime")]
        for label, key, backend in cases:
            m = load(paths[key], backend=backend, num_threads=1)
            x = quantize(xf, m.inputs[0]) if m.inputs[0].quantized else xf
            ours = timeit(lambda: m.invoke(x), repeat=5, number=50)
            ref = {"litert": lambda: raw_litert(paths[key], x), "onnxruntime": lambda: raw_ort(paths[key], x),
                   "tflite_micro": lambda: raw_tflm(paths[key], x, len(m.outputs))}[backend]()
            base = timeit(ref, repeat=5, number=50)
            rows.append(row(f"backend {label}", "latency per 1 s window, batch 1, 1 thread", ours * 1e3, "ms",
                            f"raw {backend} API", base * 1e3, model_bytes=paths[key].stat().st_size))
        lit = load(paths["int8.tflite"])
        xb = quantize(np.random.default_rng(2).normal(size=(32, 49, 10, 1)), lit.inputs[0])
        batched = timeit(lambda: lit.invoke(xb), repeat=5, number=5) / 32
        looped = timeit(lambda: [lit.invoke(xb[i:i + 1]) for i in range(32)], repeat=5, number=5) / 32
        rows.append(row("litert int8 batch 32 (resize)", "latency per window", batched * 1e3, "ms",
                        "32 single invokes", looped * 1e3))
        size = paths["int8.tflite"].stat().st_size
        arena = probe_arena_size(paths["int8.tflite"])
        rows.append(row("tflite_micro arena (probed)", "tensor arena", arena, "bytes",
                        "tflite-micro default (10x model bytes)", 10 * size))
        priv, pub = generate_keypair(tmp / "keys")
        files = {p.name: p for p in paths.values()}
        manifest = {"model_id": "bench", "version": 1, "labels": ["a"], "partitions": [
            {"name": "encoder", "file": "enc_int8.tflite", "format": "tflite", "placement": "cpu"}]}
        bdir = build_bundle(tmp / "bundle", files, manifest, priv)
        total = sum(p.stat().st_size for p in paths.values())
        verify = timeit(lambda: load_bundle(bdir, trusted_keys=pub), repeat=5, number=20)
        bare = timeit(lambda: [hashlib.sha256((bdir / n).read_bytes()).hexdigest() for n in files], repeat=5, number=20)
        rows.append(row("load_bundle (Ed25519 + SHA-256 of all files)", "time to verify", verify * 1e3, "ms",
                        "bare hashlib SHA-256 of the same files", bare * 1e3, bundle_bytes=total))
    write_results("backends", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
