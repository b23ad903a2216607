"""12-class accuracy of the shipped encoders on the speaker-disjoint splits: fp32 vs int8 TFLite vs int8 ONNX.

Plain accuracy on the splits' natural mix (about 80 % ``_unknown_``), the class-balanced figure (the
Speech Commands protocol's mix: mean recall over the 12 classes) and command recall.

All three are the bundle's own files run by their real interpreters (LiteRT,
ONNX Runtime) on the same fixed clips of the synthetic corpus (rendered, or
loaded from the cache).

    $ edgelearn bench quant_accuracy
"""

from __future__ import annotations

from bench.common import row, write_results


def main():
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys
    from host.data.corpus import build_corpus
    from host.evaluate import accuracy12, balanced12, command_recall

    bundle = load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys())
    models = {"fp32 TFLite": KeywordModel(bundle, "litert", precision="float32"),
              "int8 TFLite": KeywordModel(bundle, "litert", precision="int8"),
              "int8 ONNX": KeywordModel(bundle, "onnxruntime", precision="int8")}
    corpus = build_corpus()
    rows = []
    for split in ("val", "test", "unseen"):
        x, y, _ = corpus.eval_clips(split)
        feats = models["fp32 TFLite"].features(x)
        probs = {n: km.infer(feats)[1] for n, km in models.items()}
        for label, fn in (("12-class accuracy", accuracy12), ("class-balanced 12-class accuracy", balanced12),
                          ("command recall", command_recall)):
            acc = {n: fn(p, y) for n, p in probs.items()}
            for n in ("int8 TFLite", "int8 ONNX"):
                rows.append(row("quant_accuracy", f"{label}, {split} split, {n}", acc[n], "fraction",
                                f"fp32 TFLite, {split}", acc["fp32 TFLite"], ratio=acc[n] / acc["fp32 TFLite"],
                                drop_points=round(100 * (acc["fp32 TFLite"] - acc[n]), 2), clips=int(len(y))))
    write_results("quant_accuracy", rows)


if __name__ == "__main__":
    main()
