"""One simulated device's federated cycle, shared by the in-process simulator (``simulate.py``: a
thread per device) and the Ray simulator (``ray_sim.py``: batches of devices per task): check in
with the real ``edge.fl.FLClient``, train and encode when given a task, draw the heavy-tailed
(log-normal, a slow minority 10x) training+upload latency, then either drop out (trained, never
uploads) or upload the frame (or drive the secure-aggregation exchange). Refusals are counted by
where they happened and the aggregator's reason.

    stats = Stats()
    got = begin(client, status, cfg, rng, slow, stats)      # ("wait", sim s) / ("retry", sim s) / Trained
    if isinstance(got, Trained):
        time.sleep(got.remaining(cfg))                        # the device's compute and radio time
        outcome = finish(client, got, cfg, rng, stats)        # "uploaded" / "dropped" / "refused"
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np


class Stats:
    """Counters of a fleet run (thread-safe): uploads, drops, errors, waits, latencies (simulated s),
    refusals by ``where:reason``. ``as_dict`` is what a result carries; ``merge`` adds another's."""

    def __init__(self, keep_latencies: int | None = None):
        self.lock = threading.Lock()
        self.keep = keep_latencies  # None: every latency; else at most this many (the first ones)
        self.d = {"uploads": 0, "drops": 0, "errors": 0, "waits": 0, "latencies": []}

    def add(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.d[key] += n

    def latency(self, sim_seconds: float) -> None:
        with self.lock:
            if self.keep is None or len(self.d["latencies"]) < self.keep:
                self.d["latencies"].append(round(sim_seconds, 3))

    def refuse(self, key: str, error: bool = True) -> None:
        with self.lock:
            if error:
                self.d["errors"] += 1
            r = self.d.setdefault("refused", {})
            r[key] = r.get(key, 0) + 1

    def merge(self, other: dict) -> None:
        with self.lock:
            for k in ("uploads", "drops", "errors", "waits"):
                self.d[k] += other.get(k, 0)
            room = None if self.keep is None else max(0, self.keep - len(self.d["latencies"]))
            self.d["latencies"] += other.get("latencies", [])[:room]
            for k, n in other.get("refused", {}).items():
                r = self.d.setdefault("refused", {})
                r[k] = r.get(k, 0) + n

    def __getitem__(self, key):
        return self.d[key]

    def as_dict(self) -> dict:
        with self.lock:
            return {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
                    for k, v in self.d.items()}


@dataclass
class Trained:
    """A device that trained this round's task and has an update to deliver."""
    task: dict
    delta: dict
    n: int
    frame: bytes | None   # None: a secure-aggregation task (no frame; the exchange carries the update)
    latency: float        # simulated seconds of local training + upload
    t_task: float         # time.monotonic() when the task arrived

    def due(self, cfg) -> float:
        """time.monotonic() at which the device is done training and uploads."""
        return self.t_task + self.latency * cfg.time_scale

    def remaining(self, cfg) -> float:
        return max(0.0, self.due(cfg) - time.monotonic())


def draw_latency(cfg, rng, slow: bool) -> float:
    return cfg.median_latency * float(np.exp(rng.normal(0, cfg.latency_sigma))) * (10 if slow else 1)


def begin(client, status: dict, cfg, rng, slow: bool, stats: Stats):
    """Check in; when given a task, train and encode it. ``("wait", s)``: the aggregator said come
    back in s simulated seconds; ``("retry", s)``: refused or unreachable, retry in s; else ``Trained``."""
    from edge.fl import FLError

    s = cfg.time_scale
    try:
        ans = client.checkin(status)
    except FLError as e:
        stats.refuse(f"checkin:{e.reason or e.status}")
        return ("retry", 5.0)
    if ans.get("action") != "train":
        stats.add("waits")
        return ("wait", float(ans.get("retry_after", 5 * s)) / s)
    task = ans["task"]
    t_task = time.monotonic()
    lat = draw_latency(cfg, rng, slow)
    try:
        delta, n = client.train(task)
        frame = None if "secagg" in task else client.encode(task, delta, n)
    except FLError as e:
        stats.refuse(f"train:{e.reason or e.status}", error=False)
        return ("retry", 5.0)
    return Trained(task, delta, n, frame, lat, t_task)


def finish(client, tr: Trained, cfg, rng, stats: Stats) -> str:
    """Deliver a trained update at its due time (the caller slept until then): ``"dropped"`` (lost
    power or network after training: never uploads), ``"uploaded"`` or ``"refused"`` (e.g. 410: the
    round closed while the device trained)."""
    from edge.fl import FLError

    s = cfg.time_scale
    stats.latency((time.monotonic() - tr.t_task) / s)
    if rng.random() < cfg.drop_rate:
        stats.add("drops")
        return "dropped"
    try:
        if tr.frame is None:  # secure aggregation: the four-phase exchange instead of one frame
            view = client.run_secure(tr.task, tr.delta, tr.n, poll=max(0.01, 0.5 * s),
                                     timeout=cfg.round_timeout * s * 2)
            if view["phase"] != "done":
                raise FLError(f"secure round {tr.task['round_id']} {view['phase']}", reason="SecAggFailed")
        else:
            client.upload(tr.frame, int(tr.task.get("chunk_size", 0)))
    except FLError as e:
        stats.refuse(e.reason or str(e.status))
        return "refused"
    stats.add("uploads")
    return "uploaded"
