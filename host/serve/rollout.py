"""A served model: its stable version, an optional canary, and the staged rollout.

Unversioned requests go to the canary with its current weight (1 -> 10 -> 50
-> 100 %); a canary request that fails is answered again by the stable version,
so a bad canary costs latency, never an answer. ``CanaryPolicy`` decides; this
class acts: advance, promote (the old stable is drained, then stopped) or roll
back (the canary is drained, then stopped). Versioned requests
(``/versions/{v}/infer``) go exactly where they say.

    >>> model = ServedModel("kws", cfg, metrics)
    >>> await model.add_stable(mv3)
    >>> await model.begin_canary(mv4)        # returns at once; the rollout runs in the background
    >>> mv, outputs = await model.infer(None, {"features": x}, rows=1)
"""

from __future__ import annotations

import asyncio
import random
import time

from host.serve.config import ServeConfig
from host.serve.metrics import Metrics
from host.serve.policy import ADVANCE, PROMOTE, ROLLBACK, CanaryPolicy
from host.serve.pool import ModelVersion, Overloaded
from host.serve.protocol import ProtocolError
from host.serve.replica import ReplicaError


class ServedModel:
    def __init__(self, name: str, cfg: ServeConfig, metrics: Metrics, clock=time.monotonic,
                 seed: int | None = None, tick: float = 0.25):
        self.name, self.cfg, self.metrics, self._clock, self.tick = name, cfg, metrics, clock, tick
        self._rng = random.Random(seed)
        self.versions: dict[str, ModelVersion] = {}
        self.stable: str | None = None
        self.canary: str | None = None
        self.policy: CanaryPolicy | None = None
        self.retired: dict[str, str] = {}   # version -> why it is gone
        self.history: list[dict] = []
        self._watcher: asyncio.Task | None = None
        self._stopping: set[asyncio.Task] = set()

    # -- routing -----------------------------------------------------------------------------
    def weight_of(self, version: str) -> float:
        if version == self.canary and self.policy is not None:
            return self.policy.weight
        if version == self.stable:
            return 1.0 - (self.policy.weight if self.canary and self.policy else 0.0)
        return 0.0

    def get(self, version: str | None) -> ModelVersion:
        if version is None:
            if self.stable is None:
                raise ProtocolError(503, f"model '{self.name}' has no version loaded yet")
            return self.versions[self.stable]
        mv = self.versions.get(version)
        if mv is None or mv.stopping:
            why = self.retired.get(version)
            raise ProtocolError(404, f"model '{self.name}' has no version '{version}'"
                                     + (f" ({why})" if why else "") + "; loaded: "
                                     + ", ".join(v for v, m in self.versions.items() if not m.stopping))
        return mv

    def _pick(self) -> ModelVersion:
        if self.canary and self.policy and self._rng.random() < self.policy.weight:
            return self.versions[self.canary]
        return self.get(None)

    async def infer(self, version: str | None, inputs: dict, rows: int):
        mv = self.get(version) if version is not None else self._pick()
        t0 = self._clock()
        try:
            out = await mv.infer(inputs, rows)
        except Overloaded:
            raise
        except ReplicaError:
            mv.outcomes.add(False, self._clock() - t0)
            stable = self.versions.get(self.stable) if self.stable else None
            if version is None and stable is not None and mv is not stable:
                return stable, await self._timed(stable, inputs, rows)
            raise
        mv.outcomes.add(True, self._clock() - t0)
        return mv, out

    async def _timed(self, mv: ModelVersion, inputs: dict, rows: int):
        t0 = self._clock()
        try:
            out = await mv.infer(inputs, rows)
        except ReplicaError:
            mv.outcomes.add(False, self._clock() - t0)
            raise
        mv.outcomes.add(True, self._clock() - t0)
        return out

    # -- versions ----------------------------------------------------------------------------
    def _event(self, version: str, what: str, detail: str = "") -> None:
        self.history.append({"t": round(time.time(), 3), "version": version, "event": what, "detail": detail})

    async def add_stable(self, mv: ModelVersion) -> None:
        await mv.start()
        self.versions[mv.version] = mv
        self.stable = mv.version
        self._event(mv.version, "stable")

    def check_can_roll_out(self, version: str) -> None:
        """Raise ProtocolError(409) if ``version`` cannot start a canary now (changes nothing)."""
        if self.stable is None:
            return
        if self.canary is not None:
            raise ProtocolError(409, f"model '{self.name}' is already rolling out version {self.canary}; "
                                     "wait for it to be promoted or rolled back")
        if version in self.versions or (version.isdigit() and self.stable.isdigit()
                                        and int(version) <= int(self.stable)):
            raise ProtocolError(409, f"version {version} of '{self.name}' is not newer than the "
                                     f"stable version {self.stable}")

    async def begin_canary(self, mv: ModelVersion) -> None:
        """Start ``mv`` (warm-up check included) and begin its rollout at the first step."""
        if self.stable is None:
            await self.add_stable(mv)
            return
        self.check_can_roll_out(mv.version)
        await mv.start()
        c = self.cfg
        self.policy = CanaryPolicy(self._clock, c.canary_steps, c.canary_min_requests,
                                   c.canary_min_step_seconds, c.canary_max_error_increase, c.canary_p99_factor,
                                   p99_min_requests=c.canary_p99_min_requests)
        self.versions[mv.version] = mv
        self.canary = mv.version
        self._event(mv.version, "canary", f"{self.policy.weight:.0%}")
        self._watcher = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        while self.canary is not None and self.stable is not None and self.policy is not None:
            await asyncio.sleep(self.tick)
            policy, stable_v = self.policy, self.stable
            if self.canary is None or policy is None or stable_v is None:
                return
            canary, stable = self.versions[self.canary], self.versions[stable_v]
            decision = policy.decide(stable.outcomes.summary(), canary.outcomes.summary(since=policy.step_started))
            if decision == ADVANCE:
                policy.advance()
                self._event(canary.version, "canary", f"{policy.weight:.0%}")
            elif decision == PROMOTE:
                self.stable, self.canary, self.policy = canary.version, None, None
                self._event(canary.version, "promoted")
                self.metrics.rollouts.labels(self.name, canary.version, "promoted").inc()
                self._retire(stable_v, f"replaced by version {canary.version}")
            elif decision == ROLLBACK:
                self.canary, self.policy = None, None
                self._event(canary.version, "rolled back", policy.reason)
                self.metrics.rollouts.labels(self.name, canary.version, "rolled_back").inc()
                self._retire(canary.version, f"rolled back: {policy.reason}")

    def abort_canary(self, why: str) -> None:
        """Withdraw the running canary (a sibling model of its bundle failed to start)."""
        if self.canary is None:
            return
        version, self.canary, self.policy = self.canary, None, None
        self._event(version, "aborted", why)
        self._retire(version, f"aborted: {why}")

    def _retire(self, version: str, why: str) -> None:
        """Stop routing to ``version`` now; its queued and in-flight requests still finish."""
        mv = self.versions[version]
        self.retired[version] = why
        task = asyncio.create_task(self._drain(version, mv))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def _drain(self, version: str, mv: ModelVersion) -> None:
        await mv.stop()
        if self.versions.get(version) is mv:
            del self.versions[version]

    def status(self) -> dict:
        return {"name": self.name, "stable": self.stable, "canary": self.canary,
                "canary_weight": self.policy.weight if self.policy else 0.0,
                "versions": {v: mv.status() for v, mv in sorted(self.versions.items())}, "retired": dict(self.retired), "history": list(self.history)}

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        await asyncio.gather(*self._stopping, return_exceptions=True)
        await asyncio.gather(*(mv.stop() for mv in list(self.versions.values())), return_exceptions=True)
