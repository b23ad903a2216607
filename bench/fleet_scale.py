"""Fleet simulation at scale: wall time per round and peak memory at 1,000 and 10,000 clients per
round, ours (the in-process simulator, Ray on one node, Ray on two nodes) beside Flower's
simulation engine (``flwr``, Ray backend) on the same FedAvg task, in one run.

The task: the federated head (ReLU projection + 37-way classifier, 6.5k parameters, from the same
random start) on the corpus embeddings; device i holds the rows ``host.fleet.population.
PartitionIndex(seed=0).rows(i)`` (one voice, 12 of the words, at most 32 clips, 3 noise clips), a
population of 12,000; 2 local epochs of SGD (lr 0.1, batch 16); FedAvg weighted by examples.
Flower gets the same rows (the whole population's partition, saved to an npz) and the same model
and step in numpy (bench/peers/flower_fedavg.py, in .venv-flower). For a like-for-like round, our
devices are all eligible (min_battery 0), never drop out, are never slow, and the aggregator selects
exactly the clients per round (overselect 1.0); their simulated latency is scaled to milliseconds.
Ours runs the real device path per client (edge.fl.FLClient over HTTP to the real aggregator:
signed check-in, bundle verification, training, int8 encoding with the portable codec, upload,
group-committed ingest, held-out gate and a signed bundle per version); Flower's clients receive and
return numpy arrays in memory.

Memory: peak of the summed resident memory (sampled every 0.5 s, /proc) of every process of the
run: the driver and its children, plus the Ray cluster's processes (GCS, raylets, workers, agents)
for ours on Ray; Flower's runner starts its own Ray, so its process tree is all of it. Flatness:
Ray (2 nodes) at 1,000 clients per round with populations of 12,000 and 100,000.

Each configuration runs in its own process, one after another. The in-process simulator at
10,000 clients per round (10,000+ threads and clients, each device's bundle on disk) is given a
fixed budget; if the round does not close, its accepted updates per second give a projection.

    $ edgelearn bench fleet_scale                     # ~15-20 min on 2 cores
    $ .venv/bin/python bench/fleet_scale.py --quick   # 300 / 1,000 clients per round, a smoke run
    $ .venv/bin/python bench/fleet_scale.py --flatness  # only the population 12,000 vs 100,000 pair (~3 min)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import row, write_results  # noqa: E402

POPULATION = 12_000
BIG_POPULATION = 100_000
SEED = 0
LOCAL_EPOCHS, LR, BATCH = 2, 0.1, 16
INPROCESS_BUDGET_S = 120
FLOWER_RUNNER = ROOT / "bench" / "peers" / "flower_fedavg.py"
FLOWER_HINT = ("python3 -m venv .venv-flower && .venv-flower/bin/pip install 'flwr[simulation]==1.42.0' "
               "(or make .venv-flower/bin/python)")


def flower_python() -> Path | None:
    py = Path(os.environ.get("EDGELEARN_FLOWER_PYTHON") or ROOT / ".venv-flower" / "bin" / "python")
    return py if py.is_file() else None


# --- one configuration (run in its own process) --------------------------------------------
def sim_config(k: int, population: int, rounds: int, timeout_s: float):
    from host.fleet.simulate import SimConfig

    scale = 0.001
    return SimConfig(devices=population, clients_per_round=k, rounds=rounds, time_scale=scale, drop_rate=0.0,
                     slow_fraction=0.0, overselect=1.0, round_timeout=timeout_s / scale, eval_tolerance=1.0,
                     local_epochs=LOCAL_EPOCHS, learning_rate=LR, partition="derived", seed=SEED,
                     extra={"max_overselect": 1.0, "min_battery": 0.0, "batch_size": BATCH,
                            "max_rounds_per_window": 10})


def run_one(spec: dict, out: Path) -> dict:
    from host.fleet.data import load_embeddings

    data = load_embeddings(progress=False)
    cfg = sim_config(spec["k"], spec["population"], spec["rounds"], spec.get("timeout_s", 1800))
    if spec["kind"] == "inprocess":
        from host.fleet.simulate import simulate
        res = simulate(cfg, out, data=data, progress=False)
    else:
        from host.fleet.ray_sim import RayOptions, simulate_ray
        res = simulate_ray(cfg, out, address=spec["address"], opts=RayOptions(ray_batch=spec.get("batch", 100)),
                           data=data, progress=False)
    rounds = [{"round_id": r["round_id"], "status": r["status"], "accepted": r["accepted"],
               "accuracy": r["accuracy"], "seconds": None if r["closed"] is None else round(r["closed"] - r["opened"], 3)}
              for r in res["rounds"]]
    return {"rounds": rounds, "stats": {k: v for k, v in res["stats"].items() if k != "latencies"},
            "nodes": res.get("ray", {}).get("nodes"), "initial_accuracy": res["initial_accuracy"],
            "wall_seconds": res["wall_seconds"]}


# --- the parent: runs each configuration as a child, sampling memory -------------------------
class Sampler(threading.Thread):
    """Peak summed RSS (MiB) of ``pids()`` every 0.5 s."""

    def __init__(self, pids):
        super().__init__(daemon=True)
        self.pids, self.peak, self.stop = pids, 0.0, threading.Event()

    def run(self):
        from host.fleet.ray_cluster import rss_mib
        while not self.stop.is_set():
            self.peak = max(self.peak, rss_mib(self.pids()))
            self.stop.wait(0.5)


def _kill_tree(pid: int) -> None:
    from host.fleet.ray_cluster import process_tree
    for p in process_tree([pid]):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _child(spec: dict, env=None, budget_s: float | None = None, extra_pids=None) -> dict:
    """Run one configuration in a child process; its result, peak memory, and (with a budget) the
    round's progress when the budget ran out."""
    from host.fleet.ray_cluster import process_tree

    with tempfile.TemporaryDirectory(prefix="fleet-scale-") as td:
        res_path, out = Path(td) / "res.json", Path(td) / "out"
        p = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--run", json.dumps(spec), str(out),
                              str(res_path)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        s = Sampler(lambda: process_tree([p.pid]) | (extra_pids() if extra_pids else set()))
        s.start()
        t0, progress = time.monotonic(), []
        try:
            while p.poll() is None:
                time.sleep(2)
                if budget_s is not None:
                    progress.append(_progress(out, time.monotonic() - t0))
                    first = next((x for x in progress if x and x["accepted"]), None)
                    t = time.monotonic() - t0
                    if (first and t - first["t"] > budget_s) or t > budget_s + 300:
                        _kill_tree(p.pid)
                        break
            err = p.stderr.read().decode(errors="replace") if p.stderr else ""
            p.wait()
        finally:
            s.stop.set()
            s.join()
            if p.poll() is None:
                _kill_tree(p.pid)
        res = json.loads(res_path.read_text()) if res_path.exists() else {"error": err.strip().splitlines()[-3:]}
        res["peak_rss_mib"] = round(s.peak, 1)
        res["process_seconds"] = round(time.monotonic() - t0, 1)
        if budget_s is not None and "rounds" not in res:
            seen = [x for x in progress if x]
            res["progress"] = [{"t": x["t"], "accepted": x["accepted"]} for x in seen]
            res["rounds"] = seen[-1]["rounds"] if seen else []
            res["stopped_after_budget"] = True
        return res


def _progress(out: Path, t: float):
    """The aggregator's rounds so far, read from its SQLite file (read-only; the child serves it)."""
    import sqlite3
    db = out / "agg" / "state.sqlite"
    if not db.exists():
        return None
    try:
        c = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            rows = c.execute("SELECT round_id, status, accepted, selected, opened, closed FROM rounds "
                             "ORDER BY round_id").fetchall()
        finally:
            c.close()
    except sqlite3.Error:
        return None
    if not rows:
        return None
    rounds = [{"round_id": r[0], "status": r[1], "accepted": r[2], "selected": r[3],
               "seconds": None if r[5] is None else round(r[5] - r[4], 3)} for r in rows]
    return {"t": round(t, 1), "accepted": sum(r["accepted"] for r in rounds), "rounds": rounds}


def _round_seconds(res: dict, warm: bool) -> float | None:
    secs = [r["seconds"] for r in res.get("rounds", []) if r["status"] == "closed" and r["seconds"] is not None]
    if not secs:
        return None
    return secs[-1] if warm and len(secs) > 1 else secs[0]


def ours(kind: str, k: int, population: int, rounds: int, nodes: int = 0, budget_s=None) -> dict:
    from host.fleet.ray_cluster import LocalCluster
    spec = {"kind": kind, "k": k, "population": population, "rounds": rounds}
    if kind == "inprocess":
        # its devices first check in spread over a fifth of the deadline: keep that short of the work
        return _child({**spec, "timeout_s": 120 if k <= 1000 else 300}, budget_s=budget_s)
    with LocalCluster(nodes=nodes, cpus_per_node=2 // nodes, object_store_mb=200 // nodes) as c:
        time.sleep(2)
        idle = c.rss_mib()
        res = _child({**spec, "address": c.address}, env=c.env(), extra_pids=c.pids)
        res["cluster_idle_rss_mib"] = round(idle, 1)
        return res


def flower(k: int, population: int, rounds: int, data_npz: Path) -> dict:
    from host.fleet.ray_cluster import process_tree
    py = flower_python()
    if py is None:
        return {"error": f"Flower is not set up: {FLOWER_HINT}"}
    job = {"data": str(data_npz), "population": population, "clients_per_round": k, "rounds": rounds,
           "local_epochs": LOCAL_EPOCHS, "learning_rate": LR, "batch_size": BATCH, "client_cpus": 1.0, "seed": SEED}
    env = {k_: v for k_, v in os.environ.items() if k_ not in ("PYTHONPATH", "PYTHONHOME")}
    with tempfile.TemporaryDirectory(prefix="fleet-flower-") as td:
        jp, op = Path(td) / "job.json", Path(td) / "out.json"
        jp.write_text(json.dumps(job))
        t0 = time.monotonic()
        p = subprocess.Popen([str(py), str(FLOWER_RUNNER), str(jp), str(op)], cwd=td, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        s = Sampler(lambda: process_tree([p.pid]))
        s.start()
        err = p.stderr.read().decode(errors="replace")
        p.wait()
        s.stop.set()
        s.join()
        res = json.loads(op.read_text()) if op.exists() else {"error": err.strip().splitlines()[-3:]}
        res["peak_rss_mib"] = round(s.peak, 1)
        res["process_seconds"] = round(time.monotonic() - t0, 1)
        res["rounds"] = [{"round_id": i + 1, "status": "closed", "seconds": t, "accuracy": a}
                         for i, (t, a) in enumerate(zip(res.get("round_seconds", []), res.get("accuracy", [])))]
        return res


def write_task(path: Path, population: int) -> None:
    import numpy as np

    from host.aggregator.inprocess import small_params
    from host.fleet.data import load_embeddings
    from host.fleet.population import PartitionIndex

    data = load_embeddings(progress=False)
    offsets, rows = PartitionIndex(data, SEED).partition(population)
    held = data.rows("test")
    np.savez(path, X=data.X, y=data.y, offsets=offsets, rows=rows, hx=data.X[held], hy=data.y[held],
             **{"p:" + k: v for k, v in small_params(SEED).items()})


def main(quick: bool = False) -> None:
    sizes = (300, 1000) if quick else (1000, 10_000)
    pop = 3000 if quick else POPULATION
    big = 20_000 if quick else BIG_POPULATION
    runs: dict = {}
    with tempfile.TemporaryDirectory(prefix="fleet-scale-task-") as td:
        npz = Path(td) / "task.npz"
        write_task(npz, pop)
        for k in sizes:
            rounds = 2 if k == sizes[0] else 1
            for name, fn in (("flower", lambda: flower(k, pop, rounds, npz)),
                             ("ray-2-nodes", lambda: ours("ray", k, pop, rounds, nodes=2)),
                             ("ray-1-node", lambda: ours("ray", k, pop, rounds, nodes=1)),
                             ("in-process", lambda: ours("inprocess", k, pop, rounds, budget_s=INPROCESS_BUDGET_S))):
                print(f"fleet_scale: {name} at {k:,} clients per round ...", file=sys.stderr, flush=True)
                runs[(name, k)] = fn()
                print(f"fleet_scale: {name} at {k:,}: " + json.dumps({x: runs[(name, k)].get(x) for x in (
                    "rounds", "peak_rss_mib", "error", "progress")})[:600], file=sys.stderr, flush=True)
        print(f"fleet_scale: ray-2-nodes at {sizes[0]:,} clients per round, population {big:,} ...", file=sys.stderr)
        runs[("ray-2-nodes-big", sizes[0])] = ours("ray", sizes[0], big, 2, nodes=2)
    write_results("fleet_scale", rows(runs, sizes, pop, big))


def flatness(k: int = 1000) -> None:
    """Only the memory-flatness pair, in one run: Ray (2 nodes), ``k`` clients per round, 2 rounds,
    populations of 12,000 and 100,000 (bench/results/fleet_scale_flatness.json)."""
    runs = {}
    for n in (POPULATION, BIG_POPULATION):
        print(f"fleet_scale: ray-2-nodes at {k:,} clients per round, population {n:,} ...", file=sys.stderr)
        runs[n] = ours("ray", k, n, 2, nodes=2)
        print(f"fleet_scale: population {n:,}: " + json.dumps({x: runs[n].get(x) for x in (
            "rounds", "peak_rss_mib", "error")})[:600], file=sys.stderr, flush=True)
    write_results("fleet_scale_flatness", [_flat_row(runs[POPULATION], runs[BIG_POPULATION], k, POPULATION,
                                                     BIG_POPULATION)])


def _flat_row(a: dict, b: dict, k: int, pop: int, big: int) -> dict:
    return row("fleet_scale", f"peak memory at {k:,} clients per round, population {big:,} (ray-2-nodes)",
               b.get("peak_rss_mib"), "MiB", f"population {pop:,}, same run", a.get("peak_rss_mib"),
               ratio=(b.get("peak_rss_mib") or 0) / (a.get("peak_rss_mib") or 1),
               round_seconds=_round_seconds(b, True), round_seconds_small_population=_round_seconds(a, True),
               rounds=b.get("rounds"), rounds_small_population=a.get("rounds"),
               cluster_idle_rss_mib=b.get("cluster_idle_rss_mib"), error=b.get("error") or a.get("error"),
               note="ratio: big population / small (1.0 = flat); both runs complete their rounds unless error says")


def rows(runs: dict, sizes, pop: int, big: int) -> list:
    out = []
    fl_version = next((r.get("version") for (n, _), r in runs.items() if n == "flower" and r.get("version")), None)
    for k in sizes:
        warm = k == sizes[0]
        ref = runs[("flower", k)]
        ref_s = _round_seconds(ref, warm)
        for name in ("in-process", "ray-1-node", "ray-2-nodes"):
            r = runs[(name, k)]
            secs = _round_seconds(r, warm)
            extra = {"rounds": r.get("rounds"), "flower_rounds": ref.get("rounds"), "nodes": r.get("nodes"),
                     "stats": r.get("stats"), "error": r.get("error"), "population": pop,
                     "flower_setup_seconds": ref.get("setup_seconds"), "flower_version": fl_version,
                     "note": ("the second round (the first includes worker start-up)" if warm else
                              "the first round, start-up included, for both") + "; clients per round = accepted updates"}
            if secs is None and r.get("progress"):
                pr = [x for x in r["progress"] if x["accepted"]]
                if len(pr) >= 2 and pr[-1]["accepted"] > pr[0]["accepted"]:
                    rate = (pr[-1]["accepted"] - pr[0]["accepted"]) / (pr[-1]["t"] - pr[0]["t"])
                    extra.update(projected=True, accepted_in_budget=pr[-1]["accepted"],
                                 budget_seconds=INPROCESS_BUDGET_S, updates_per_second=round(rate, 2),
                                 note=f"no round closed at quorum in its {INPROCESS_BUDGET_S} s budget (those "
                                      f"listed failed at their deadline): {pr[-1]['accepted']:,} updates accepted "
                                      f"in all; value projected as {k:,} / accepted updates per second")
                    secs = round(k / rate, 1)
            out.append(row("fleet_scale", f"wall time per round, {k:,} clients per round ({name})", secs, "s",
                           f"Flower {fl_version} simulation engine (Ray backend), same task", ref_s,
                           **extra))
            out.append(row("fleet_scale", f"peak memory, {k:,} clients per round ({name})", r.get("peak_rss_mib"),
                           "MiB", "Flower, same run", ref.get("peak_rss_mib"), cluster_idle_rss_mib=r.get(
                               "cluster_idle_rss_mib"), note="summed RSS of every process of the run"))
    out.append(_flat_row(runs[("ray-2-nodes", sizes[0])], runs[("ray-2-nodes-big", sizes[0])], sizes[0], pop, big))
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--run":
        spec, out, res_path = json.loads(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
        res_path.write_text(json.dumps(run_one(spec, out)))
    elif "--flatness" in sys.argv:
        flatness()
    else:
        main(quick="--quick" in sys.argv)
