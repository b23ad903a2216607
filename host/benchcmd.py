"""``edgelearn bench [NAME ...]``: run benchmarks, or print their stored results.

    $ edgelearn bench frontend          # runs bench/frontend.py, writes bench/results/frontend.json
    $ edgelearn bench --show            # prints every stored result table
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

# Benchmarks live beside the package in the source tree (they are not installed).
ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "bench"
SKIP = {"__init__", "common"}


def available() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.py") if p.stem not in SKIP and not p.stem.startswith("_"))


def add_arguments(p) -> None:
    p.add_argument("names", nargs="*", help=f"benchmarks to run (default: all); known: {', '.join(available())}")
    p.add_argument("--show", action="store_true", help="print stored results instead of running")


def run(args) -> int:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from bench.common import RESULTS, print_table
    from edge.errors import EdgelearnError

    names = args.names or available()
    unknown = [n for n in names if n not in available()]
    if unknown:
        raise EdgelearnError(f"no benchmark named {', '.join(unknown)}", fix=f"choose from {', '.join(available())}")
    failed = []
    for name in names:
        if args.show:
            path = RESULTS / f"{name}.json"
            if path.exists():
                print(f"== {name} ==")
                print_table(json.loads(path.read_text()))
            continue
        print(f"== {name} ==", flush=True)
        try:
            importlib.import_module(f"bench.{name}").main()
        except Exception as e:  # one broken benchmark must not hide the others
            print(f"bench {name} failed: {e}", file=sys.stderr)
            failed.append(name)
    return 1 if failed else 0
