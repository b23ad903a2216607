"""Deterministic lock-step federated rounds: the real aggregator and real clients, the same devices,
data and selections every run, so configurations (codecs, strategies, DP) can be compared side by side.

``simulate`` (host/fleet/simulate.py) is the realistic fleet: threads, wall
clock, drop-outs, nondeterministic arrival order. Comparing two codecs there
mixes codec effects with scheduling noise; here each round picks the same
devices from a seeded generator, each trains with its own seeded generator,
and uploads through the aggregator's HTTP interface (in-process ASGI, no
sockets), so the only difference between two runs is the configuration.

    res = run_lockstep(LockstepConfig(rounds=30, codec="topk_int8", topk_fraction=0.02), "out/topk")
    res["final_accuracy"], res["bytes_up"], res["frame_bytes"]
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class LockstepConfig:
    devices: int = 40
    clients_per_round: int = 10
    rounds: int = 30
    codec: str = "dense_f32"
    topk_fraction: float = 0.05
    adapt_strategy: str = ""         # "bias-only": subset frames of the biases alone
    strategy: str = "fedavg"
    local_epochs: int = 5
    learning_rate: float = 0.1
    batch_size: int = 16
    fresh_head: bool = True          # start from a random classifier (the shipped one is already trained)
    seed: int = 0
    extra: dict = field(default_factory=dict)  # more AggregatorConfig settings (dp_clip, dp_noise, ...)


def run_lockstep(cfg: LockstepConfig, out_dir, data=None, progress: bool = True) -> dict:
    """Run ``cfg.rounds`` rounds; returns per-round accuracy and bytes, totals and the final accuracy."""
    from edge.errors import EdgelearnError
    from edge.fl import FLClient
    from host.aggregator.app import build_app, status_of
    from host.aggregator.config import AggregatorConfig
    from host.aggregator.inprocess import InProcessTransport, make_state, small_params
    from host.fleet.data import extract_head, load_embeddings, partition_noniid
    from host.fleet.population import check_clients

    check_clients(cfg)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = data if data is not None else load_embeddings(progress=progress)
    held = data.rows("test")
    acfg = AggregatorConfig(clients_per_round=cfg.clients_per_round, overselect=1.0, round_timeout=1e9,
                            strategy=cfg.strategy, codec=cfg.codec, topk_fraction=cfg.topk_fraction,
                            adapt_strategy=cfg.adapt_strategy, local_epochs=cfg.local_epochs,
                            learning_rate=cfg.learning_rate, batch_size=cfg.batch_size,
                            # every aggregate is published: the comparison is of training, not of the gate
                            eval_tolerance=1.0, fairness_window=1, max_rounds_per_window=1 << 30,
                            synchronous="normal", seed=cfg.seed, **cfg.extra)
    params = small_params(cfg.seed) if cfg.fresh_head else extract_head()
    state, keys = make_state(out, acfg, n_devices=cfg.devices, params=params, heldout=(data.X[held], data.y[held]))
    parts = partition_noniid(data, cfg.devices, seed=cfg.seed)
    app = build_app(state, tick_interval=0)
    agg = app.state.aggregator
    pick = np.random.default_rng([cfg.seed, 1])
    rounds, frame_bytes = [], []
    awake = {"battery": 1.0, "charging": True, "network": "wifi", "temperature": 25.0}
    with InProcessTransport(app) as t:
        clients = [FLClient(t, dev, key, out / "devices" / dev, trusted_keys=state / "keys",
                            data=(data.X[parts[i]], data.y[parts[i]]), seed=cfg.seed * 1000 + i)
                   for i, (dev, key) in enumerate(keys.items())]
        for r in range(cfg.rounds):
            up0 = sum(c.bytes_up for c in clients)
            for i in sorted(pick.choice(cfg.devices, cfg.clients_per_round, replace=False)):
                c = clients[i]
                ans = c.checkin(awake)
                if ans.get("action") != "train":
                    raise EdgelearnError(f"round {r + 1}: device {c.device_id} was not given a task ({ans})",
                                         fix="lock-step runs need every chosen device selected")
                task = ans["task"]
                delta, n = c.train(task)
                frame = c.encode(task, delta, n)
                frame_bytes.append(len(frame))
                c.upload(frame, int(task.get("chunk_size", 0)))
            last = next(x for x in status_of(agg)["rounds"] if x["status"] != "open")
            rounds.append({"round": r + 1, "status": last["status"], "accuracy": last["accuracy"],
                           "bytes": sum(c.bytes_up for c in clients) - up0})
            if progress:
                print(f"\rlockstep {cfg.codec}{'/' + cfg.adapt_strategy if cfg.adapt_strategy else ''}: "
                      f"round {r + 1}/{cfg.rounds} accuracy {last['accuracy']:.4f}", end="",
                      file=sys.stderr, flush=True)
        status = status_of(agg)
    if progress:
        print(file=sys.stderr)
    return {"config": asdict(cfg), "rounds": rounds, "initial_accuracy": status["models"][0]["accuracy"],
            "final_accuracy": rounds[-1]["accuracy"] if rounds else None,
            "bytes_up": sum(c.bytes_up for c in clients), "frames": len(frame_bytes),
            "frame_bytes": float(np.mean(frame_bytes)) if frame_bytes else 0.0}
