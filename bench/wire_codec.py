"""Update wire codec: bytes per codec and encode/decode speed, portable vs numpy, same frames.

A 10k-parameter update (three tensors, like a small DS-CNN's trainable part)
is encoded with each codec; the portable codec (``edge.portable.wire`` on
CPython) and the numpy twin (``host.wire_numpy``) run on the same input in the
same process and produce the same bytes (checked here too). Also reported:
the compression ratio against dense float32, and the portable encoder on the
MicroPython unix port when it is installed.

    $ edgelearn bench wire_codec        # or: python -m bench.wire_codec
"""

from __future__ import annotations

import array
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from bench.common import row, timeit, write_results

KEY = b"bench-device-key-0123456789abcdef"
ROOT = Path(__file__).resolve().parents[1]


def _tensors():
    rng = np.random.default_rng(0)
    return [("ds/w", (80, 100), rng.normal(0, 0.02, 8000).astype(np.float32)),
            ("pw/w", (18, 100), rng.normal(0, 0.05, 1800).astype(np.float32)),
            ("head/bias", (200,), rng.normal(0, 0.01, 200).astype(np.float32))]


def _micropython_encode_ms() -> float | None:
    exe = Path(sys.executable).with_name("micropython")
    if not exe.exists():
        return None
    code = """
import array, time
from edge.portable import wire as w
v = array.array('f', range(10000))
for i in range(10000): v[i] = ((i * 7919) % 2001 - 1000) / 50000.0
hdr = w.Header('esp32-07', 1, 1, 1)
buf = bytearray(10400)
w.encode_update_into(buf, hdr, [('w', (10000,), v)], KEY, codec=w.INT8)
t = time.ticks_us()
for _ in range(5): w.encode_update_into(buf, hdr, [('w', (10000,), v)], KEY, codec=w.INT8)
print('us', time.ticks_diff(time.ticks_us(), t) / 5)
"""
    res = subprocess.run([str(exe), "-X", "heapsize=2m", "-c", "KEY = %r\n" % KEY + code],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    m = re.search(r"us ([\d.]+)", res.stdout)
    return float(m.group(1)) / 1000 if m else None


def main():
    from edge.portable import wire as pw
    from host import wire_numpy as nw

    tensors = _tensors()
    portable_in = [(n, s, array.array("f", v)) for n, s, v in tensors]
    hdr = pw.Header("pi-kitchen.01", 3, 2, 17, num_examples=40, meta={"loss": 0.31})
    cases = [("dense_f32", pw.DENSE_F32, None), ("int8", pw.INT8, None),
             ("topk_1pct", pw.TOPK_INT8, 0.01), ("topk_10pct", pw.TOPK_INT8, 0.10),
             ("bias_only_int8", pw.INT8, "subset")]
    rows, dense_bytes = [], None
    for label, codec, opt in cases:
        only = ["head/bias"] if opt == "subset" else None
        frac = opt if isinstance(opt, float) else 0.01

        def enc_p():
            return pw.encode_update(hdr, portable_in, KEY, codec=codec, only=only,
                                    topk=pw.TopKEncoder(frac), seed=1)

        def enc_n():
            return nw.encode_update(hdr, tensors, KEY, codec=codec, only=only,
                                    topk=nw.TopKEncoder(frac), seed=1)

        frame = enc_n()
        assert frame == enc_p(), label
        dense_bytes = dense_bytes or len(frame)
        t_enc_p, t_enc_n = timeit(enc_p, repeat=3, number=3), timeit(enc_n, repeat=5, number=20)
        t_dec_p = timeit(lambda: pw.decode_update(frame, KEY), repeat=3, number=3)
        t_dec_n = timeit(lambda: nw.decode_update(frame, KEY), repeat=5, number=50)
        rows += [
            row("wire_codec", f"{label}: frame size (10k params)", len(frame), "bytes",
                "dense float32 frame", dense_bytes),
            row("wire_codec", f"{label}: encode, numpy twin", t_enc_n * 1e3, "ms",
                "portable codec on CPython", t_enc_p * 1e3),
            row("wire_codec", f"{label}: decode, numpy twin", t_dec_n * 1e3, "ms",
                "portable codec on CPython", t_dec_p * 1e3),
            row("wire_codec", f"{label}: decode throughput, numpy twin", 1.0 / t_dec_n, "frames/s",
                "portable codec on CPython", 1.0 / t_dec_p, ratio=t_dec_p / t_dec_n),
        ]
    mp_ms = _micropython_encode_ms()
    if mp_ms is not None:
        flat = [("w", (10000,), array.array("f", np.concatenate([v for _, _, v in tensors])))]
        t = timeit(lambda: pw.encode_update(hdr, flat, KEY), repeat=3, number=3)
        rows.append(row("wire_codec", "int8 encode, portable codec on MicroPython unix port", mp_ms,
                        "ms", "portable codec on CPython", t * 1e3))
    write_results("wire_codec", rows)
    return rows


if __name__ == "__main__":
    main()
