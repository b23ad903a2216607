"""The fleet simulator on a Ray cluster: simulated devices as batched Ray tasks against a real
aggregator, for fleets one machine's threads cannot hold (10,000 devices a round).

The driver (this process) serves a fresh aggregator (``simulate.serve_aggregator``: uvicorn in a
thread; the population provisioned in bulk) and keeps ``ray_in_flight`` tasks running. Each task takes
a batch of device indices (``ray_batch``, fewer for a small fleet; one task per device costs more
in Ray's scheduling than a device's round does) and runs every device through the same cycle as
the in-process simulator (``host.fleet.cycle``: the real ``edge.fl.FLClient`` over HTTP: check in,
download and verify the signed bundle, train, encode, then a log-normal latency with a slow
minority, a drop-out or the upload); the batch's devices train one after another, and each
delivers at its due time (between the next devices' training, or sleeping for the last ones).
Devices are derived from their index and the seed when scheduled (``host.fleet.population``), in a
fresh state directory removed after its round, so memory is flat in the number of devices not in a
round: the driver holds counters, a worker one batch. Devices check in in a permutation of the
population (``VisitOrder``), a new one each time a round closes.

A task whose worker or node dies is counted in ``ray.lost`` (its devices dropped out: the
aggregator's deadline and over-selection cover them, as for any drop-out) and the run goes on on
the nodes left. Per-task resources: ``ray_task_cpus`` (fractions allowed) and ``ray_task_memory_mb`` are a batch's, which
is one device's too (its devices run one at a time). Within a worker process, devices share the
verified bundle files of the newest version the worker installed (hard links into each device's
store; the first device of each version on a worker downloads, verifies and smoke-checks it, the
others verify their installed copy when training loads it).

    res = simulate_ray(SimConfig(devices=20000, clients_per_round=10000, rounds=3), "out", address="local")
    res["ray"]["nodes"]      # {node id: devices run there}
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edge.errors import EdgelearnError


@dataclass
class RayOptions:
    ray_batch: int = 100             # devices per Ray task
    ray_task_cpus: float = 1.0       # Ray num_cpus of one task (= of one device: a task runs its devices in turn)
    ray_task_memory_mb: int = 0      # Ray memory of one task (0: none requested)
    ray_in_flight: int = 0           # tasks submitted at once (0: 2 per CPU of the cluster)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise EdgelearnError("Ray is not installed, so --ray cannot run the fleet on a cluster",
                             fix="pip install 'edgelearn[ray]' (ray==2.60.0), or drop --ray") from None
    return ray


def _reachable(address: str) -> None:
    """One sentence if ``address`` (HOST:PORT of a Ray head's GCS) is malformed or nothing listens there
    (ray.init would otherwise retry for a minute)."""
    host, sep, port = address.rpartition(":")
    fix = "start one with `ray start --head` and pass the address it prints (HOST:PORT), or use --ray local"
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise EdgelearnError(f"--ray {address!r} is not local, auto or HOST:PORT of a Ray cluster", fix=fix)
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        raise EdgelearnError(f"no Ray cluster answers at {address} ({e.strerror or e})", fix=fix) from None


def connect(address: str):
    """``ray.init`` for ``local`` (a new single-node Ray in this process), ``auto`` (the cluster
    ``ray start`` left on this machine) or ``HOST:PORT`` / ``ray://HOST:PORT``; returns ray."""
    ray = _import_ray()
    if ray.is_initialized():
        return ray
    kw = dict(logging_level="ERROR", log_to_driver=False)
    try:
        if address == "local":
            ray.init(include_dashboard=False, **kw)
        else:
            if address != "auto" and not address.startswith("ray://"):
                _reachable(address)
            ray.init(address=address, **kw)
    except ray.exceptions.AuthenticationError:
        raise EdgelearnError(f"the Ray cluster at {address} refused this driver's token (missing or not the "
                             "cluster's)", fix="set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH (or RAY_AUTH_TOKEN) "
                             "to the token the cluster was started with") from None
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise EdgelearnError(f"cannot join the Ray cluster at {address!r} ({str(e).splitlines()[0][:160]})",
                             fix="start one with `ray start --head` and pass its address, or use --ray local") from None
    return ray


def _bind_host(ray) -> tuple[str, str]:
    """(address the aggregator binds, address devices use): loopback when every node is this machine."""
    me = ray.util.get_node_ip_address()
    ips = {n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
    return ("127.0.0.1", "127.0.0.1") if ips <= {me} else ("0.0.0.0", me)


# --- the worker side ---------------------------------------------------------------------------
class _Worker:
    """What a Ray worker process keeps between its batches: the partition index, the trusted key,
    the newest verified bundle files (hard-linked into each device's store). No device state."""

    def __init__(self, ctx):
        from host.fleet.data import EmbeddingSet
        from host.fleet.population import PartitionIndex

        self.run = ctx["run"]
        # device state lives in tmpfs when there is one: it is thrown away after the device's round,
        # and the client's fsyncs (seq, bundle pointer) would otherwise bound a worker's devices per second
        shm = Path("/dev/shm")
        base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
        _sweep(base)
        self.root = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=base))
        atexit.register(shutil.rmtree, self.root, True)
        (self.root / "keys").mkdir()
        (self.root / "keys" / "aggregator.pub").write_text(ctx["public_key"])
        d = ctx["data"]
        self.data = EmbeddingSet(d["X"], d["y"], d["voice"], d["split"])
        self.index = PartitionIndex(self.data, ctx["cfg"]["seed"])
        self.cached = None  # (version, directory)

    def seed_store(self, state_dir: Path) -> None:
        if self.cached is not None:
            shutil.copytree(self.cached[1], state_dir / "store", copy_function=os.link)

    def keep_store(self, state_dir: Path, version: int) -> None:
        if self.cached is not None and self.cached[0] >= version:
            return
        dst = self.root / f"bundle-v{version}"
        shutil.copytree(state_dir / "store", dst, copy_function=os.link, dirs_exist_ok=True)
        old, self.cached = self.cached, (version, dst)
        if old is not None:
            shutil.rmtree(old[1], ignore_errors=True)


_WORKER: dict = {}
_PREFIX = "edgelearn-fleet-"


def _sweep(base: Path) -> None:
    """Remove what workers that were killed (a cancelled task, a stopped cluster) left in ``base``:
    their directories are named after their pid."""
    if not Path("/proc/self").exists():
        return  # no way to tell a live worker's directory from a dead one's
    for d in base.glob(f"{_PREFIX}*-*"):
        pid = d.name[len(_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)


def run_batch(ctx: dict, ids: list, epoch: int) -> dict:
    """One Ray task: devices ``ids`` each run one cycle (``host.fleet.cycle``); their counters back."""
    import ray

    from edge.fl import FLClient
    from host.fleet.cycle import Stats, Trained, begin, finish
    from host.fleet.population import DerivedDevice, device_id, device_key, write_device_state
    from host.fleet.simulate import SimConfig

    w = _WORKER.get(ctx["run"])
    if w is None:
        w = _WORKER[ctx["run"]] = _Worker(ctx)
    cfg = SimConfig(**ctx["cfg"])
    stats = Stats(keep_latencies=200)
    t_start, pend, joined, bytes_up = time.monotonic(), [], [], 0

    def done(client, d):
        nonlocal bytes_up
        bytes_up += client.bytes_up
        client.http.close()
        shutil.rmtree(d, ignore_errors=True)

    def deliver(until: float | None) -> None:
        """Deliver the trained updates due by ``until`` (None: all, sleeping until each is due)."""
        pend.sort(key=lambda p: p[0])
        while pend and (until is None or pend[0][0] <= until):
            due, i, client, got, rng, d = pend.pop(0)
            time.sleep(max(0.0, due - time.monotonic()))
            if finish(client, got, cfg, rng, stats) == "uploaded":
                joined.append(int(i))
            done(client, d)

    for i in ids:
        dev = DerivedDevice(i, cfg)
        d = w.root / "devices" / device_id(i)
        shutil.rmtree(d, ignore_errors=True)
        write_device_state(d, ctx["t0"])
        w.seed_store(d)
        rows = w.index.rows(i)
        client = FLClient(ctx["url"], device_id(i), device_key(cfg.seed, i), d, trusted_keys=w.root / "keys",
                          data=(w.data.X[rows], w.data.y[rows]), seed=[cfg.seed, i, epoch])
        rng = dev.rng(epoch)
        got = begin(client, dev.status((time.time() - ctx["t0"]) / cfg.time_scale), cfg, rng, dev.slow, stats)
        if isinstance(got, Trained):
            w.keep_store(d, int(got.task["model_version"]))
            pend.append((got.due(cfg), i, client, got, rng, d))
        else:
            done(client, d)
        deliver(time.monotonic())  # the devices that are done training upload before the next one starts
    deliver(None)
    return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(), "stats": stats.as_dict(),
            "joined": joined, "bytes_up": bytes_up, "devices": len(ids), "seconds": time.monotonic() - t_start}


# --- the driver --------------------------------------------------------------------------------
def _check(cfg) -> None:
    if cfg.task not in ("", "fresh-head"):
        raise EdgelearnError(f"fleet task {cfg.task!r} does not run on Ray (its users are prepared devices "
                             "with their own audio and state)", fix="run it without --ray")
    if cfg.extra.get("secure_aggregation"):
        raise EdgelearnError("secure aggregation does not run on Ray (a batch's devices deliver one after "
                             "another, a secure round needs them all in each phase)", fix="run it without --ray")
    if cfg.round_gap:
        raise EdgelearnError("a round gap (--round-gap) does not run on Ray (its devices' state follows the "
                             "driver's clock alone)", fix="run it without --ray, or with --round-gap 0")
    if cfg.mcu_devices:
        raise EdgelearnError("the MicroPython boards (--mcu-devices) do not run on Ray", fix="run them without --ray")
    from host.fleet.population import check_clients
    check_clients(cfg)


def simulate_ray(cfg, out_dir, address: str = "local", opts: RayOptions | None = None, data=None,
                 progress: bool = True) -> dict:
    """Run the fleet on Ray until ``cfg.rounds`` rounds have closed; the result of ``simulate``
    (rounds, stats, participation of the devices that joined, bytes) plus ``ray``: the address,
    devices run per node, tasks, and each closed round's wall seconds."""
    from host.aggregator.app import status_of
    from host.aggregator.inprocess import small_params
    from host.fleet.cycle import Stats
    from host.fleet.data import extract_head, load_embeddings
    from host.fleet.population import VisitOrder, init_population
    from host.fleet.simulate import aggregator_config, serve_aggregator

    opts = opts or RayOptions()
    _check(cfg)
    if opts.ray_batch < 1 or opts.ray_task_cpus <= 0 or opts.ray_task_memory_mb < 0:
        raise EdgelearnError(f"Ray options batch={opts.ray_batch}, task_cpus={opts.ray_task_cpus}, "
                             f"task_memory_mb={opts.ray_task_memory_mb}", fix="use batch >= 1, task_cpus > 0, memory >= 0")
    ray = connect(address)  # a refused address or a missing Ray is said before --out is created
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = data or load_embeddings(progress=progress)
    held = data.rows("test")
    params = small_params(cfg.seed) if cfg.fresh_head else extract_head()
    state = init_population(out, aggregator_config(cfg), cfg.devices, cfg.seed, params, (data.X[held], data.y[held]))
    bind, advertised = _bind_host(ray)
    app, server, th, port = serve_aggregator(state, cfg, host=bind)
    agg = app.state.aggregator
    t0 = time.time()
    ctx = ray.put({"run": f"{os.getpid()}-{t0}", "url": f"http://{advertised}:{port}", "t0": t0,
                   "cfg": {k: v for k, v in asdict(cfg).items()},
                   "public_key": (state / "keys" / "aggregator.pub").read_text(),
                   "data": {"X": data.X, "y": data.y, "voice": data.voice, "split": data.split}})
    res_kw = {"num_cpus": opts.ray_task_cpus}
    if opts.ray_task_memory_mb:
        res_kw["memory"] = opts.ray_task_memory_mb * 2**20
    task = ray.remote(max_retries=0, **res_kw)(run_batch)
    cpus = ray.cluster_resources().get("CPU", 1)
    in_flight = opts.ray_in_flight or max(2, int(2 * cpus / opts.ray_task_cpus))
    batch = max(1, min(opts.ray_batch, -(-cfg.devices // (2 * in_flight))))  # a small fleet spreads over the tasks
    stats, nodes, joined = Stats(keep_latencies=5000), {}, {}
    bytes_up, n_tasks, sizes, lost = 0, 0, {}, {"tasks": 0, "devices": 0, "last": None}

    def closed_rounds():
        return agg.store.one("SELECT COUNT(*) FROM rounds WHERE status IN ('closed','rejected')")[0]

    def collect(ref):
        nonlocal bytes_up
        n = sizes.pop(ref, 0)
        try:
            r = ray.get(ref)
        except ray.exceptions.RayError as e:  # its worker or node died: its devices dropped out mid-round
            lost["tasks"] += 1
            lost["devices"] += n
            lost["last"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            return
        stats.merge(r["stats"])
        nodes[r["node"]] = nodes.get(r["node"], 0) + r["devices"]
        for i in r["joined"]:
            joined[i] = joined.get(i, 0) + 1
        bytes_up += r["bytes_up"]

    epoch, seen = 0, closed_rounds()
    order = VisitOrder(cfg.devices, cfg.seed, epoch)
    pending, last = [], 0.0
    t_wall = time.monotonic()
    try:
        while seen < cfg.rounds:
            while len(pending) < in_flight:
                ids = order.take(batch)
                if not ids:  # every device visited in this epoch: another permutation once all are back
                    if pending:
                        break
                    epoch += 1
                    order = VisitOrder(cfg.devices, cfg.seed, epoch)
                    continue
                ref = task.remote(ctx, ids, epoch)
                pending.append(ref)
                sizes[ref] = len(ids)
                n_tasks += 1
            ready, pending = ray.wait(pending, num_returns=1, timeout=0.25)
            for ref in ready:
                collect(ref)
            now = closed_rounds()
            if now > seen:  # a round closed: the next one draws devices in a fresh order
                seen, epoch = now, epoch + 1
                order = VisitOrder(cfg.devices, cfg.seed, epoch)
            if progress and time.monotonic() - last > 0.5:
                last = time.monotonic()
                r = agg.rounds.round
                print(f"\rfleet on ray: round {r['round_id']} selected {r['selected']} accepted {r['accepted']}/"
                      f"{r['target']}  closed {seen}/{cfg.rounds}  uploads {stats['uploads']} drops "
                      f"{stats['drops']} late/errors {stats['errors']}  tasks {n_tasks}", end="",
                      file=sys.stderr, flush=True)
        while pending:  # what was running when the last round closed finishes against the next one
            collect(pending.pop())
    finally:
        # only what was never collected (an error or Ctrl-C above): force-cancelling tasks already
        # finished and fetched crashed Ray's core worker in the driver ("Tried to complete task that
        # was not pending")
        for ref in pending:
            ray.cancel(ref, force=True)
        status = status_of(agg, rounds_limit=None)
        server.should_exit = True
        th.join(timeout=10)
        if address == "local":
            ray.shutdown()
    if progress:
        print(file=sys.stderr)
    rounds = sorted(status["rounds"], key=lambda r: r["round_id"])
    for r in rounds:
        r["duration_sim"] = None if r["closed"] is None else (r["closed"] - r["opened"]) / cfg.time_scale
        r["wall_seconds"] = None if r["closed"] is None else r["closed"] - r["opened"]
    return {"config": asdict(cfg), "rounds": [r for r in rounds if r["status"] != "open"], "stats": stats.as_dict(),
            "participation": sorted(joined.values()), "bytes_up": bytes_up,
            "initial_accuracy": status["models"][0]["accuracy"], "models": status["models"],
            "wall_seconds": time.monotonic() - t_wall, "final_version": max(m["version"] for m in status["models"]),
            "ray": {"address": address, "nodes": nodes, "tasks": n_tasks, "batch": batch,
                    "task_cpus": opts.ray_task_cpus, "task_memory_mb": opts.ray_task_memory_mb, "in_flight": in_flight, "lost": lost,
                    "participation_note": "devices that joined at least one round; the others are never materialised"}}
