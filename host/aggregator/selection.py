"""The check-in path of ``RoundManager``: a device's check-in checked (fields, replay), its
eligibility, and whether the open round selects it (over-selection, concurrency, the fairness
budget), answered with its task or with when to come back.

Split from rounds.py to keep each file about one thing; ``RoundManager`` inherits ``Selection``.

    answer = mgr.checkin("pi-001", {"battery": 0.9, "charging": True})   # {"action": "train", "task": ...}
"""

from __future__ import annotations

import contextlib
import json

from host.aggregator import policy
from host.aggregator.checkin import validate_checkin
from host.aggregator.errors import Reject


class Selection:
    """Mixin: needs ``cfg``, ``store``, ``round``, ``arrivals``, ``rng``, ``reg``, ``clock``, ``secure``,
    ``strategy``, ``tick`` from ``RoundManager``."""

    def _wait(self, reason: str) -> dict:
        n = self.store.one("SELECT COUNT(*) FROM devices")[0]
        sync = self.cfg.mode == "sync"
        until = None
        if sync:
            # a round should take ~1.5 device latencies: fill its selection in a quarter of one
            lat = max(self.cfg.min_retry, min(self.cfg.round_timeout,
                                              policy.median_latency(self.arrivals, self.cfg.round_timeout)))
            need = self.selection_target() / (0.25 * lat)
            if "fully selected" in reason:  # come back about when this round should be over
                r = self.round
                until = max(0.0, min(r["deadline"], r["opened"] + 1.5 * lat) - self.clock())
        else:
            need = self.cfg.max_concurrency / self.cfg.round_timeout
        return {"action": "wait", "reason": reason,
                "retry_after": round(policy.retry_after(reason, n, need, self.cfg, self.rng, until), 3)}

    def task(self, r) -> dict:
        t = {"round_id": r["round_id"], "model_version": r["model_version"] if self.cfg.mode == "sync"
             else self.reg.current, "bundle": f"/v1/bundles/{self.reg.current}.zip",
             "codec": self.cfg.codec, "topk_fraction": self.cfg.topk_fraction,
             "local_epochs": self.cfg.local_epochs, "learning_rate": self.cfg.learning_rate,
             "batch_size": self.cfg.batch_size, "chunk_size": self.cfg.chunk_size,
             "strategy": self.strategy.name, **self.strategy.client_config()}
        if self.cfg.adapt_strategy:
            t["adapt_strategy"] = self.cfg.adapt_strategy
        if self.secure is not None:
            t.update(codec="secagg", **self.secure.task_fields())
        if r["deadline"] is not None:
            t["deadline_in"] = round(max(0.0, r["deadline"] - self.clock()), 3)
        return t

    def _check_replay(self, device_id: str, state: dict, now: float):
        """A signed check-in carrying ``time`` must be newer than the device's last one (and, with
        ``checkin_max_skew``, near our clock): a captured check-in cannot be replayed. ``time`` is
        already a finite number of bounded size (``validate_checkin``), so no value can lock a device out."""
        t = state.get("time")
        if t is None:
            return None  # MCUs without a clock; docs/protocol.md
        last = self.store.one("SELECT checkin_time FROM devices WHERE device_id=?", (device_id,))[0]
        if last is not None and t <= last:
            raise Reject(409, "ReplayError", f"check-in from {device_id!r} is dated {t}, not after its last one "
                         f"({last}): a replay or a clock that went back", "sign each check-in with the current time")
        skew = self.cfg.checkin_max_skew
        if skew and abs(t - now) > skew:
            raise Reject(409, "StaleCheckin", f"check-in dated {t - now:+.0f} s from the aggregator's clock "
                         f"(limit {skew:.0f} s)", "set the device clock (NTP)")
        return float(t)

    def checkin(self, device_id: str, state: dict) -> dict:
        state = validate_checkin(device_id, state)  # every field's type and range before any change
        self.tick()
        now = self.clock()
        with self.store.tx() as c:  # the replay check under the lock: a replay sent to two replicas at once
            t = self._check_replay(device_id, state, now)
            c.execute("UPDATE devices SET last_checkin=?, state=?, tier=?, checkin_time=COALESCE(?, checkin_time) "
                      "WHERE device_id=?", (now, json.dumps(state, sort_keys=True)[:2000],
                                            str(state.get("tier", "linux"))[:16], t, device_id))
        ok, reason = policy.eligible(state, self.cfg)
        if not ok:
            return self._newer(state, self._wait(reason))
        # on a shared store the whole selection is decided under the lock, on the round as it is now
        with (self.store.tx() if self.store.shared else contextlib.nullcontext()):
            return self._newer(state, self._select(device_id, now))

    def _newer(self, state: dict, ans: dict) -> dict:
        """A wait answer to a device that reported a ``model_version`` older than the current one names
        the current version (``"model_version": V``): the device installs it without waiting to be
        picked for a round (docs/protocol.md, "Endpoints"). A task names its own version."""
        have = state.get("model_version")
        if ans.get("action") == "wait" and isinstance(have, int):
            current = self.reg.current
            if isinstance(current, int) and have < current:
                ans["model_version"] = current
        return ans

    def _select(self, device_id: str, now: float) -> dict:
        r = self.round
        sel = self.store.one("SELECT 1 FROM selections WHERE round_id=? AND device_id=?", (r["round_id"], device_id))
        done = self.store.one("SELECT 1 FROM updates WHERE round_id=? AND device_id=?", (r["round_id"], device_id))
        if done:  # "contributed" names the round: a device that crashed before recording its upload learns it
            return {**self._wait(f"already contributed to round {r['round_id']}"), "contributed": r["round_id"]}
        if sel:
            return {"action": "train", "task": self.task(r)}  # a repeated check-in gets the same task
        if self.cfg.mode == "sync":
            if r["selected"] >= self.selection_target():
                return self._wait(f"round {r['round_id']} is fully selected")
        else:
            out = self.store.one("SELECT COUNT(*) FROM selections s WHERE s.selected_at > ? AND NOT EXISTS "
                                 "(SELECT 1 FROM devices d WHERE d.device_id=s.device_id AND d.last_round >= s.round_id)",
                                 (now - self.cfg.round_timeout,))[0]
            if out >= self.cfg.max_concurrency:
                return self._wait("all training slots are taken")
        table, verb = ("contributions", "contributed to") if self.cfg.fairness_counts == "contributions" else \
            ("selections", "joined")
        recent = self.store.one(f"SELECT COUNT(*) FROM {table} WHERE device_id=? AND round_id > ?",
                                (device_id, r["round_id"] - self.cfg.fairness_window))[0]
        if not policy.within_budget(recent, self.cfg):
            return self._wait(f"fairness budget: {verb} {recent} of the last {self.cfg.fairness_window} rounds")
        with self.store.tx() as c:
            c.execute("INSERT INTO selections(round_id, device_id, selected_at, base_version) VALUES(?,?,?,?)",
                      (r["round_id"], device_id, now, self.reg.current))
            c.execute("UPDATE rounds SET selected=selected+1 WHERE round_id=?", (r["round_id"],))
        r["selected"] += 1
        return {"action": "train", "task": self.task(r)}

    def selection_target(self) -> int:
        """Devices to select for the open sync round (adaptive over-selection)."""
        return policy.plan_selection(self.round["target"], self.arrivals, self.cfg)
