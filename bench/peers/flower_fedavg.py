"""Flower's simulation engine (Ray backend) on the fleet-scale FedAvg task: the reference side of
bench/fleet_scale.py. Runs in its own virtualenv (.venv-flower, ``flwr[simulation]``, which pins
its own Ray) and imports nothing of edgelearn:

    .venv-flower/bin/python bench/peers/flower_fedavg.py JOB.json OUT.json

JOB: {"data": NPZ, "population": P, "clients_per_round": K, "rounds": R, "local_epochs",
"learning_rate", "batch_size", "client_cpus", "seed"}. NPZ (written by bench/fleet_scale.py from
``host.fleet.scale``): the embeddings ``X``/``y``, the population's partition as ``offsets`` and
``rows`` (device i trains on ``X[rows[offsets[i]:offsets[i + 1]]]``, the same rows our simulated
device i derives), the held-out ``hx``/``hy`` and the initial head (``p:proj.w`` ...). The model
and the local step are the federated head's (``edge.adapt.EmbeddingHead``: ReLU projection, then
the classifier; plain SGD on the mean cross-entropy, a fresh permutation per epoch), in numpy.

OUT: {"version", "ray_version", "round_seconds": [...], "accuracy": [...], "clients": [...],
"setup_seconds", "total_seconds"}. A round's seconds run from the strategy configuring it to its
aggregate (training on every sampled node included, the held-out evaluation not).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

_DATA: dict = {}


def _data(path: str) -> dict:
    if path not in _DATA:
        with np.load(path) as z:
            _DATA[path] = {k: z[k] for k in z.files}
    return _DATA[path]


def logits(p: dict, X: np.ndarray):
    z1 = X @ p["proj.w"] + p["proj.b"]
    h = np.maximum(z1, 0.0)
    return h @ p["classifier.w"] + p["classifier.b"], z1, h


def sgd_step(p: dict, X: np.ndarray, y: np.ndarray, lr: float) -> None:
    z, z1, h = logits(p, X)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    d = e / e.sum(axis=1, keepdims=True)
    d[np.arange(len(y)), y] -= 1.0
    d /= len(y)
    g_cw, g_cb = h.T @ d, d.sum(axis=0)
    dh = (d @ p["classifier.w"].T) * (z1 > 0)
    g_pw, g_pb = X.T @ dh, dh.sum(axis=0)
    for k, g in (("classifier.w", g_cw), ("classifier.b", g_cb), ("proj.w", g_pw), ("proj.b", g_pb)):
        p[k] -= np.float32(lr) * g.astype(np.float32)


def local_train(p: dict, X, y, epochs: int, lr: float, bs: int, rng) -> dict:
    p = {k: v.copy() for k, v in p.items()}
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for a in range(0, len(y), bs):
            sgd_step(p, X[order[a:a + bs]], y[order[a:a + bs]], lr)
    return p


def main(job_path: str, out_path: str) -> int:
    import flwr
    import ray
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    job = json.loads(open(job_path).read())
    data = _data(job["data"])
    names = sorted(k[2:] for k in data if k.startswith("p:"))
    init = {k: data["p:" + k].astype(np.float32) for k in names}
    P, K, R = int(job["population"]), int(job["clients_per_round"]), int(job["rounds"])
    timing: dict = {"start": {}, "end": {}, "clients": {}, "accuracy": {}}

    client = ClientApp()

    @client.train()
    def train(msg: Message, ctx: Context) -> Message:
        d = _data(job["data"])
        i = int(ctx.node_config["partition-id"])
        rows = d["rows"][d["offsets"][i]:d["offsets"][i + 1]]
        cfg = msg.content["config"]
        params = msg.content["arrays"].to_numpy_ndarrays()
        p = dict(zip(names, params))
        rng = np.random.default_rng([int(job["seed"]), i, int(cfg["server-round"])])
        new = local_train(p, d["X"][rows], d["y"][rows].astype(np.int64), int(job["local_epochs"]),
                          float(job["learning_rate"]), int(job["batch_size"]), rng)
        content = RecordDict({"arrays": ArrayRecord([new[k] for k in names]),
                              "metrics": MetricRecord({"num-examples": len(rows)})})
        return Message(content=content, reply_to=msg)

    class TimedFedAvg(FedAvg):
        def configure_train(self, server_round, arrays, config, grid):
            timing["start"][server_round] = time.perf_counter()
            return super().configure_train(server_round, arrays, config, grid)

        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            out = super().aggregate_train(server_round, replies)
            timing["end"][server_round] = time.perf_counter()
            timing["clients"][server_round] = sum(1 for r in replies if r.has_content())
            return out

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        p = dict(zip(names, arrays.to_numpy_ndarrays()))
        acc = float(np.mean(np.argmax(logits(p, data["hx"])[0], axis=1) == data["hy"]))
        timing["accuracy"][server_round] = acc
        return MetricRecord({"accuracy": acc})

    server = ServerApp()

    @server.main()
    def run(grid: Grid, ctx: Context) -> None:
        strategy = TimedFedAvg(fraction_train=K / P, min_train_nodes=K, min_available_nodes=P,
                               fraction_evaluate=0.0, min_evaluate_nodes=0)
        strategy.start(grid=grid, initial_arrays=ArrayRecord([init[k] for k in names]), num_rounds=R,
                       train_config=ConfigRecord({}), evaluate_fn=evaluate)

    t0 = time.perf_counter()
    run_simulation(server_app=server, client_app=client, num_supernodes=P,
                   backend_config={"client_resources": {"num_cpus": float(job.get("client_cpus", 1.0)),
                                                        "num_gpus": 0.0}})
    total = time.perf_counter() - t0
    rounds = sorted(timing["end"])
    out = {"version": flwr.__version__, "ray_version": ray.__version__,
           "round_seconds": [round(timing["end"][r] - timing["start"][r], 3) for r in rounds],
           "clients": [timing["clients"][r] for r in rounds],
           "accuracy": [timing["accuracy"].get(r) for r in rounds],
           "initial_accuracy": timing["accuracy"].get(0),
           "setup_seconds": round((timing["start"][rounds[0]] - t0) if rounds else total, 3),
           "total_seconds": round(total, 3)}
    with open(out_path, "w") as f:
        json.dump(out, f)
    return 0 if len(rounds) == R else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
