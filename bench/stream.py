"""CPU time per second of streamed audio on one thread: streaming detector vs recomputing each window.

Ours: ``edge.detect.Detector`` (one MFCC frame per hop, int8 encoder every 4 hops).
Reference: the naive stream, recomputing the full 1 s MFCC for each encoder run.
Also the adapted path (an active adapted context, ``edge.adapt.TailModel``), against the plain int8
encoder: a context that keeps the base's dw4 (bias-only as ``device adapt`` runs it, LoRA) runs the
bundle's int8 tail prefix through dw4 and numpy from pw4 on; one that trains dw4 runs the int8
backbone and the float depthwise layer in numpy.

    $ edgelearn bench stream
"""

from __future__ import annotations

import time

import numpy as np

from bench.common import row, write_results


def main():
    from edge import features as F
    from edge.bundle import load_bundle
    from edge.detect import Detector
    from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys

    km = KeywordModel(load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys()), num_threads=1)
    rng = np.random.default_rng(0)
    secs = 60
    pcm = (rng.standard_normal(16000 * secs) * 2000).astype(np.int16)
    det = Detector(km, stride=4)
    t = time.process_time()
    for i in range(0, len(pcm), 1600):
        det.push(pcm[i : i + 1600])
    ours = (time.process_time() - t) / secs * 1e3
    t = time.process_time()
    n = 0
    for end in range(16000, len(pcm), 4 * 320):
        km.infer(F.normalize(F.mfcc(pcm[end - 16000 : end]), km.scale)[None])
        n += 1
    naive = (time.process_time() - t) / secs * 1e3
    per_window = ours / (det.invocations / secs)
    from edge.adapt import TailModel

    def adapted_ms(delta):
        adapted = Detector(TailModel(km.bundle, delta, num_threads=1), stride=4)
        t = time.process_time()
        for i in range(0, len(pcm), 1600):
            adapted.push(pcm[i : i + 1600])
        return (time.process_time() - t) / secs * 1e3

    ours_adapted = adapted_ms({})
    dw4 = TailModel(km.bundle, {}).tail.p("dw4_b")
    float_dw4 = adapted_ms({"dw4_b": dw4.copy()})
    rows = [row("stream", "CPU per 1 s of streamed audio (stride 4 hops, 1 thread)", round(ours, 3), "ms",
                "recompute 1 s MFCC per run", round(naive, 3)),
            row("stream", "CPU per encoder window incl. its features", round(per_window, 4), "ms",
                "recompute 1 s MFCC per run", round(naive / (n / secs), 4)),
            row("stream", "CPU per 1 s of streamed audio, adapted context keeping dw4 (int8 through dw4 + float "
                "pw4 and classifier)", round(ours_adapted, 3), "ms", "int8 encoder (no adapted context)",
                round(ours, 3)),
            row("stream", "CPU per 1 s of streamed audio, adapted context training dw4 (int8 backbone + float dw4, "
                "pw4 and classifier)", round(float_dw4, 3), "ms", "int8 encoder (no adapted context)", round(ours, 3))]
    write_results("stream", rows)
    return rows


if __name__ == "__main__":
    main()
