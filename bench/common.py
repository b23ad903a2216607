"""Shared pieces for benchmarks: machine description, result rows, the JSON file, a table.

Every benchmark runs ours and a reference side by side in one run and writes a
list of rows, each with at least name, metric, value, unit, baseline,
baseline_value, ratio, machine and date (docs/design.md, "Benchmarks and figures").

    >>> rows = [row("frontend", "time per 1 s window", 0.11, "ms", "librosa", 0.9)]
    >>> write_results("frontend", rows)
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

from edge.atomic import atomic_write

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}, Python {platform.python_version()}"


def row(name: str, metric: str, value, unit: str, baseline: str | None = None,
        baseline_value=None, ratio=None, **extra) -> dict:
    """One result row. ``ratio`` defaults to baseline_value / value (how many times better, for costs)."""
    if ratio is None and baseline_value not in (None, 0) and value not in (None, 0):
        ratio = baseline_value / value
    r = {"name": name, "metric": metric, "value": value, "unit": unit, "baseline": baseline,
         "baseline_value": baseline_value, "ratio": None if ratio is None else round(float(ratio), 4),
         "machine": machine(), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d")}
    r.update(extra)
    return r


def write_results(name: str, rows: list[dict]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    atomic_write(path, (json.dumps(rows, indent=1) + "\n").encode(), mode=None)
    print_table(rows)
    print(f"wrote {path}")
    return path


def print_table(rows: list[dict]) -> None:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)

    cols = ["name", "metric", "value", "unit", "baseline", "baseline_value", "ratio"]
    cells = [[fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for x in cells:
        print("  ".join(v.ljust(w) for v, w in zip(x, widths)))


def timeit(fn, repeat: int = 7, number: int = 100) -> float:
    """Median seconds per call over `repeat` rounds of `number` calls (after one warm-up round)."""
    for _ in range(min(number, 10)):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t) / number)
    return statistics.median(times)
