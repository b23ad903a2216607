"""Update compression on the same non-IID task: uncompressed FedAvg vs each codec, bytes and accuracy.

Lock-step rounds (host/fleet/lockstep.py): 40 devices with their own voices
and word subsets (corpus embeddings under the shipped encoder), 10 per round,
the same devices, data and selections for every codec, real clients and the
real aggregator over its HTTP interface; the federated model is the tail
(proj 64×64 + classifier 64×37, 6.5 k parameters) from a random start.
"Final accuracy" is the held-out accuracy (test voices) averaged over the
last 10 rounds (one round's value moves by ±2 points under non-IID data);
bytes are everything the devices uploaded (frames, chunk headers included).

    $ edgelearn bench fl_compression          # ~6 min on 2 cores
    $ python bench/fl_compression.py --rounds 10
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import row, write_results  # noqa: E402

CODECS = [  # (label, codec, top-k fraction, adapt strategy)
    ("int8 (stochastic rounding)", "int8", 0.05, ""),
    ("top-k 3% + error feedback, int8 values", "topk_int8", 0.03, ""),
    ("top-k 2% + error feedback, int8 values", "topk_int8", 0.02, ""),
    ("top-k 1% + error feedback, int8 values", "topk_int8", 0.01, ""),
    ("bias-only subset, int8", "int8", 0.05, "bias-only"),
]


def main(argv=None):
    from host.fleet.data import load_embeddings
    from host.fleet.lockstep import LockstepConfig, run_lockstep

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=60)
    args = ap.parse_args(argv or [])
    data = load_embeddings()
    last = min(10, args.rounds)

    def final(res):
        return float(np.mean([r["accuracy"] for r in res["rounds"][-last:]]))

    with tempfile.TemporaryDirectory() as td:
        ref = run_lockstep(LockstepConfig(rounds=args.rounds, codec="dense_f32"), Path(td) / "dense", data=data)
        ref_acc = final(ref)
        rows = [row("fl_compression", "uncompressed FedAvg (dense float32): bytes uploaded", ref["bytes_up"], "B",
                    None, None, final_accuracy=round(ref_acc, 4), frame_bytes=round(ref["frame_bytes"], 1),
                    curve=[round(r["accuracy"], 4) for r in ref["rounds"]])]
        for label, codec, frac, strat in CODECS:
            res = run_lockstep(LockstepConfig(rounds=args.rounds, codec=codec, topk_fraction=frac,
                                              adapt_strategy=strat), Path(td) / f"{codec}-{frac}-{strat}", data=data)
            acc = final(res)
            rows.append(row("fl_compression", f"{label}: bytes uploaded", res["bytes_up"], "B",
                            "dense float32", ref["bytes_up"], final_accuracy=round(acc, 4),
                            baseline_accuracy=round(ref_acc, 4), accuracy_loss_points=round(100 * (ref_acc - acc), 2),
                            meets_goal=bool(ref["bytes_up"] / res["bytes_up"] >= 32 and ref_acc - acc <= 0.01),
                            frame_bytes=round(res["frame_bytes"], 1),
                            curve=[round(r["accuracy"], 4) for r in res["rounds"]]))
    write_results("fl_compression", rows)
    print(f"\nfinal accuracy (mean of the last {last} rounds): dense {ref_acc:.4f}")
    for r in rows[1:]:
        print(f"  {r['metric'].split(':')[0]:<42} {r['final_accuracy']:.4f} ({-r['accuracy_loss_points']:+.2f} pt), "
              f"{r['ratio']:.1f}x fewer bytes{'  <- goal met' if r['meets_goal'] else ''}")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
