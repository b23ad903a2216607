"""The health side of ``ModelVersion``: a request run on one replica outside the queue
(``direct``), the deep check of a replica against the golden answer (``_deep_check``), restarting a
broken replica with backoff (``_restart``), and the periodic check of every replica
(``_health_loop``).

Split from pool.py to keep each file about one thing; ``ModelVersion`` inherits ``Health``.

    >>> ok = await mv._deep_check(mv.slots[0])   # sets slot.healthy and slot.last_check
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from host.serve.health import check_output, known_input
from host.serve.replica import Replica, ReplicaError

if TYPE_CHECKING:
    from host.serve.pool import Slot


class Health:
    """Mixin: needs ``cfg``, ``spec``, ``model_path``, ``slots``, ``golden``, ``score_output``,
    ``stopping``, ``_seq``, ``_direct_waiters``, ``_clock``, ``_wake``, ``_new_slot``, ``_on_answer``,
    ``_on_exit`` from ``ModelVersion``."""

    async def direct(self, slot: Slot, inputs: dict, timeout: float | None = None) -> dict:
        """Run ``inputs`` on one replica, outside the queue and the breaker (health checks)."""
        self._seq += 1
        seq = self._seq
        fut = asyncio.get_running_loop().create_future()
        self._direct_waiters[seq] = fut
        try:
            slot.replica.send(seq, inputs)
            return await asyncio.wait_for(fut, timeout or self.cfg.batch_timeout)
        except asyncio.TimeoutError:
            slot.replica.abandon(seq)
            raise ReplicaError(f"replica {slot.index} did not answer the health check within "
                               f"{timeout or self.cfg.batch_timeout:g} s") from None
        finally:
            self._direct_waiters.pop(seq, None)

    async def _deep_check(self, slot: Slot) -> bool:
        try:
            outs = await self.direct(slot, known_input(self.spec))
            why = check_output(outs, self.score_output, self.golden)
        except ReplicaError as e:
            why = str(e)
        slot.healthy, slot.last_check = not why, why
        return not why

    async def _restart(self, slot: Slot) -> None:
        if slot.restarting or self._clock() < slot.next_restart:
            return
        slot.restarting = True
        # Back off 1, 2, 4 ... 60 s between restarts of a replica that stays broken,
        # so a persistent fault does not turn into a fork loop.
        slot.next_restart = self._clock() + min(60.0, 2.0 ** slot.restarts)
        slot.restarts += 1
        try:
            slot.replica.kill()
            fresh = Replica(self.model_path, slot.index, self._on_answer, on_exit=self._on_exit)
            await fresh.start()
            if slot.faults:
                await fresh.inject(**slot.faults)
            slot.replica = fresh
            slot.breaker = self._new_slot(slot.index).breaker
            if await self._deep_check(slot):
                slot.restarts = 0
        except (ReplicaError, asyncio.TimeoutError) as e:
            slot.healthy, slot.last_check = False, f"restart failed: {e}"
        finally:
            slot.restarting = False
            self._wake.set()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.health_interval)
            for slot in list(self.slots):
                if slot.restarting:
                    continue
                ok = slot.replica.alive and await self._deep_check(slot)
                if not ok and not slot.replica.alive:
                    slot.healthy, slot.last_check = False, slot.last_check or "worker process exited"
                if not ok and self.cfg.restart_failed and not self.stopping:
                    asyncio.create_task(self._restart(slot))
