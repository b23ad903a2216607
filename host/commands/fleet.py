"""``edgelearn fleet simulate``: many devices with the real client over loopback HTTP, then plots.

    $ edgelearn fleet simulate --devices 30 --rounds 10 --out fleet-out
    $ edgelearn fleet simulate --task shipped-head --devices 9 --rounds 12 --out fleet-voices
    $ edgelearn fleet simulate --ray local --devices 20000 --clients-per-round 10000 --rounds 3
    $ edgelearn fleet simulate --ray 10.0.0.5:6379 --devices 100000 --clients-per-round 10000 --ray-batch 200
"""

from __future__ import annotations

from host.aggregator.config import CODECS
from host.config_args import add_config_arguments, config_from_args
from host.fl.strategies import STRATEGIES
from host.fleet.ray_sim import RayOptions
from host.fleet.simulate import PARTITIONS, TASKS, SimConfig

# the SimConfig fields `fleet simulate` offers as options, in --help order
SIM_FIELDS = ("devices", "rounds", "mode", "strategy", "codec", "clients_per_round", "drop_rate", "slow_fraction",
              "time_scale", "task", "eval_tolerance", "learning_rate", "seed", "mcu_devices", "partition", "round_gap")
CHOICES = {"mode": ("sync", "async"), "strategy": tuple(STRATEGIES), "codec": CODECS,
           "task": tuple(t for t in TASKS if t), "partition": PARTITIONS}
RAY_FIELDS = ("ray_batch", "ray_task_cpus", "ray_task_memory_mb", "ray_in_flight")


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("simulate", help="run a simulated fleet against a fresh aggregator")
    s.add_argument("--out", default="fleet-out")
    add_config_arguments(s, SimConfig, SIM_FIELDS[:9], choices=CHOICES,
                         help={"time_scale": "wall seconds per simulated second"})
    s.add_argument("--shipped-head", action="store_true",
                   help="start from the shipped classifier instead of a random one")
    add_config_arguments(s, SimConfig, SIM_FIELDS[9:12], choices=CHOICES, help={
        "learning_rate": "the devices' step size; 0: the task's own (0.02 for shipped-head, 0.1 otherwise)",
        "eval_tolerance": "a round's version is published only if its held-out accuracy (val split) is at "
                          "most this much below the current one's (shipped-head: its 12-class accuracy; "
                          "bench/fl_voices gates on the class-balanced figure against the shipped model "
                          "instead, through the aggregator's eval_metric / eval_against)",
        "task": "shipped-head: users speaking voices the shipped model never trained on (Flite, in their own "
                "rooms), federating the shipped head (projection and classifier) with their labelled clips, "
                "negatives and confident detections (bench/fl_voices.py); empty: the corpus embeddings task"})
    add_config_arguments(s, SimConfig, SIM_FIELDS[12:], choices=CHOICES, help={
        "mcu_devices": "also run this many boards (real firmware on the MicroPython unix port) federating the "
                       "MCU model with their own aggregator",
        "partition": "noniid: a voice's clips split between the devices that share it (at most a few hundred "
                     "devices); derived: each device's rows from its index and the seed (any population; "
                     "what --ray always uses)",
        "round_gap": "simulated seconds between rounds that the simulator skips: every device's battery and "
                     "charging window move on by this much at each closed round (3600: rounds hourly, so "
                     "devices reach their overnight charging window; bench/fl_voices); 0: back to back"})
    s.add_argument("--embeddings", metavar="FILE.npz", default=None,
                   help="the embedding set the devices (corpus task) and the held-out check use: an .npz of X "
                        "(N, 64), y (labels 0-36), voice and split (train/val/test); default: the corpus clips' "
                        "embeddings, computed once and cached (rendering the corpus the first time takes ~15 min "
                        "on 2 cores)")
    s.add_argument("--ray", metavar="local|ADDRESS", default=None,
                   help="run the devices as batched Ray tasks: local (a new one-machine Ray), auto (the cluster "
                        "`ray start` left here) or HOST:PORT of a cluster's head; devices are derived from their "
                        "index when scheduled, so --devices can be 100,000")
    add_config_arguments(s, RayOptions, RAY_FIELDS, help={
        "ray_batch": "with --ray: devices per Ray task (they train one after another, deliver by due time)",
        "ray_task_cpus": "with --ray: CPUs one task (one device at a time) asks Ray for; fractions allowed",
        "ray_task_memory_mb": "with --ray: memory one task asks Ray for (0: none)",
        "ray_in_flight": "with --ray: tasks submitted at once (0: two per CPU of the cluster)"})


def run(args) -> int:
    import shutil
    from pathlib import Path

    from edge.errors import EdgelearnError
    from host.fleet.plots import summary, write_report
    from host.fleet.simulate import simulate

    out = Path(args.out)
    cfg = config_from_args(SimConfig, args, SIM_FIELDS, fresh_head=not args.shipped_head)
    check_options(cfg, args)  # every option before the embeddings are computed or anything is deleted
    if args.ray:  # join the cluster first: a refused --ray leaves --out as it was (not created, not emptied)
        from host.fleet.ray_sim import _check, connect

        _check(cfg)
        connect(args.ray)
    if out.exists() and not out.is_dir():
        raise EdgelearnError(f"--out {out} is a file", fix="choose a new or empty directory for --out")
    if out.exists() and any(out.iterdir()):
        if not (out / "fleet.json").exists():
            raise EdgelearnError(f"{out}: exists and is not a fleet output", fix="choose an empty --out")
        shutil.rmtree(out)
    data = None
    if args.embeddings:
        from host.aggregator.inprocess import small_params
        from host.fleet.data import read_embeddings

        data = read_embeddings(args.embeddings, shape=small_params()["classifier.w"].shape)
    if args.ray:
        from host.fleet.ray_sim import simulate_ray

        cfg.partition = "derived"  # on Ray every device is derived from its index
        res = simulate_ray(cfg, out, address=args.ray, opts=config_from_args(RayOptions, args, RAY_FIELDS), data=data)
    else:
        res = simulate(cfg, out, data=data)
    paths = write_report(res, out)
    print("\n".join(summary(res, paths["html"], mcu_json=out / "mcu" / "mcu.json")))
    if args.ray:
        nodes = res["ray"]["nodes"]
        print(f"fleet: {sum(nodes.values()):,} device cycles in {res['ray']['tasks']} Ray tasks on {len(nodes)} "
              f"node(s); {len(res['participation']):,} of {cfg.devices:,} devices joined a round")
    return 0


def check_options(cfg: SimConfig, args) -> None:
    """One EdgelearnError naming the first option out of range, before any work starts."""
    import math

    from edge.errors import EdgelearnError
    from host.config_args import as_options
    from host.fleet.population import check_clients
    from host.fleet.simulate import aggregator_config

    ranges = (("devices", 1, None, "a number of devices, e.g. 30"),
              ("rounds", 1, None, "a number of rounds, e.g. 10"),
              ("clients_per_round", 1, None, "devices per round, e.g. 10"),
              ("drop_rate", 0, 1, "a fraction between 0 and 1"), ("slow_fraction", 0, 1, "a fraction between 0 and 1"),
              ("time_scale", 0, None, "wall seconds per simulated second above 0, e.g. 0.02"),
              ("eval_tolerance", 0, None, "a fraction of accuracy of 0 or more, e.g. 0.01"),
              ("learning_rate", 0, None, "a step size of 0 (the task's) or more"),
              ("mcu_devices", 0, None, "a number of boards of 0 or more"),
              ("round_gap", 0, None, "simulated seconds of 0 or more, e.g. 3600"))
    for name, low, high, what in ranges:
        v = getattr(cfg, name)
        if not (math.isfinite(v) and v >= low and (high is None or v <= high)) or (name == "time_scale" and v <= 0):
            raise EdgelearnError(f"{as_options(name, [name])} {v} is out of range", fix=f"give {what}")
    check_clients(cfg)  # the quorum within --devices, with and without --ray
    if args.ray:
        for name in RAY_FIELDS:
            v = getattr(args, name)
            low = 1 if name == "ray_batch" else 0
            if not (math.isfinite(v) and v >= low) or (name == "ray_task_cpus" and v <= 0):
                raise EdgelearnError(f"{as_options(name, [name])} {v} is out of range",
                                     fix="give a number above 0" if low or name == "ray_task_cpus" else "give 0 or more")
    try:
        aggregator_config(cfg)  # the aggregator's own checks (strategy, codec, ...), said as options
    except EdgelearnError as e:
        raise EdgelearnError(as_options(e.problem, SIM_FIELDS).split(": ", 1)[-1],
                             fix="change that option (see --help)") from None
