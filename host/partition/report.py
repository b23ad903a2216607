"""A partition plan as a per-layer table with totals and verdict (``format_table``), a PNG chart
of memory per layer (``draw_chart``), and the model file inside a bundle (``resolve_model``);
``edgelearn report`` (``host/commands/report.py``) prints them.
"""

from __future__ import annotations

import json
import tempfile
import zipfile
from pathlib import Path

from edge.errors import EdgelearnError


def resolve_model(path: Path, tmp: Path | None = None) -> Path:
    """A model file, or the first .tflite/.onnx partition of a bundle."""
    if path.is_file() and path.suffix.lower() in (".tflite", ".onnx"):
        return path
    if path.is_file() and path.suffix.lower() == ".zip":
        if tmp is None:
            tmp = Path(tempfile.mkdtemp(prefix="edgelearn-report-"))
        with zipfile.ZipFile(path) as z:
            z.extractall(tmp)
        inner = [p for p in tmp.iterdir() if p.is_dir()]
        path = inner[0] if len(inner) == 1 and not (tmp / "manifest.json").exists() else tmp
    if path.is_dir():
        mf = path / "manifest.json"
        if not mf.is_file():
            raise EdgelearnError(f"{path} is a directory without manifest.json", fix="pass a bundle or a model file")
        try:
            m = json.loads(mf.read_text())
        except ValueError as e:
            raise EdgelearnError(f"{mf} is not JSON ({e})", fix="rebuild the bundle") from None
        for part in m.get("partitions", []):
            if part.get("format") in ("tflite", "onnx") and part.get("placement") != "cloud":
                return path / part["file"]
        raise EdgelearnError(f"{path} has no .tflite or .onnx partition to analyse",
                             fix="pass the model file the bundle was built from")
    if not path.exists():
        raise EdgelearnError(f"{path} does not exist", fix="pass a .tflite/.onnx model or a bundle")
    raise EdgelearnError(f"{path} is neither a model (.tflite/.onnx) nor a bundle", fix="pass one of those")


def draw_chart(plan, out: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = plan.layers
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.45), 4))
    live = [r["live_arena_bytes"] / 1024 for r in rows]
    w = [r["weight_bytes"] / 1024 for r in rows]
    ax.bar(x, live, label="live activations (arena head)")
    ax.bar(x, w, bottom=live, label="layer weights")
    budget = plan.profile.budget_bytes / 1024
    if budget < 4 * max(r["need_bytes"] for r in rows) / 1024:
        ax.axhline(budget, color="red", linestyle="--", label=f"{plan.profile.name} budget")
    ax.set_xticks(list(x), [f"{r['index']} {r['op'][:10]}" for r in rows], rotation=70, fontsize=7)
    ax.set_ylabel("KB")
    ax.set_title(f"{plan.graph.path.name} on {plan.profile.name}: {plan.verdict[:70]}", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def format_table(plan) -> str:
    head = f"{'#':>3} {'op':<18} {'engine':<6} {'MACs':>10} {'weights':>9} {'act':>8} {'live':>8}  reason"
    lines = [head, "-" * len(head)]
    for r in plan.layers:
        lines.append(f"{r['index']:>3} {r['op'][:18]:<18} {r['engine']:<6} {r['macs']:>10,} "
                     f"{r['weight_bytes']:>9,} {r['activation_bytes']:>8,} {r['live_arena_bytes']:>8,}  {r['reason']}")
    t = plan.totals
    lines.append("-" * len(head))
    lines.append(f"total MACs {t['macs']:,}  weights {t['weight_bytes']:,} B  arena {t['arena_bytes']:,} B "
                 f"(head {t['arena_head_bytes']:,} + tail {t['arena_tail_bytes']:,})")
    lines.append("training bytes: " + ", ".join(f"{k} {v:,}" for k, v in t["training_bytes"].items()))
    if plan.split is not None:
        s = plan.split
        where = ("nothing on the device" if s.cut == 0 else "everything on the device"
                 if s.cut == len(plan.layers) else f"layers 0..{s.cut - 1} on the device")
        lines.append(f"split: {where}, uplink {s.tx_bytes:,} B, {s.latency_ms:.2f} ms, {s.energy_mj:.3f} mJ")
    lines.append(plan.verdict)
    return "\n".join(lines)
