"""``edgelearn bench [NAME ...]``: run benchmarks, or print their stored results.

    $ edgelearn bench frontend          # runs bench/frontend.py, writes bench/results/frontend.json
    $ edgelearn bench --show            # prints every stored result table

The benchmarks are not installed with edgelearn: they live in the source checkout (``bench/``),
found from ``$EDGELEARN_SOURCE``, the checkout this package was installed from (``pip install -e``),
or the current directory and its parents. Installed from a wheel without a checkout, the
command says so in one sentence.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

from edge.errors import EdgelearnError

SKIP = {"__init__", "common"}


def _is_checkout(d: Path) -> bool:
    return (d / "bench" / "common.py").is_file() and (d / "pyproject.toml").is_file()


def checkout() -> Path | None:
    """The source checkout whose ``bench/`` to run, or None."""
    env = os.environ.get("EDGELEARN_SOURCE")
    if env:
        return Path(env).resolve() if _is_checkout(Path(env)) else None
    here = Path(__file__).resolve().parents[2]      # an editable install: the checkout itself
    cwd = Path.cwd().resolve()
    for cand in (here, cwd, *cwd.parents):
        if _is_checkout(cand):
            return cand
    return None


def available() -> list[str]:
    root = checkout()
    if root is None:
        return []
    return sorted(p.stem for p in (root / "bench").glob("*.py") if p.stem not in SKIP and not p.stem.startswith("_"))


def add_arguments(p) -> None:
    known = ", ".join(available()) or "none here (the benchmarks live in the source checkout)"
    p.add_argument("names", nargs="*", help=f"benchmarks to run (default: all); known: {known}")
    p.add_argument("--show", action="store_true", help="print stored results instead of running")


def run(args) -> int:
    root = checkout()
    if root is None:
        where = os.environ.get("EDGELEARN_SOURCE")
        raise EdgelearnError(
            "the benchmarks are not installed with edgelearn: they live in the source checkout's bench/"
            + (f", and EDGELEARN_SOURCE={where} is not one" if where else ", and none was found here"),
            fix="run `edgelearn bench` inside a clone of the edgelearn repository, or set EDGELEARN_SOURCE to one")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    common = importlib.import_module("bench.common")

    names = args.names or available()
    unknown = [n for n in names if n not in available()]
    if unknown:
        raise EdgelearnError(f"no benchmark named {', '.join(unknown)}", fix=f"choose from {', '.join(available())}")
    failed = []
    for name in names:
        if args.show:
            path = common.RESULTS / f"{name}.json"
            if path.exists():
                print(f"== {name} ==")
                common.print_table(json.loads(path.read_text()))
            continue
        print(f"== {name} ==", flush=True)
        try:
            importlib.import_module(f"bench.{name}").main()
        except Exception as e:  # one broken benchmark must not hide the others
            print(f"bench {name} failed: {e}", file=sys.stderr)
            failed.append(name)
    return 1 if failed else 0
