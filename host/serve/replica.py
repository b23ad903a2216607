"""One model replica: a worker process with its own ONNX Runtime session.

The server talks to a replica over a ``multiprocessing`` pipe (pickled
messages, numpy arrays by pickle protocol 5) and reads answers from the event
loop with ``add_reader``, so no thread sits between a request and its reply.
Separate processes, not threads: each session gets one intra-op thread and a
core to itself, and a replica that crashes or hangs can be killed and restarted
without taking the server with it.

    >>> r = Replica(model_path, index=0, on_answer=callback)
    >>> await r.start()                # spawns, loads, warms up
    >>> r.send(seq, {"features": batch})   # later: callback(r, seq, outputs_or_exception)

Fault-injection hook (tests and bench/serve_faults.py only): ``r.inject(delay=0.5)``
makes the worker sleep before every batch, ``fail=True`` makes it raise, and
``nan=True`` makes it answer NaN, which the worker's own output check reports
as an error, as it would for a silently broken model.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import pickle
import queue
import signal
import threading
import time
from typing import Callable

import numpy as np


class ReplicaError(Exception):
    """A replica failed a batch (model error, non-finite output, crash or timeout)."""


def _worker(conn, model_path: str, intra_threads: int) -> None:  # runs in the child process
    # Ctrl-C in a terminal reaches the whole process group: the server stops its replicas itself
    # (stop/kill), so a replica ignores SIGINT instead of dying with a KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = intra_threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    try:
        sess = ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # report the load error instead of dying silently
        conn.send_bytes(pickle.dumps(("dead", 0, f"cannot load {model_path}: {e}", 0.0)))
        return
    out_names = [o.name for o in sess.get_outputs()]
    faults = {"delay": 0.0, "fail": False, "nan": False}
    inbox: queue.Queue = queue.Queue()

    # A reader thread drains the pipe while the session computes, so the
    # server's send never blocks on a full pipe buffer behind a running batch.
    def read() -> None:
        try:
            while True:
                inbox.put(pickle.loads(conn.recv_bytes()))
        except (EOFError, OSError):
            inbox.put(("stop", 0, None))

    threading.Thread(target=read, daemon=True).start()
    conn.send_bytes(pickle.dumps(("ready", 0, out_names, 0.0)))
    while True:
        kind, seq, payload = inbox.get()
        if kind == "stop":
            return
        if kind == "fault":
            faults.update(payload)
            conn.send_bytes(pickle.dumps(("ok", seq, {}, 0.0)))
            continue
        t0 = time.perf_counter()
        try:
            if faults["delay"]:
                time.sleep(faults["delay"])
            if faults["fail"]:
                raise RuntimeError("injected failure")
            outs = dict(zip(out_names, sess.run(out_names, payload)))
            if faults["nan"]:
                outs = {k: np.full_like(v, np.nan) if v.dtype.kind == "f" else v for k, v in outs.items()}
            bad = [k for k, v in outs.items() if v.dtype.kind == "f" and not np.isfinite(v).all()]
            if bad:
                raise RuntimeError(f"model produced NaN/Inf in output(s) {', '.join(bad)}")
            msg = ("ok", seq, outs, time.perf_counter() - t0)
        except Exception as e:
            msg = ("err", seq, f"{type(e).__name__}: {e}", time.perf_counter() - t0)
        conn.send_bytes(pickle.dumps(msg, protocol=5))


class Replica:
    """The server-side handle of one worker process."""

    def __init__(self, model_path: str, index: int,
                 on_answer: Callable[["Replica", int, object, float], None],
                 intra_threads: int = 1, on_exit: Callable[["Replica"], None] | None = None):
        self.model_path, self.index, self.intra_threads = model_path, index, intra_threads
        self._on_answer = on_answer
        self._on_exit = on_exit   # told when the worker dies on its own (not by kill())
        self._proc: mp.process.BaseProcess | None = None
        self._conn = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future | None = None
        self._control: dict[int, asyncio.Future] = {}
        self._next_control = -1
        self.outstanding_rows = 0   # rows sent and not answered (routing load)
        self.inflight: set[int] = set()  # batch sequence numbers in flight
        self.alive = False

    async def start(self, timeout: float = 60.0) -> None:
        ctx = mp.get_context("spawn")  # fork would copy the event loop and ORT thread pools
        parent, child = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(target=_worker, args=(child, self.model_path, self.intra_threads),
                                 daemon=True, name=f"edgelearn-replica-{self.index}")
        # SIGINT blocked while the child starts (it inherits the mask), so a Ctrl-C during its start-up
        # waits for _worker to ignore it; the parent gets its own pending Ctrl-C once unblocked.
        old = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
        try:
            self._proc.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        child.close()
        self._conn = parent
        self._loop = asyncio.get_running_loop()
        self._ready = self._loop.create_future()
        self._loop.add_reader(parent.fileno(), self._readable)
        try:
            await asyncio.wait_for(self._ready, timeout)
        except BaseException:
            self.kill()
            raise
        self.alive = True

    def _readable(self) -> None:
        try:
            while self._conn is not None and self._conn.poll(0):
                kind, seq, payload, seconds = pickle.loads(self._conn.recv_bytes())
                self._dispatch(kind, seq, payload, seconds)
        except (EOFError, OSError):
            self._died("worker process exited")

    def _dispatch(self, kind, seq, payload, seconds) -> None:
        if kind == "ready":
            if not self._ready.done():
                self._ready.set_result(payload)
        elif kind == "dead":
            if not self._ready.done():
                self._ready.set_exception(ReplicaError(payload))
        elif seq in self._control:
            self._control.pop(seq).set_result(None)
        elif seq in self.inflight:
            self.inflight.discard(seq)
            self._on_answer(self, seq, payload if kind == "ok" else ReplicaError(payload), seconds)

    def _died(self, why: str) -> None:
        was_alive, self.alive = self.alive, False
        self._detach()
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(ReplicaError(f"replica {self.index}: {why} while loading"))
        for fut in self._control.values():
            if not fut.done():
                fut.set_exception(ReplicaError(f"replica {self.index}: {why}"))
        self._control.clear()
        lost, self.inflight = self.inflight, set()
        if was_alive:
            for seq in lost:
                self._on_answer(self, seq, ReplicaError(f"replica {self.index}: {why}"), 0.0)
            if self._on_exit is not None:
                self._on_exit(self)

    def _detach(self) -> None:
        if self._conn is not None:
            try:
                self._loop.remove_reader(self._conn.fileno())
            except (ValueError, OSError):
                pass
            self._conn.close()
            self._conn = None

    def send(self, seq: int, inputs: dict[str, np.ndarray]) -> None:
        if not self.alive or self._conn is None:
            raise ReplicaError(f"replica {self.index} is not running")
        self.inflight.add(seq)
        try:
            self._conn.send_bytes(pickle.dumps(("infer", seq, inputs), protocol=5))
        except (OSError, ValueError) as e:
            self.inflight.discard(seq)
            self._died(f"pipe broken ({e})")
            raise ReplicaError(f"replica {self.index}: pipe broken") from e

    def abandon(self, seq: int) -> bool:
        """Stop waiting for batch ``seq`` (it timed out); a late answer is dropped."""
        if seq in self.inflight:
            self.inflight.discard(seq)
            return True
        return False

    async def inject(self, delay: float | None = None, fail: bool | None = None,
                     nan: bool | None = None) -> None:
        """Fault-injection hook: change how the worker behaves from its next batch on."""
        change = {k: v for k, v in (("delay", delay), ("fail", fail), ("nan", nan)) if v is not None}
        seq, self._next_control = self._next_control, self._next_control - 1
        fut = self._loop.create_future()
        self._control[seq] = fut
        self._conn.send_bytes(pickle.dumps(("fault", seq, change)))
        await asyncio.wait_for(fut, 10.0)

    async def stop(self, timeout: float = 5.0) -> None:
        """Ask the worker to finish; in-flight batches should be drained by the caller first."""
        if self._conn is not None:
            try:
                self._conn.send_bytes(pickle.dumps(("stop", 0, None)))
            except OSError:
                pass
        self.alive = False
        deadline = time.monotonic() + timeout
        while self._proc is not None and self._proc.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self.kill()

    def kill(self) -> None:
        self.alive = False
        self._detach()
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
            self._proc.join(2.0)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None
