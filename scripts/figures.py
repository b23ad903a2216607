"""Print every stored benchmark result as one Markdown table (for README.md's Figures section).

    $ .venv/bin/python scripts/figures.py > /tmp/figures.md
"""

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


def fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def main():
    print("| benchmark | metric | ours | unit | reference | reference value | ratio | measured |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for path in sorted(RESULTS.glob("*.json")):
        try:
            rows = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue
        for r in [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []:
            print(f"| {path.stem} | {r.get('metric', '')} ({r.get('name', '')}) | {fmt(r.get('value'))} | "
                  f"{r.get('unit', '')} | {fmt(r.get('baseline'))} | {fmt(r.get('baseline_value'))} | "
                  f"{fmt(r.get('ratio'))} | {r.get('date', '')} |")


if __name__ == "__main__":
    main()
