"""One model version on N replica processes: bounded queue, dynamic batching,
power-of-two-choices routing, a circuit breaker per replica, deep health checks.

    >>> mv = ModelVersion("kws", "3", "model.onnx", spec, ServeConfig(), Metrics())
    >>> await mv.start()                       # spawn, warm up, record the golden answer
    >>> outputs = await mv.infer({"features": x}, rows=1, tenant="acme")
    >>> await mv.stop()                        # drains in-flight work first

``infer`` raises ``Overloaded`` (-> 503 + Retry-After) when the queue is at its
bound, and ``ReplicaError`` when no replica could answer after a retry. The health
checks and restarts are ``pool_health.py`` (``Health``, which ``ModelVersion`` inherits).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from host.serve.config import ServeConfig
from host.serve.health import check_output, known_input
from host.serve.metrics import Metrics
from host.serve.policy import CircuitBreaker, Outcomes, power_of_two, predicted_wait
from host.serve.protocol import ModelSpec
from host.serve.pool_health import Health
from host.serve.replica import Replica, ReplicaError


class Overloaded(Exception):
    def __init__(self, message: str, retry_after: float, reason: str = "queue_full"):
        super().__init__(message)
        self.retry_after, self.reason = retry_after, reason  # reason labels the rejection metric


@dataclass
class _Item:
    inputs: dict
    rows: int
    future: asyncio.Future
    enqueued: float
    attempts: int = 0
    exclude: set = field(default_factory=set)


@dataclass
class _Batch:
    slot: "Slot"
    items: list
    rows: int
    sent: float
    timer: asyncio.TimerHandle | None = None


class Slot:
    """A replica plus its breaker and health, as the router sees it."""

    def __init__(self, replica: Replica, breaker: CircuitBreaker):
        self.replica, self.breaker = replica, breaker
        self.healthy = False      # passed its last deep check
        self.restarting = False
        self.last_check = ""      # why it last failed, for /v2/models/... and logs
        # Injected faults belong to the slot, not the process: a restart does not
        # cure them, as a restart would not cure a bad host (fault-injection hook).
        self.faults: dict = {}
        self.restarts = 0         # consecutive restarts that did not bring it back healthy
        self.next_restart = 0.0   # clock time before which it is not restarted again (backoff)

    async def inject(self, **change) -> None:
        change = {k: v for k, v in change.items() if v is not None}
        self.faults.update(change)
        if self.replica.alive:
            await self.replica.inject(**change)  # else the restart applies self.faults

    index = property(lambda self: self.replica.index)
    routable_health = property(lambda self: self.healthy and self.replica.alive and not self.restarting)


class ModelVersion(Health):
    def __init__(self, name: str, version: str, model_path: str, spec: ModelSpec, config: ServeConfig,
                 metrics: Metrics, score_output: str | None = None, clock=time.monotonic,
                 seed: int | None = None):
        self.name, self.version, self.model_path, self.spec = name, version, model_path, spec
        self.cfg, self.metrics, self.score_output, self._clock = config, metrics, score_output, clock
        self._rng = random.Random(seed)
        self.slots: list[Slot] = []
        self._queue: deque[_Item] = deque()
        self._batches: dict[int, _Batch] = {}
        self._direct_waiters: dict[int, asyncio.Future] = {}
        self._seq = 0
        self._wake = asyncio.Event()  # binds to a loop on first use (Python >= 3.10)
        self._tasks: list[asyncio.Task] = []
        self.golden: dict | None = None
        self.outcomes = Outcomes(clock)
        self.ready = False
        self.stopping = False
        self._batch_seconds = 0.005  # running estimate, for Retry-After
        self._compute_seconds = 0.0  # running estimate of one batch's compute on a replica

    # -- lifecycle ---------------------------------------------------------------------------
    def _new_slot(self, i: int) -> Slot:
        c = self.cfg
        br = CircuitBreaker(self._clock, c.breaker_window, c.breaker_min_calls, c.breaker_failure_rate,
                            c.breaker_slow_call, c.breaker_open, c.breaker_probes)
        return Slot(Replica(self.model_path, i, self._on_answer, on_exit=self._on_exit), br)

    def _on_exit(self, replica: Replica) -> None:
        # a worker that dies idle fails no batch, so nothing else would notice before the next
        # health check (health_interval): restart it now
        for slot in self.slots:
            if slot.replica is replica and not slot.restarting and self.cfg.restart_failed and not self.stopping:
                slot.healthy, slot.last_check = False, "worker process exited"
                asyncio.get_running_loop().create_task(self._restart(slot))
        self._wake.set()

    async def start(self) -> None:
        self.slots = [self._new_slot(i) for i in range(self.cfg.replicas)]
        try:
            await asyncio.gather(*(s.replica.start() for s in self.slots))
            probe = known_input(self.spec)
            first = await self.direct(self.slots[0], probe)
            why = check_output(first, self.score_output, None)
            if why:
                raise ReplicaError(f"{self.name} v{self.version} fails its warm-up check: {why}")
            self.golden = first
            for s in self.slots:
                await self._deep_check(s)
            if not any(s.healthy for s in self.slots):
                raise ReplicaError(f"{self.name} v{self.version}: no replica passed the warm-up check "
                                   f"({self.slots[0].last_check})")
        except BaseException:
            for s in self.slots:
                s.replica.kill()
            raise
        self._tasks = [asyncio.create_task(self._dispatch_loop()), asyncio.create_task(self._health_loop())]
        self.ready = True

    async def stop(self, drain_timeout: float = 30.0) -> None:
        """Stop taking work, finish what is queued and in flight, then stop the workers."""
        self.stopping = True
        self.ready = False
        deadline = self._clock() + drain_timeout
        while (self._queue or self._batches) and self._clock() < deadline:
            self._wake.set()
            await asyncio.sleep(0.01)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for item in self._queue:
            if not item.future.done():
                item.future.set_exception(ReplicaError(f"{self.name} v{self.version} was stopped"))
        await asyncio.gather(*(s.replica.stop() for s in self.slots))

    def status(self) -> dict:
        return {"version": self.version, "ready": self.ready, "queue_depth": len(self._queue),
                "replicas": [{"index": s.index, "pid": s.replica.pid, "alive": s.replica.alive,
                              "healthy": s.healthy, "restarting": s.restarting, "breaker": s.breaker.state,
                              "outstanding_rows": s.replica.outstanding_rows, "last_check": s.last_check}
                             for s in self.slots]}

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    def inflight(self) -> int:
        return len(self._queue) + sum(len(b.items) for b in self._batches.values())

    # -- admission ---------------------------------------------------------------------------
    def check_room(self, rows: int = 1) -> None:
        """Raise Overloaded if the queue is at its bound or, with ``max_queue_wait``, if the
        predicted wait for a replica is over budget (also called before a body is parsed)."""
        if len(self._queue) >= self.cfg.max_queue:
            live = max(1, sum(s.routable_health for s in self.slots))
            wait = self._batch_seconds * (len(self._queue) / self.cfg.max_batch_size + 1) / live
            raise Overloaded(f"{self.name} v{self.version}: queue is full ({self.cfg.max_queue} requests)", wait)
        if self.cfg.max_queue_wait > 0:
            wait = self.predicted_wait(rows)
            if wait == float("inf"):
                raise Overloaded(f"{self.name} v{self.version}: no replica can take work now (all unhealthy "
                                 "or their circuit breakers open)", self.cfg.breaker_open, "no_replica")
            if wait > self.cfg.max_queue_wait:
                raise Overloaded(f"{self.name} v{self.version}: predicted wait {wait * 1e3:.1f} ms is over the "
                                 f"{self.cfg.max_queue_wait * 1e3:g} ms budget", wait, "queue_wait")

    def predicted_wait(self, rows: int = 1) -> float:
        """Seconds until a request of ``rows`` arriving now would start on a replica (see
        ``policy.predicted_wait``); batch time is the running mean of the replicas' compute time."""
        est = self._compute_seconds
        if est <= 0:
            return 0.0  # nothing measured yet: admit (the queue bound still applies)
        now, busy = self._clock(), []
        for s in self.slots:
            if s.routable_health and s.breaker.would_allow():
                mine = sorted(b.sent for b in self._batches.values() if b.slot is s)
                busy.append(max(0.0, est - (now - mine[0])) + est * (len(mine) - 1) if mine else 0.0)
        queued = sum(it.rows for it in self._queue)
        return predicted_wait(busy, est, (queued + rows - 1) // self.cfg.max_batch_size)

    async def infer(self, inputs: dict, rows: int) -> dict[str, np.ndarray]:
        if self.stopping:
            raise ReplicaError(f"{self.name} v{self.version} is shutting down")
        self.check_room(rows)
        fut = asyncio.get_running_loop().create_future()
        self._queue.append(_Item(inputs, rows, fut, self._clock()))
        self._wake.set()
        return await fut

    # -- dispatch ----------------------------------------------------------------------------
    def _routable(self) -> list[int]:
        cap = self.cfg.max_inflight_per_replica
        return [i for i, s in enumerate(self.slots)
                if s.routable_health and len(s.replica.inflight) < cap and s.breaker.would_allow()]

    async def _dispatch_loop(self) -> None:
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            if not any(s.replica.alive and not s.restarting for s in self.slots) and not any(
                    s.restarting for s in self.slots):
                self._fail_queue("no replica is running")
                continue
            cands = self._routable()
            if not cands:
                self._wake.clear()
                # Re-check periodically too: an open breaker turns half-open by time alone.
                try:
                    await asyncio.wait_for(self._wake.wait(), 0.05)
                except asyncio.TimeoutError:
                    pass
                continue
            if self.cfg.max_queue_delay > 0:
                rows = sum(it.rows for it in self._queue)
                wait = self._queue[0].enqueued + self.cfg.max_queue_delay - self._clock()
                if rows < self.cfg.max_batch_size and wait > 0:
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), wait)
                    except asyncio.TimeoutError:
                        pass
                    continue
            i = power_of_two(cands, lambda j: self.slots[j].replica.outstanding_rows, self._rng)
            slot = self.slots[i]
            if not slot.breaker.allow():
                continue
            items = self._take_batch(i)
            if not items:
                # Every queued item already failed on this replica; let another take it.
                self._wake.clear()
                await asyncio.sleep(0.001)
                continue
            self._send(slot, items)
            await asyncio.sleep(0)  # let answers and new requests in between batches

    def _take_batch(self, index: int) -> list[_Item]:
        taken, kept, rows = [], deque(), 0
        while self._queue:
            it = self._queue.popleft()
            if index in it.exclude or rows + it.rows > self.cfg.max_batch_size:
                kept.append(it)
                if rows + it.rows > self.cfg.max_batch_size and index not in it.exclude:
                    break
                continue
            if it.future.done():  # the client went away
                continue
            taken.append(it)
            rows += it.rows
        kept.extend(self._queue)
        self._queue = kept
        return taken

    def _send(self, slot: Slot, items: list[_Item]) -> None:
        names = [t.name for t in self.spec.inputs]
        inputs = {n: items[0].inputs[n] if len(items) == 1 else np.concatenate([it.inputs[n] for it in items])
                  for n in names}
        rows = sum(it.rows for it in items)
        self._seq += 1
        seq = self._seq
        batch = _Batch(slot, items, rows, self._clock())
        self._batches[seq] = batch
        slot.replica.outstanding_rows += rows
        batch.timer = asyncio.get_running_loop().call_later(self.cfg.batch_timeout, self._timed_out, seq)
        self.metrics.batch_size.labels(self.name, self.version, str(slot.index)).observe(rows)
        try:
            slot.replica.send(seq, inputs)
        except ReplicaError as e:
            if seq in self._batches:
                self._finish(seq, e, 0.0)

    def _timed_out(self, seq: int) -> None:
        batch = self._batches.get(seq)
        if batch is not None and batch.slot.replica.abandon(seq):
            self._finish(seq, ReplicaError(f"replica {batch.slot.index} did not answer within "
                                           f"{self.cfg.batch_timeout:g} s"), self.cfg.batch_timeout)

    def _on_answer(self, replica: Replica, seq: int, payload, seconds: float) -> None:
        if seq in self._batches:
            self._finish(seq, payload, seconds)
        elif seq in self._direct_waiters:
            fut = self._direct_waiters.pop(seq)
            if not fut.done():
                (fut.set_exception if isinstance(payload, Exception) else fut.set_result)(payload)

    def _finish(self, seq: int, payload, compute_seconds: float) -> None:
        batch = self._batches.pop(seq)
        if batch.timer is not None:
            batch.timer.cancel()
        slot = batch.slot
        slot.replica.outstanding_rows -= batch.rows
        latency = self._clock() - batch.sent
        ok = not isinstance(payload, Exception)
        slot.breaker.record(ok, latency)
        rid = str(slot.index)
        self.metrics.replica_batches.labels(self.name, self.version, rid, "ok" if ok else "error").inc()
        self.metrics.replica_seconds.labels(self.name, self.version, rid).observe(latency)
        if ok:
            self._batch_seconds = 0.9 * self._batch_seconds + 0.1 * latency
            self._compute_seconds = (compute_seconds if self._compute_seconds <= 0
                                     else 0.9 * self._compute_seconds + 0.1 * compute_seconds)
            start = 0
            for it in batch.items:
                if not it.future.done():
                    it.future.set_result({k: v[start:start + it.rows] for k, v in payload.items()})
                start += it.rows
        else:
            retry = []
            for it in batch.items:
                it.attempts += 1
                it.exclude.add(slot.index)
                others = any(s.routable_health and s.index not in it.exclude for s in self.slots)
                if it.attempts < self.cfg.max_attempts and others and not it.future.done():
                    retry.append(it)
                elif not it.future.done():
                    it.future.set_exception(ReplicaError(str(payload)))
            self._queue.extendleft(reversed(retry))
            if not slot.replica.alive and not slot.restarting and self.cfg.restart_failed and not self.stopping:
                slot.healthy, slot.last_check = False, str(payload)
                asyncio.get_running_loop().create_task(self._restart(slot))
        self._wake.set()

    def _fail_queue(self, why: str) -> None:
        while self._queue:
            it = self._queue.popleft()
            if not it.future.done():
                it.future.set_exception(ReplicaError(f"{self.name} v{self.version}: {why}"))
