"""``edgelearn report MODEL_OR_BUNDLE [--target NAME] [--json]``: per-layer table,
totals, verdict, and a PNG chart of memory per layer.

    $ edgelearn report models/kws-dscnn-s --target esp32
    $ edgelearn report enc.tflite --target ethos-u55 --json > plan.json

The plan is ``host.partition.plan.plan_partition``; the table and chart are ``host.partition.report``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from host.partition.report import draw_chart, format_table, resolve_model


def add_arguments(p) -> None:
    p.add_argument("model", type=Path, help=".tflite / .onnx model or a bundle (directory or .zip)")
    p.add_argument("--target", default="esp32", help="profile name or path to your own profile .toml")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--chart", type=Path,
                   help="where to write the PNG chart (default: MODEL.TARGET.memory.png in the current directory)")
    p.add_argument("--strategy", help="training strategy to budget for (default: the target's tier)")
    p.add_argument("--objective", choices=("latency", "energy"), default="latency",
                   help="what the device/cloud split minimises (Linux and phone targets)")


def run(args) -> int:
    from host.partition.graph import load_graph
    from host.partition.plan import plan_partition
    from host.partition.profiles import load_profile

    from host.bundle import bundle_arg

    args.model = bundle_arg(args.model)  # a shipped bundle's name works too
    profile = load_profile(args.target)
    with tempfile.TemporaryDirectory() as tmp:
        model = resolve_model(args.model, Path(tmp))
        plan = plan_partition(load_graph(model), profile, objective=args.objective, strategy=args.strategy)
    # by default in the current directory: never inside a bundle or an installed package
    chart = args.chart or Path(f"{args.model.resolve().stem}.{profile.name}.memory.png")
    try:
        draw_chart(plan, chart)
    except OSError as e:  # the chart was asked for (or defaulted here): not writing it is a failure, rc 2
        from edge.errors import EdgelearnError

        raise EdgelearnError(f"cannot write the chart to {chart} ({e.strerror or e})",
                             fix="pass --chart with a PNG path in an existing directory you can write to") from None
    if args.json:
        out = plan.as_json()
        out["chart"] = str(chart) if chart else None
        print(json.dumps(out, indent=1))
    else:
        print(format_table(plan))
        if chart:
            print(f"chart: {chart}")
    return 0 if plan.fits else 1
