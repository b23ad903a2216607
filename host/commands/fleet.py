"""``edgelearn fleet simulate``: many devices with the real client over loopback HTTP, then plots.

    $ edgelearn fleet simulate --devices 30 --rounds 10 --out fleet-out
    $ edgelearn fleet simulate --task shipped-head --devices 9 --rounds 12 --out fleet-voices
"""

from __future__ import annotations

from host.aggregator.config import CODECS
from host.config_args import add_config_arguments, config_from_args
from host.fl.strategies import STRATEGIES
from host.fleet.simulate import TASKS, SimConfig

# the SimConfig fields `fleet simulate` offers as options, in --help order
SIM_FIELDS = ("devices", "rounds", "mode", "strategy", "codec", "clients_per_round", "drop_rate", "slow_fraction",
              "time_scale", "task", "eval_tolerance", "seed", "mcu_devices")
CHOICES = {"mode": ("sync", "async"), "strategy": tuple(STRATEGIES), "codec": CODECS,
           "task": tuple(t for t in TASKS if t)}


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("simulate", help="run a simulated fleet against a fresh aggregator")
    s.add_argument("--out", default="fleet-out")
    add_config_arguments(s, SimConfig, SIM_FIELDS[:9], choices=CHOICES,
                         help={"time_scale": "wall seconds per simulated second"})
    s.add_argument("--shipped-head", action="store_true",
                   help="start from the shipped classifier instead of a random one")
    add_config_arguments(s, SimConfig, SIM_FIELDS[9:11], choices=CHOICES, help={
        "eval_tolerance": "a round's version is published only if its held-out 37-way accuracy (val split) "
                          "is at most this much below the current one's (bench/fl_voices runs 1.0: the shipped-head "
                          "task trades it for the fleet's voices)",
        "task": "shipped-head: users speaking voices the shipped model never trained on (Flite, in their own "
                "rooms), federating from the shipped classifier with their labelled clips, negatives and "
                "confident detections (bench/fl_voices.py); empty: the corpus embeddings task"})
    add_config_arguments(s, SimConfig, SIM_FIELDS[11:], help={
        "mcu_devices": "also run this many boards (real firmware on the MicroPython unix port) federating the "
                       "MCU model with their own aggregator"})


def run(args) -> int:
    import shutil
    from pathlib import Path

    from edge.errors import EdgelearnError
    from host.fleet.plots import summary, write_report
    from host.fleet.simulate import simulate

    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        if not (out / "fleet.json").exists():
            raise EdgelearnError(f"{out}: exists and is not a fleet output", fix="choose an empty --out")
        shutil.rmtree(out)
    cfg = config_from_args(SimConfig, args, SIM_FIELDS, fresh_head=not args.shipped_head)
    res = simulate(cfg, out)
    paths = write_report(res, out)
    print("\n".join(summary(res, paths["html"], mcu_json=out / "mcu" / "mcu.json")))
    return 0
