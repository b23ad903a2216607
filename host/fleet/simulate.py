"""A fleet of simulated devices running the real client code against a real aggregator on loopback.

Each device is an ``edge.fl.FLClient`` (HTTP over a socket, wire
frames, signed bundles installed through ``edge.store``) with its own
non-IID data (one voice, a subset of the words; corpus embeddings cached by
``host.fleet.data``), a battery that drains while training and charges in
a daily window, a heavy-tailed (log-normal) training+upload latency, a chance
of dropping out after training, and a slow minority. Simulated seconds are
scaled by ``time_scale`` so an hour of fleet time takes ~a minute; the
aggregator's deadline and retry hints are scaled the same way. A device's cycle (check in, train,
latency, drop-out or upload) is ``host.fleet.cycle``, which the Ray simulator (``ray_sim.py``,
``fleet simulate --ray``) runs too; ``partition="derived"`` gives every device its rows and key
from its index and the seed (``host.fleet.population``), as on Ray. This one runs a thread and a
client per device of the population: for a few hundred; past that, Ray.

    res = simulate(SimConfig(devices=40, rounds=10), out_dir="fleet-out")
    res["rounds"][-1]["accuracy"]

``task="shipped-head"`` is the task that improves the shipped model (issue 18): the aggregator
starts from the shipped classifier (``host.fleet.data.extract_head``), each device is a user
with a voice the model never trained on (``host.fleet.voices``: Flite voices in their own rooms)
and a real ``edge.device.Device`` state, and its examples are what the agent trains on,
assembled by the agent's own function (``edge.fl.local.local_examples``: a few labelled clips
per command, augmented, the user's other words as ``_unknown_``, room noise as ``_silence_``,
and the confident detections ``Device.detect`` kept). Aggregates are gated on the corpus's
``heldout_split`` (val: voices no device holds, never reported by the benchmark).

    res = simulate(SimConfig(task="shipped-head", devices=9, rounds=10), "fleet-out")
    head = final_head("fleet-out")                  # the last published version's head
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class SimConfig:
    devices: int = 30
    rounds: int = 10                 # stop after this many closed rounds (published or rejected)
    mode: str = "sync"
    strategy: str = "fedavg"
    codec: str = "int8"
    clients_per_round: int = 10
    overselect: float = 1.3
    buffer_size: int = 10
    round_timeout: float = 60.0      # simulated seconds
    # simulated seconds between one round's close and the next round's start that the simulator skips
    # rather than waits through: at each closed round every device's clock (battery, charging window)
    # moves on by this much, as if rounds ran on a cadence (3600: hourly); 0 = back to back
    round_gap: float = 0.0
    median_latency: float = 10.0     # simulated seconds of local training + upload
    latency_sigma: float = 0.6       # log-normal spread (heavy tail)
    slow_fraction: float = 0.1       # these devices are 10x slower
    drop_rate: float = 0.1           # chance a device trains but never uploads
    time_scale: float = 0.02         # wall seconds per simulated second
    fresh_head: bool = True          # start from a random classifier instead of the shipped one
    task: str = ""                   # "shipped-head": voices the model never heard, from the shipped head
    voices: tuple = ()               # shipped-head: the users' Flite voices (default FLEET_VOICES)
    augment: int = 8                 # shipped-head: copies of each labelled clip
    negative_share: float = 0.5      # shipped-head: share of _unknown_/_silence_ in every local batch
    heldout_split: str = "val"       # shipped-head: the corpus split the aggregator gates on
    # shipped-head: more groups the gate holds each on its own, "SPLIT:SYNTH" (e.g. "train:festival": the
    # training Festival voices' eval clips, which the operator holds); () = the split alone
    heldout_groups: tuple = ()
    # shipped-head: the aggregator ships this many training-voice clips of each command with every
    # version and devices train on them beside their own (``init_state(rehearsal=)``); 0 = none
    rehearsal_per_command: int = 0
    head_tensors: tuple = ()          # shipped-head: what devices train (sparse); () = the whole head
    keep_absent: bool = True         # shipped-head: outputs of labels a device never hears keep their weights
    local_epochs: int = 5
    learning_rate: float = 0.0       # devices' step size; 0 = the task's (``task_learning_rate``)
    eval_tolerance: float = 0.01
    seed: int = 0
    mcu_devices: int = 0             # also run this many boards on the MicroPython unix port (host/fleet/mcu.py)
    mcu_reports: int = 3
    partition: str = "noniid"        # "derived": rows and key from each device's index + seed (host.fleet.population)
    extra: dict = field(default_factory=dict)


CHARGE_PER_HOUR = 0.5    # on the charger: empty to full in two hours
TRAIN_COST = 0.02        # battery one local training run takes (``simulate``'s life loop)


class Device:
    """A simulated device's schedule: slow (10x latency) or not, its daily charging window (8 h from
    ``phase``), its battery. Off the charger the battery drains by ``drain`` per simulated hour (2-6 %,
    as ``population.DerivedDevice``) and by ``TRAIN_COST`` per training run; a check-in itself costs
    nothing measurable. (Until 2026-12-02 every check-in took 0.2 %: a device told to come back every
    few seconds lost a full battery in about an hour of waiting, went below zero, and its check-ins
    were then refused as malformed, so in some schedules only the devices on a charger were left.)"""

    def __init__(self, i, client, rng, cfg: SimConfig):
        self.i, self.client, self.rng = i, client, rng
        self.slow = rng.random() < cfg.slow_fraction
        self.phase = rng.uniform(0, 24)
        self.battery = rng.uniform(0.3, 1.0)
        self.next_at = rng.uniform(0, cfg.round_timeout * 0.2)  # simulated time of its next check-in
        self.drain = rng.uniform(0.02, 0.06)
        self.t_last = 0.0
        self.joined = 0

    def state(self, t_sim):
        hour = (t_sim / 3600 + self.phase) % 24
        charging = hour < 8  # overnight on the charger
        dt_h = max(0.0, t_sim - self.t_last) / 3600
        self.t_last = max(self.t_last, t_sim)
        self.battery = min(1.0, max(0.0, self.battery + (CHARGE_PER_HOUR if charging else -self.drain) * dt_h))
        return {"battery": round(self.battery, 3), "charging": charging, "network": "wifi",
                "temperature": 30.0}

    def trained(self) -> None:
        self.battery = max(0.0, self.battery - TRAIN_COST)


def _serve(app, port, host="127.0.0.1"):
    import uvicorn
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="error",
                                           access_log=False, lifespan="on"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    while not server.started:
        time.sleep(0.01)
    return server, th


TASKS = ("", "fresh-head", "shipped-head")
PARTITIONS = ("noniid", "derived")
# the devices' step size when SimConfig.learning_rate is 0: the shipped head's whole projection and
# classifier move with a fifth of the fresh head's step (bench/fl_voices; 0.05 was too large a step for
# the larger head and 0.01 too small, on development data: scripts/fl_sweep.py)
LEARNING_RATES = {"": 0.1, "fresh-head": 0.1, "shipped-head": 0.02}


def task_learning_rate(cfg: SimConfig) -> float:
    """The step size devices train with: ``cfg.learning_rate``, or the task's when that is 0."""
    from edge.errors import EdgelearnError

    if not cfg.learning_rate >= 0:
        raise EdgelearnError(f"learning rate {cfg.learning_rate} is below 0 or not a number",
                             fix="pass a step size above 0, or 0 for the task's own")
    return float(cfg.learning_rate) or LEARNING_RATES.get(cfg.task, 0.1)


def aggregator_config(cfg: SimConfig):
    """The aggregator settings of a simulated fleet: the simulation's, its deadline and retry hints
    in wall seconds (scaled by ``time_scale``), then ``cfg.extra`` (any other setting, or an override)."""
    from host.aggregator.config import AggregatorConfig

    s = cfg.time_scale
    settings = dict(mode=cfg.mode, strategy=cfg.strategy, codec=cfg.codec,
                    clients_per_round=cfg.clients_per_round, overselect=cfg.overselect,
                    buffer_size=cfg.buffer_size, round_timeout=cfg.round_timeout * s,
                    min_retry=1.0 * s, max_retry=600 * s, local_epochs=cfg.local_epochs,
                    learning_rate=task_learning_rate(cfg), eval_tolerance=cfg.eval_tolerance,
                    max_concurrency=int(cfg.clients_per_round * cfg.overselect) if cfg.mode == "async" else 30,
                    # no fairness budget (10 of 10 rounds): a budget counted in contributions (4 or 5
                    # of 10) gained nothing on development data over twelve schedules
                    # (scripts/fl_sweep.py, docs/protocol.md); set it with extra={...}
                    fairness_window=10, max_rounds_per_window=10, synchronous="normal", seed=cfg.seed,
                    secagg_phase_timeout=cfg.round_timeout * s / 4)
    return AggregatorConfig(**{**settings, **cfg.extra})


def serve_aggregator(state, cfg: SimConfig, host: str = "127.0.0.1"):
    """The aggregator of ``state`` served by uvicorn in a thread of this process on a free port of
    ``host``; (app, server, thread, port). Stop it with ``server.should_exit = True; thread.join()``."""
    import socket

    from host.aggregator.app import build_app

    with socket.socket() as so:
        so.bind((host, 0))
        port = so.getsockname()[1]
    app = build_app(state, tick_interval=max(0.02, 0.5 * cfg.time_scale))
    server, th = _serve(app, port, host)
    return app, server, th, port



def final_operating(out_dir, version: int) -> dict | None:
    """The operating point published ``version`` of a simulation's aggregator carries (its manifest's
    ``extra.operating``: what ``edge.device.version_thresholds`` reads on a device), or None."""
    import json

    m = json.loads((Path(out_dir) / "agg" / "bundles" / f"v{int(version)}" / "manifest.json").read_text())
    return (m.get("extra") or {}).get("operating")


def final_head(out_dir, version: int | None = None) -> dict:
    """The head of published ``version`` (None: the newest) of a simulation's aggregator (``out_dir/agg``)."""
    from host.aggregator.models import load_params

    models = Path(out_dir) / "agg" / "models"
    if version is None:
        version = max(int(p.stem[1:]) for p in models.glob("v*.npz") if p.stem[1:].isdigit())
    return load_params(models / f"v{version}.npz")


def device_clock(now_sim: float, closed: int, cfg: SimConfig) -> float:
    """A device's simulated time (what its battery and charging window follow): the run's simulated
    seconds plus ``cfg.round_gap`` for each round closed so far."""
    return now_sim + cfg.round_gap * closed


def voice_fleet(cfg: SimConfig, root, progress: bool = True) -> list[dict]:
    """The shipped-head task's devices: ``host.fleet.voices.make_fleet`` + ``prepare_devices``."""
    from host.fleet.voices import FLEET_VOICES, make_fleet, prepare_devices

    users = make_fleet(cfg.devices, voices=tuple(cfg.voices) or FLEET_VOICES, seed=cfg.seed)
    return prepare_devices(users, root, augment=cfg.augment, progress=progress)


def device_trainer(cfg: SimConfig, labels):
    """The local trainer of a shipped-head device (``edge.fl.model.shipped_head_trainer``)."""
    from edge.fl.model import shipped_head_trainer

    return shipped_head_trainer(labels, negative_share=cfg.negative_share, tensors=cfg.head_tensors,
                                keep_absent=cfg.keep_absent)


def simulated_rehearsal(data, cfg: SimConfig, labels) -> np.ndarray:
    """The rows of the shipped-head fleet's rehearsal set: ``cfg.rehearsal_per_command`` training-split
    clips of each command (``host.fleet.data.rehearsal_rows``)."""
    from host.data.words import COMMANDS10
    from host.fleet.data import rehearsal_rows

    return rehearsal_rows(data, [list(labels).index(w) for w in COMMANDS10], cfg.rehearsal_per_command)


def group_rows(data, spec: str):
    """``"SPLIT:SYNTH"`` -> the rows of that split whose voice is that synthesizer's."""
    from edge.errors import EdgelearnError

    split, _, synth = str(spec).partition(":")
    rows = data.rows(split)
    rows = rows[np.char.startswith(data.voice[rows].astype(str), synth + ":")] if synth else rows
    if not len(rows):
        raise EdgelearnError(f"held-out group {spec!r} has no rows", fix="use SPLIT:SYNTH, e.g. train:festival")
    return rows


def simulate(cfg: SimConfig, out_dir, data=None, progress: bool = True, fleet=None, negatives=None) -> dict:
    """Run the fleet until ``cfg.rounds`` rounds have closed; returns rounds, devices and bytes.
    ``fleet``: the shipped-head task's prepared devices (``voice_fleet``), else made here;
    ``negatives``: keyword-free speech for the aggregator to publish each version's operating point on
    (``host.data.negatives.stream_negatives``; ``init_state``'s)."""
    from concurrent.futures import ThreadPoolExecutor

    from edge.fl import FLClient
    from host.aggregator.app import status_of
    from host.aggregator.inprocess import make_state, small_params
    from host.fleet.cycle import Stats, Trained, begin, finish
    from edge.errors import EdgelearnError
    from host.fleet.data import extract_head, load_embeddings, partition_noniid
    from host.fleet.population import PartitionIndex, check_clients

    if cfg.task not in TASKS:
        raise EdgelearnError(f"fleet task {cfg.task!r} is unknown", fix="use shipped-head, or leave it empty")
    if cfg.partition not in PARTITIONS:
        raise EdgelearnError(f"fleet partition {cfg.partition!r} is unknown", fix="use noniid or derived")
    if not 0 <= cfg.round_gap < float("inf"):
        raise EdgelearnError(f"round gap {cfg.round_gap} is below 0 or not a number",
                             fix="pass the simulated seconds between rounds, e.g. 3600, or 0")
    check_clients(cfg)  # a quorum above the population: rounds that never close
    shipped = cfg.task == "shipped-head"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = data or load_embeddings(progress=progress)
    held = data.rows(cfg.heldout_split if shipped else "test")
    if held.size == 0:
        raise EdgelearnError(f"the embedding set has no {cfg.heldout_split if shipped else 'test'!r} rows for the "
                             "held-out check", fix="give it rows of that split")
    s = cfg.time_scale
    acfg = aggregator_config(cfg)
    if shipped:
        params = extract_head()
        if fleet is None:
            fleet = voice_fleet(cfg, out / "users", progress=progress)
        if len(fleet) != cfg.devices:
            raise EdgelearnError(f"{len(fleet)} prepared devices for a fleet of {cfg.devices}",
                                 fix="prepare one per device (voice_fleet)")
        local = [(f["X"], f["y"]) for f in fleet]
        trainer = device_trainer(cfg, fleet[0]["device"].bundle.labels)
    else:
        params = small_params(cfg.seed) if cfg.fresh_head else extract_head()
        if cfg.partition == "derived":  # each device's rows from its index and the seed (host.fleet.population)
            index = PartitionIndex(data, cfg.seed)
            parts = [index.rows(i) for i in range(cfg.devices)]
        else:
            parts = partition_noniid(data, cfg.devices, seed=cfg.seed)
        local = [(data.X[p], data.y[p]) for p in parts]
        trainer = None
    if cfg.partition == "derived":  # the derived population's keys too, provisioned in bulk
        from host.fleet.population import device_id, device_key, init_population
        state = init_population(out, acfg, cfg.devices, cfg.seed, params, (data.X[held], data.y[held]))
        keys = {device_id(i): device_key(cfg.seed, i) for i in range(cfg.devices)}
    else:
        groups = None
        if shipped and cfg.heldout_groups:
            parts = [held] + [group_rows(data, g) for g in cfg.heldout_groups]
            held, groups = np.concatenate(parts), np.repeat(np.arange(len(parts)), [len(p) for p in parts])
        heldout = (data.X[held], data.y[held])
        if shipped:  # gated as the 12-class task a device reports (host.evaluate.to12)
            from host.evaluate import to12

            heldout += (to12(np.arange(len(fleet[0]["device"].bundle.labels))), groups)
        rehearsal = None
        if shipped and cfg.rehearsal_per_command:
            rows = simulated_rehearsal(data, cfg, fleet[0]["device"].bundle.labels)
            rehearsal = (data.X[rows], data.y[rows])
        state, keys = make_state(out, acfg, n_devices=cfg.devices, params=params, heldout=heldout,
                                 negatives=negatives, rehearsal=rehearsal)
    app, server, th, port = serve_aggregator(state, cfg)
    agg = app.state.aggregator
    rng = np.random.default_rng(cfg.seed)
    devices = []
    for i, (dev, key) in enumerate(keys.items()):
        c = FLClient(f"http://127.0.0.1:{port}", dev, key, out / "devices" / dev, trusted_keys=state / "keys",
                     data=local[i], trainer=trainer, seed=cfg.seed * 1000 + i)
        devices.append(Device(i, c, np.random.default_rng([cfg.seed, i]), cfg))
    t0 = time.monotonic()
    stats = Stats()
    stop = threading.Event()
    closed = [0]  # rounds closed so far (the main loop's count): the skipped gaps a device's clock adds

    def closed_rounds():
        return agg.store.one("SELECT COUNT(*) FROM rounds WHERE status IN ('closed','rejected')")[0]

    def life(d: Device):
        while not stop.is_set():
            now_sim = (time.monotonic() - t0) / s
            if d.next_at > now_sim:
                time.sleep(min(0.05, (d.next_at - now_sim) * s))
                continue
            got = begin(d.client, d.state(device_clock(now_sim, closed[0], cfg)), cfg, d.rng, d.slow, stats)
            if not isinstance(got, Trained):  # ("wait" | "retry", simulated seconds)
                d.next_at = now_sim + got[1]
                continue
            d.trained()
            # the device's compute and radio time; our real training time is part of it
            time.sleep(got.remaining(cfg))
            outcome = finish(d.client, got, cfg, d.rng, stats)
            if outcome == "dropped":
                d.next_at = (time.monotonic() - t0) / s + cfg.round_timeout
                continue
            d.joined += outcome == "uploaded"
            d.next_at = (time.monotonic() - t0) / s + d.rng.uniform(1, 5)

    mcu = None
    if cfg.mcu_devices:  # the MCU tier federates its own model with its own aggregator, side by side
        from host.fleet.mcu import run_mcu_cohort
        mcu_pool = ThreadPoolExecutor(max_workers=1)
        mcu = mcu_pool.submit(run_mcu_cohort, out / "mcu", cfg.mcu_devices, cfg.mcu_reports, seed=cfg.seed)
    # one thread per device: they spend most of their time asleep (simulated latency and back-off)
    pool = ThreadPoolExecutor(max_workers=len(devices))
    futs = [pool.submit(life, d) for d in devices]
    last = 0.0
    try:
        while (n_closed := closed_rounds()) < cfg.rounds:
            closed[0] = n_closed
            time.sleep(0.05)
            if progress and time.monotonic() - last > 0.5:
                last = time.monotonic()
                r = agg.rounds.round
                print(f"\rfleet: round {r['round_id']} v{agg.registry.current} selected {r['selected']} "
                      f"accepted {r['accepted']}/{r['target']}  closed {closed_rounds()}/{cfg.rounds}  "
                      f"uploads {stats['uploads']} drops {stats['drops']} late/errors {stats['errors']}  "
                      f"t_sim {(time.monotonic() - t0) / s:,.0f}s", end="", file=sys.stderr, flush=True)
    finally:
        stop.set()
        if mcu is not None and sys.exc_info()[0] is not None:  # interrupted: no more boards start
            from host.fleet.mcu import CANCEL
            CANCEL.set()
        for f in futs:
            f.result()
        pool.shutdown()
        status = status_of(agg, rounds_limit=None)  # a run with many failed rounds has more than 50
        stats = stats.as_dict()
        server.should_exit = True
        th.join(timeout=10)
    if progress:
        print(file=sys.stderr)
    rounds = sorted(status["rounds"], key=lambda r: r["round_id"])
    for r in rounds:
        r["duration_sim"] = None if r["closed"] is None else (r["closed"] - r["opened"]) / s
    res = {"config": cfg.__dict__, "rounds": [r for r in rounds if r["status"] != "open"], "stats": stats,
           "participation": [d.joined for d in devices], "bytes_up": sum(d.client.bytes_up for d in devices),
           "initial_accuracy": status["models"][0]["accuracy"], "models": status["models"],
           "wall_seconds": time.monotonic() - t0, "final_version": max(m["version"] for m in status["models"])}
    if mcu is not None:
        res["mcu"] = mcu.result()
        mcu_pool.shutdown()
    return res
