"""The partitioner's numbers against the real tools, side by side on the same models:
predicted arena vs TFLite Micro's RecordingMicroAllocator, MACs vs Arm Vela,
bias-only vs full tail training memory, and ``report`` wall time vs getting the
same numbers from the real tools (TFLM probe + Vela compile).

Models: the shipped ``models/kws-dscnn-s/encoder_int8.tflite`` when present, plus
four DS-CNN shapes built with the project's own converter (random weights).

    $ edgelearn bench partition_accuracy
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import row, write_results

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "models" / "kws-dscnn-s" / "encoder_int8.tflite"
SHAPES = [(64, 4), (48, 4), (32, 3), (16, 2), (8, 1)]
_TFLM = ("import sys, numpy as np; from tflite_micro import runtime\n"
         "it = runtime.Interpreter.from_bytes(open(sys.argv[1], 'rb').read(), arena_size=1 << 22)\n"
         "d = it.get_input_details(0); it.set_input(np.zeros(d['shape'], d['dtype']), 0); it.invoke()\n"
         "it.print_allocations()\n")


def tflm_arena(model: Path) -> int:
    res = subprocess.run([sys.executable, "-c", _TFLM, str(model)], capture_output=True, text=True, timeout=300)
    line = next(l for l in (res.stdout + res.stderr).splitlines() if "Arena allocation total" in l)
    return int(line.split("total")[1].split()[0])


def models(cache: Path) -> dict[str, Path]:
    from host.partition.zoo import variant_tflite
    out = {}
    if SHIPPED.exists():
        out["shipped kws-dscnn-s"] = SHIPPED
    for c, b in SHAPES:
        out[f"dscnn c{c} b{b}"] = variant_tflite(c, b, cache_dir=cache)
    return out


def main():
    from host.partition.graph import load_graph
    from host.partition.memory import plan_arena
    from host.partition.placement import vela_report
    from host.partition.plan import plan_partition
    from host.partition.profiles import load_profile
    from host.partition.report import draw_chart

    rows = []
    cache = Path.home() / ".cache" / "edgelearn" / "zoo"
    for name, path in models(cache).items():
        g = load_graph(path)
        predicted = plan_arena(g).arena_bytes
        measured = tflm_arena(path)
        rows.append(row("partition_accuracy", f"arena bytes, {name}", predicted, "bytes", "TFLite Micro",
                        measured, ratio=predicted / measured, error_pct=round(100 * (predicted - measured) / measured, 2)))
        v = vela_report(path)
        copies = sum(l["macs"] for l in v["layers"] if l["nng_op"] == "MemoryCopy")
        rows.append(row("partition_accuracy", f"MACs, {name}", g.total_macs, "MAC", "Arm Vela 5.2.0",
                        v["macs"] - copies, ratio=g.total_macs / (v["macs"] - copies)))
        plan = plan_partition(g, load_profile("ethos-u55"))
        rows.append(row("partition_accuracy", f"CPU-fallback ops on ethos-u55, {name}", plan.totals["cpu_ops"],
                        "ops", "Arm Vela 5.2.0", v["cpu_ops"], ratio=None,
                        agrees=plan.totals["cpu_ops"] == v["cpu_ops"]))
        tb = plan.totals["training_bytes"]
        rows.append(row("partition_accuracy", f"training bytes bias-only vs full (SGD), {name}", tb["bias-only"],
                        "bytes", "full tail fine-tune", tb["full"]))
    # report speed on the largest < 1 MB model: ours (parse + plan + chart) vs the real tools
    path = next(p for p in models(cache).values() if p.stat().st_size < 1 << 20)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "edge.cli", "report", str(path), "--target", "ethos-u55",
                        "--json", "--chart", str(Path(tmp) / "c.png")], capture_output=True, check=False, cwd=ROOT)
        ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        tflm_arena(path)
        vela_report(path)
        tools = time.perf_counter() - t0
        t0 = time.perf_counter()
        g = load_graph(path)
        plan = plan_partition(g, load_profile("ethos-u55"))
        draw_chart(plan, Path(tmp) / "d.png")
        in_process = time.perf_counter() - t0
    rows.append(row("partition_accuracy", f"`edgelearn report` wall time ({path.stat().st_size // 1024} KB model, "
                    "new process)", round(ours, 3), "s", "TFLM probe + Vela compile", round(tools, 3)))
    rows.append(row("partition_accuracy", "plan + chart time in process", round(in_process, 3), "s",
                    "TFLM probe + Vela compile", round(tools, 3)))
    write_results("partition_accuracy", rows)
    return rows


if __name__ == "__main__":
    main()
