"""``edgelearn fleet simulate``: many devices with the real client over loopback HTTP, then plots.

    $ edgelearn fleet simulate --devices 30 --rounds 10 --out fleet-out
"""

from __future__ import annotations


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("simulate", help="run a simulated fleet against a fresh aggregator")
    s.add_argument("--out", default="fleet-out")
    s.add_argument("--devices", type=int, default=30)
    s.add_argument("--rounds", type=int, default=10)
    s.add_argument("--mode", choices=["sync", "async"], default="sync")
    s.add_argument("--strategy", default="fedavg", choices=["fedavg", "fedavgm", "fedprox", "trimmed_mean", "median"])
    s.add_argument("--codec", choices=["dense_f32", "int8", "topk_int8"], default="int8")
    s.add_argument("--clients-per-round", type=int, default=10)
    s.add_argument("--drop-rate", type=float, default=0.1)
    s.add_argument("--slow-fraction", type=float, default=0.1)
    s.add_argument("--time-scale", type=float, default=0.02, help="wall seconds per simulated second")
    s.add_argument("--shipped-head", action="store_true",
                   help="start from the shipped classifier instead of a random one")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--mcu-devices", type=int, default=0,
                   help="also run this many boards (real firmware on the MicroPython unix port) federating the "
                        "MCU model with their own aggregator")


def run(args) -> int:
    import shutil
    from pathlib import Path

    from edge.errors import EdgelearnError
    from host.fleet.plots import summary, write_report
    from host.fleet.simulate import SimConfig, simulate

    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        if not (out / "fleet.json").exists():
            raise EdgelearnError(f"{out}: exists and is not a fleet output", fix="choose an empty --out")
        shutil.rmtree(out)
    cfg = SimConfig(devices=args.devices, rounds=args.rounds, mode=args.mode, strategy=args.strategy,
                    codec=args.codec, clients_per_round=args.clients_per_round, drop_rate=args.drop_rate,
                    slow_fraction=args.slow_fraction, time_scale=args.time_scale,
                    fresh_head=not args.shipped_head, seed=args.seed, mcu_devices=args.mcu_devices)
    res = simulate(cfg, out)
    paths = write_report(res, out)
    print("\n".join(summary(res, paths["html"], mcu_json=out / "mcu" / "mcu.json")))
    return 0
