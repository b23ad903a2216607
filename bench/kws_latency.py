"""Features + encoder per 1 s window on one thread: int8 LiteRT vs fp32 LiteRT vs int8 ONNX Runtime.

Same audio, same run, the shipped bundle's three encoder files. The "interpreter
invoke only" rows time ``Interpreter.invoke()`` on an input already set, so they
show the kernels alone: what int8 gains there, and what quantising the input and
reading the outputs in Python take back, on a model of 2.7 M MACs.

    $ edgelearn bench kws_latency
"""

from __future__ import annotations

import numpy as np

from bench.common import row, timeit, write_results


def main():
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys

    bundle = load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys())
    x = (np.random.default_rng(0).standard_normal(16000) * 2000).astype(np.int16)
    cases = {
        "int8 LiteRT": KeywordModel(bundle, backend="litert", precision="int8"),
        "fp32 LiteRT": KeywordModel(bundle, backend="litert", precision="float32"),
        "int8 ONNX Runtime": KeywordModel(bundle, backend="onnxruntime", precision="int8"),
    }
    feats = cases["int8 LiteRT"].features(x)[None]
    t = {}
    for name, km in cases.items():
        t[name] = timeit(lambda km=km: km.infer(km.features(x)[None]), number=200)
        t[name + " (encoder only)"] = timeit(lambda km=km: km.infer(feats), number=200)
    t_feat = timeit(lambda: cases["int8 LiteRT"].features(x), number=200)
    for name in ("int8 LiteRT", "fp32 LiteRT"):
        it = cases[name].backend._it  # the ai-edge-litert Interpreter, input already set by infer()
        t[name + " (invoke only)"] = timeit(it.invoke, number=2000)
    rows = [row("kws_latency", "features+encoder per 1 s window, int8 LiteRT", t["int8 LiteRT"] * 1e3, "ms",
                "fp32 LiteRT", t["fp32 LiteRT"] * 1e3),
            row("kws_latency", "features+encoder per 1 s window, int8 LiteRT", t["int8 LiteRT"] * 1e3, "ms",
                "int8 ONNX Runtime", t["int8 ONNX Runtime"] * 1e3),
            row("kws_latency", "encoder only, int8 LiteRT", t["int8 LiteRT (encoder only)"] * 1e3, "ms",
                "fp32 LiteRT encoder only", t["fp32 LiteRT (encoder only)"] * 1e3),
            row("kws_latency", "encoder only, int8 ONNX Runtime", t["int8 ONNX Runtime (encoder only)"] * 1e3,
                "ms", "fp32 LiteRT encoder only", t["fp32 LiteRT (encoder only)"] * 1e3),
            row("kws_latency", "interpreter invoke only, int8 LiteRT", t["int8 LiteRT (invoke only)"] * 1e3, "ms",
                "fp32 LiteRT invoke only", t["fp32 LiteRT (invoke only)"] * 1e3),
            row("kws_latency", "features only (numpy)", t_feat * 1e3, "ms", None, None)]
    write_results("kws_latency", rows)


if __name__ == "__main__":
    main()
