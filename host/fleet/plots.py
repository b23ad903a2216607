"""Figures of a fleet run: accuracy per round, bytes, round durations, participation (PNG + HTML).

    paths = write_report(result, "fleet-out")   # fleet-out/fleet.png, fleet-out/fleet.html, fleet-out/fleet.json
    print("\n".join(summary(result, paths["html"])))
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path


def summary(res: dict, report, mcu_json=None) -> list[str]:
    """The run in one or two lines (``edgelearn fleet simulate`` and ``edgelearn demo`` print them):
    versions published, held-out accuracy before and after, bytes uploaded, the report; the
    MicroPython boards' line when the run had some (with ``mcu_json``, the file that has their reports)."""
    pub = [r for r in res["rounds"] if r["status"] == "closed"]
    rejected = sum(r["status"] == "rejected" for r in res["rounds"])
    final = pub[-1]["accuracy"] if pub else res["initial_accuracy"]
    metric = (res.get("config", {}).get("extra") or {}).get("eval_metric", "accuracy")
    lines = [f"fleet: {len(pub)} signed model versions published"
             + (f" ({rejected} aggregates rejected by the held-out gate)" if rejected else "")
             + f"; held-out {'balanced recall' if metric == 'balanced' else 'accuracy'} "
             f"{res['initial_accuracy']:.2f} -> {final:.2f}; {res['bytes_up']:,} bytes uploaded; report {report}"]
    if "mcu" in res:
        m = res["mcu"]
        lines.append(f"fleet: {len(m['devices'])} MicroPython boards enrolled and adapted; {m['accepted']} of their "
                     f"updates accepted, {m['versions'] - 1} MCU model versions published"
                     + (f"; {mcu_json}" if mcu_json else ""))
    return lines


def write_report(res: dict, out_dir) -> dict:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    rounds = res["rounds"]
    ids = [r["round_id"] for r in rounds]
    fig, ax = plt.subplots(2, 2, figsize=(11, 7))
    acc = [(r["round_id"], r["accuracy"]) for r in rounds if r["accuracy"] is not None]
    ax[0, 0].plot([a for a, _ in acc], [b for _, b in acc], "o-")
    ax[0, 0].axhline(res["initial_accuracy"] or 0, ls="--", c="grey", label="start")
    ax[0, 0].set(title="held-out accuracy per round", xlabel="round", ylabel="accuracy")
    ax[0, 0].legend()
    colours = {"closed": "tab:green", "rejected": "tab:orange", "failed": "tab:red"}
    ax[0, 1].bar(ids, [r["bytes"] / 1024 for r in rounds], color=[colours.get(r["status"], "grey") for r in rounds])
    ax[0, 1].set(title="KiB up per round (green published, orange rolled back, red failed)",
                 xlabel="round", ylabel="KiB")
    ax[1, 0].bar(ids, [r["duration_sim"] or 0 for r in rounds], color=[colours.get(r["status"], "grey") for r in rounds])
    ax[1, 0].set(title="round duration (simulated s)", xlabel="round", ylabel="s")
    ax[1, 1].hist(res["participation"], bins=range(0, max(res["participation"] or [0]) + 2))
    ax[1, 1].set(title="rounds joined per device", xlabel="rounds", ylabel="devices")
    fig.tight_layout()
    png = out / "fleet.png"
    fig.savefig(png, dpi=90)
    plt.close(fig)
    (out / "fleet.json").write_text(json.dumps(res, indent=1, default=str))
    rows = "".join(f"<tr><td>{r['round_id']}</td><td>{r['status']}</td><td>{r['accepted']}/{r['target']}</td>"
                   f"<td>{r['selected']}</td><td>{_acc(r)}</td>"
                   f"<td>{r['bytes']}</td><td>{html.escape(str(r['note'] or ''))}</td></tr>" for r in rounds)
    img = base64.b64encode(png.read_bytes()).decode()
    (out / "fleet.html").write_text(
        f"<!doctype html><meta charset=utf-8><title>edgelearn fleet</title><h1>Fleet simulation</h1>"
        f"<p>{html.escape(json.dumps(res['config']))}</p><p>stats: {html.escape(json.dumps(res['stats']))}; "
        f"bytes up {res['bytes_up']}</p><img src='data:image/png;base64,{img}'>"
        f"<table border=1><tr><th>round</th><th>status</th><th>accepted</th><th>selected</th><th>accuracy</th>"
        f"<th>bytes</th><th>note</th></tr>{rows}</table>")
    return {"png": str(png), "html": str(out / "fleet.html")}


def _acc(r) -> str:
    return "" if r["accuracy"] is None else f"{r['accuracy']:.3f}"
