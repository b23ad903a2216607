"""MCU pipeline cost per second of audio: operations, bytes, unix-port timings, ESP32 latency estimate.

Counts (exact, from the code's loops and the model graph): MFCC per frame
(256-point complex FFT = 8 x 128 butterflies, real-split pass, sparse mel,
DCT) times 50 frames/s; model MACs per inference times 2 inferences/s (live
detection every 0.5 s). Bytes: int8 weights, int32 biases, activations, the
front end's tables and buffers. Timings are measured on the MicroPython unix
port (this machine). The ESP32 estimate divides the operation counts by the
esp32 profile's ``macs_per_s`` (host/profiles/esp32.toml: 0.4 M int8 MAC/s
of pure-bytecode inner loops at 240 MHz), *assuming a float multiply-add in
the MFCC loops costs what an int8 MAC costs* (both are dominated by bytecode
dispatch; ESP32 MicroPython floats are single precision and unboxed up to
30 bits, so this is if anything pessimistic for the MFCC). Baseline: the
shipped DS-CNN-S on the same pure-Python kernels.

    $ edgelearn bench mcu_ops
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import row, write_results  # noqa: E402

MCU = ROOT / "models" / "kws-mcu-tcnn"
DSCNN = ROOT / "models" / "kws-dscnn-s" / "encoder_int8.tflite"
INFER_PER_S = 2
FRAMES_PER_S = 50

TIMING = """
import array, time, gc
from edge.portable.mfcc import Mfcc, FeatureRing
from edge.portable.model import McuModel
m = McuModel(%r, %r)
f = Mfcc()
pcm = array.array('h', bytes(960))
for i in range(480):
    pcm[i] = (i * 37) %% 2000 - 1000
out = array.array('f', bytes(40))
t = time.ticks_us()
for _ in range(20):
    f.frame_into(pcm, 0, out, 0)
mf = time.ticks_diff(time.ticks_us(), t) / 20
t = time.ticks_us()
for _ in range(3):
    m.invoke()
inf = time.ticks_diff(time.ticks_us(), t) / 3
print(mf, inf)
"""


def mfcc_ops_per_frame() -> dict:
    from edge.portable.mfcc import tables
    t = tables()
    fft = 8 * 128 * 4          # 4 real multiply-adds per radix-2 butterfly
    split = 257 * 6            # real-split pass + power
    mel = len(t.mel_w)         # sparse triangles: one multiply-add per nonzero weight
    dct = 40 * 10
    window = 480
    return {"fft": fft, "split": split, "mel": mel, "dct": dct, "window": window, "log": 40,
            "total": fft + split + mel + dct + window}


def main() -> list[dict]:
    from host.partition.graph import load_graph
    prof = tomllib.loads((ROOT / "host" / "profiles" / "esp32.toml").read_text())
    mac_s = prof["compute"]["cpu"]["macs_per_s"]
    g = load_graph(MCU / "mcu_int8.tflite")
    base = load_graph(DSCNN)
    ops = mfcc_ops_per_frame()
    spec = json.loads((MCU / "graph.json").read_text())
    act_bytes = sum(_count(op["out_shape"]) for op in spec["ops"] if op["op"] != "RESHAPE") + 490
    rows = [
        row("mcu_ops", "model_macs_per_inference", g.total_macs, "MAC", "kws-dscnn-s", base.total_macs),
        row("mcu_ops", "model_macs_per_s_audio", g.total_macs * INFER_PER_S, "MAC/s", "kws-dscnn-s",
            base.total_macs * INFER_PER_S, assumption=f"{INFER_PER_S} inferences per second (0.5 s hop)"),
        row("mcu_ops", "mfcc_ops_per_s_audio", ops["total"] * FRAMES_PER_S, "mul-add/s", breakdown=ops),
        row("mcu_ops", "weight_bytes", g.weight_bytes, "B", "kws-dscnn-s", base.weight_bytes),
        row("mcu_ops", "blob_bytes", (MCU / "weights.elb").stat().st_size, "B"),
        row("mcu_ops", "activation_bytes", act_bytes, "B"),
        row("mcu_ops", "esp32_model_latency_est", 1000 * g.total_macs / mac_s, "ms", "kws-dscnn-s",
            1000 * base.total_macs / mac_s, assumption=f"{mac_s:.0f} int8 MAC/s (esp32 profile)"),
        row("mcu_ops", "esp32_frontend_load_est", ops["total"] * FRAMES_PER_S / mac_s, "s per s of audio",
            assumption="float mul-add costs one int8 MAC; with ulab's FFT the fft+split share drops out"),
    ]
    exe = Path(sys.executable).with_name("micropython")
    if exe.exists():
        res = subprocess.run([str(exe), "-X", "heapsize=1m", "-c",
                              TIMING % (str(MCU / "weights.elb"), str(MCU / "graph.json"))],
                             capture_output=True, text=True, cwd=ROOT, env={"MICROPYPATH": str(ROOT)}, timeout=300)
        if res.returncode == 0:
            mf, inf = (float(v) for v in res.stdout.split())
            rows += [row("mcu_ops", "unixport_mfcc_frame", mf / 1000, "ms"),
                     row("mcu_ops", "unixport_inference", inf / 1000, "ms"),
                     row("mcu_ops", "unixport_realtime_load", (mf * FRAMES_PER_S + inf * INFER_PER_S) / 1e6,
                         "s per s of audio")]
        else:
            print(f"unix-port timing failed: {res.stderr.strip()[-300:]}")
    write_results("mcu_ops", rows)
    return rows


def _count(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


if __name__ == "__main__":
    main()
