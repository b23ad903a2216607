"""Rounds: who trains, which updates count, when to aggregate; the aggregator's state machine.

Synchronous mode opens a round for the current model, selects up to
``overselect × clients_per_round`` eligible devices as they check in, and
closes as soon as ``clients_per_round`` updates are in (it never waits for
the slowest) or at the deadline with at least ``quorum_floor`` (else the round
fails and a new one opens). Asynchronous mode is FedBuff (Nguyen et al.
2022): updates against any of the last ``max_staleness`` versions are
buffered with weight n / sqrt(1 + staleness) and every ``buffer_size`` of them
make a new version. Every accepted update is committed (frame included)
before it touches the in-memory running sum, and the sum is rebuilt from the
database on start, so a crash neither loses nor double-counts an update.

    mgr = RoundManager(state_dir, cfg, store, registry)
    answer = mgr.checkin("pi-001", {"battery": 0.9, "charging": True})
    result = mgr.submit(frame, claimed_device="pi-001")
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import time
from typing import NamedTuple

import numpy as np

from edge.portable import wire_errors as we
from edge.portable.wire_decode import check_fresh, parse_header, verify_tag
from host.aggregator import policy
from host.fl.strategies import StrategyError, make_strategy
from host.wire_numpy import decode_update

# wire error class -> HTTP status (docs/protocol.md); subclasses come first
STATUS = [(we.OversizedFrame, 413), (we.UnknownDevice, 401), (we.AuthError, 401), (we.ReplayError, 409),
          (we.StaleRound, 410), (we.StaleModel, 409), (we.ChunkError, 400), (we.WireError, 400)]


HISTORY = 10  # rounds of arrival evidence kept for over-selection


class Reject(Exception):
    """A request refused with an HTTP status, a machine-readable reason and a one-line problem/fix."""

    def __init__(self, status: int, error: str, problem: str, fix: str | None = None):
        super().__init__(problem)
        self.status, self.error, self.problem, self.fix = status, error, problem, fix

    @classmethod
    def from_wire(cls, e: we.WireError) -> "Reject":
        status = next(s for c, s in STATUS if isinstance(e, c))
        return cls(status, type(e).__name__, e.problem, e.fix)

    def body(self) -> dict:
        return {"error": self.error, "problem": self.problem, "fix": self.fix}


class Pending(NamedTuple):
    """A frame that passed every check that needs no write, waiting for its transaction."""
    hdr: object
    frame: bytes
    digest: bytes
    delta: dict


class RoundManager:
    """Owns the open round, its running sum, and every state change (called from one thread)."""

    def __init__(self, cfg, store, registry, clock=time.time):
        self.cfg, self.store, self.reg, self.clock = cfg, store, registry, clock
        self.rng = np.random.default_rng(cfg.seed)
        self.strategy = make_strategy(cfg.strategy, **cfg.strategy_options)
        if cfg.dp_noise > 0 or cfg.dp_clip > 0:
            from host.privacy.accountant import RdpAccountant
            from host.privacy.dp import DPStrategy
            n_dev = self.store.one("SELECT COUNT(*) FROM devices")[0]
            self.strategy = DPStrategy(self.strategy, cfg.dp_clip or 1.0, cfg.dp_noise, cfg.clients_per_round,
                                       population=max(n_dev, cfg.clients_per_round), seed=cfg.seed)
            s = self.store.get_meta("dp_accountant")
            if s:
                self.strategy.accountant = RdpAccountant.from_state(json.loads(s))
        self.strategy.load_state(self.reg.strategy_state(self.reg.current))
        self.round = None
        self.acc = None
        self._keys = {}
        self.secure = None
        if cfg.secure_aggregation:
            from host.aggregator.secure import SecureRounds
            self.secure = SecureRounds(self)
        # arrivals of recent rounds (round id -> selected, {device: seconds from selection to upload}),
        # late uploads included: the evidence for adaptive over-selection (policy.plan_selection)
        self.arrivals = json.loads(self.store.get_meta("arrivals") or "{}")
        self.recover()

    # --- rounds ---------------------------------------------------------------
    def _row(self, round_id):
        r = self.store.one("SELECT round_id, model_version, status, opened, deadline, target, selected, accepted "
                           "FROM rounds WHERE round_id=?", (round_id,))
        return None if r is None else dict(zip(("round_id", "model_version", "status", "opened", "deadline",
                                                 "target", "selected", "accepted"), r))

    def recover(self) -> None:
        """Load the open round and rebuild its running sum from the committed updates."""
        r = self.store.one("SELECT round_id FROM rounds WHERE status='open' ORDER BY round_id DESC LIMIT 1")
        if r is None:
            with self.store.tx():
                self._open()
            return
        self.round = self._row(r[0])
        self.acc = self.strategy.begin(self.reg.params())
        for dev, frame, base in self.store.all("SELECT device_id, frame, base_version FROM updates "
                                               "WHERE round_id=? ORDER BY received", (r[0],)):
            key = self.store.one("SELECT key FROM devices WHERE device_id=?", (dev,))[0]
            upd = decode_update(frame, key)
            self.acc.add({t.name: t.values for t in upd.tensors}, upd.header.num_examples,
                         self._weight(upd.header.num_examples, base))

    def _open(self) -> None:
        now = self.clock()
        sync = self.cfg.mode == "sync"
        c = self.store.db
        last = c.execute("SELECT COALESCE(MAX(round_id), 0) FROM rounds").fetchone()[0]
        c.execute("INSERT INTO rounds(round_id, mode, model_version, status, opened, deadline, target) "
                  "VALUES(?,?,?,?,?,?,?)", (last + 1, self.cfg.mode, self.reg.current, "open", now,
                                            now + self.cfg.round_timeout if sync else None,
                                            self.cfg.clients_per_round if sync else self.cfg.buffer_size))
        self.round = self._row(last + 1)
        self.acc = self.strategy.begin(self.reg.params())

    def _weight(self, n, base_version):
        if self.cfg.mode == "async":
            return n / math.sqrt(1 + max(0, self.reg.current - base_version))
        return None

    def tick(self) -> None:
        """Close a synchronous round whose deadline passed."""
        r = self.round
        if r["deadline"] is not None and self.clock() >= r["deadline"]:
            self._close("deadline")
        elif self.secure is not None:
            self.secure.tick()

    def fail_round(self, why: str) -> None:
        """Close the open round as failed (nothing aggregated) and open the next."""
        self.acc = self.strategy.begin(self.reg.params())
        self._close(why)

    def _note_arrival(self, round_id: int, device_id: str, selected: int | None = None) -> None:
        h = self.arrivals.get(str(round_id))
        if h is None:
            if selected is None:
                return  # too old to matter
            h = self.arrivals[str(round_id)] = {"selected": selected, "lat": {}}
        row = self.store.one("SELECT selected_at FROM selections WHERE round_id=? AND device_id=?",
                             (round_id, device_id))
        if row is not None and device_id not in h["lat"]:
            h["lat"][device_id] = round(self.clock() - row[0], 4)

    def _close(self, why: str) -> None:
        r = self.round
        ok = self.acc.count >= (self.cfg.quorum_floor if why == "deadline" else 1)
        with self.store.tx() as c:
            if r["selected"]:
                h = self.arrivals.setdefault(str(r["round_id"]), {"selected": 0, "lat": {}})
                h["selected"] = r["selected"]
                for rid in sorted(self.arrivals, key=int)[:-HISTORY]:
                    del self.arrivals[rid]
                self.store.set_meta("arrivals", json.dumps(self.arrivals))
            if not ok:
                c.execute("UPDATE rounds SET status='failed', closed=?, note=? WHERE round_id=?",
                          (self.clock(), f"{why}: {self.acc.count} of {r['target']} updates", r["round_id"]))
            else:
                params = self.reg.params()
                snapshot = self.strategy.state()
                new = self.strategy.apply(params, self.acc)
                eps = None
                if hasattr(self.strategy, "accountant"):
                    eps = self.strategy.accountant.epsilon(self.cfg.dp_delta)
                    self.store.set_meta("dp_accountant", json.dumps(self.strategy.accountant.state()))
                publish, acc, cur = self.reg.check(new, self.cfg.eval_tolerance)
                if publish:
                    v = self.reg.publish(new, r["round_id"], acc, eps, self.strategy.state())
                    c.execute("UPDATE rounds SET status='closed', closed=?, result_version=?, accuracy=?, note=? "
                              "WHERE round_id=?", (self.clock(), v, acc, why, r["round_id"]))
                else:
                    self.strategy.load_state(snapshot)
                    c.execute("UPDATE rounds SET status='rejected', closed=?, accuracy=?, note=? WHERE round_id=?",
                              (self.clock(), acc, f"held-out accuracy {acc:.4f} < current {cur:.4f} - "
                               f"{self.cfg.eval_tolerance}: rolled back", r["round_id"]))
            c.execute("DELETE FROM updates WHERE round_id=?", (r["round_id"],))
            self._open()

    # --- check-in -------------------------------------------------------------
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
        ``checkin_max_skew``, near our clock): a captured check-in cannot be replayed."""
        t = state.get("time")
        if t is None:
            return None  # MCUs without a clock; docs/protocol.md
        if not isinstance(t, (int, float)) or isinstance(t, bool) or t != t:
            raise Reject(400, "BadRequest", f"check-in time {t!r} is not a number", "send Unix seconds")
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
        self.tick()
        r = self.round
        now = self.clock()
        t = self._check_replay(device_id, state, now)
        with self.store.tx() as c:
            c.execute("UPDATE devices SET last_checkin=?, state=?, tier=?, checkin_time=COALESCE(?, checkin_time) "
                      "WHERE device_id=?", (now, json.dumps(state, sort_keys=True)[:2000],
                                            str(state.get("tier", "linux"))[:16], t, device_id))
        ok, reason = policy.eligible(state, self.cfg)
        if not ok:
            return self._wait(reason)
        sel = self.store.one("SELECT 1 FROM selections WHERE round_id=? AND device_id=?", (r["round_id"], device_id))
        done = self.store.one("SELECT 1 FROM updates WHERE round_id=? AND device_id=?", (r["round_id"], device_id))
        if done:
            return self._wait(f"already contributed to round {r['round_id']}")
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
        recent = self.store.one("SELECT COUNT(*) FROM selections WHERE device_id=? AND round_id > ?",
                                (device_id, r["round_id"] - self.cfg.fairness_window))[0]
        if not policy.within_budget(recent, self.cfg):
            return self._wait(f"fairness budget: joined {recent} of the last {self.cfg.fairness_window} rounds")
        with self.store.tx() as c:
            c.execute("INSERT INTO selections(round_id, device_id, selected_at, base_version) VALUES(?,?,?,?)",
                      (r["round_id"], device_id, now, self.reg.current))
            c.execute("UPDATE rounds SET selected=selected+1 WHERE round_id=?", (r["round_id"],))
        r["selected"] += 1
        return {"action": "train", "task": self.task(r)}

    def selection_target(self) -> int:
        """Devices to select for the open sync round (adaptive over-selection)."""
        return policy.plan_selection(self.round["target"], self.arrivals, self.cfg)

    # --- uploads --------------------------------------------------------------
    def key_of(self, device_id: str):
        key = self._keys.get(device_id)
        if key is None:
            row = self.store.one("SELECT key FROM devices WHERE device_id=?", (device_id,))
            if row is None:
                return None
            key = self._keys[device_id] = bytes(row[0])  # keys are never replaced (setup.provision)
        return key

    def submit(self, frame: bytes, claimed_device: str | None) -> dict:
        """Check, decode and accept one frame; returns the JSON answer or raises ``Reject`` (no state change)."""
        p = self.prepare(frame, claimed_device)
        if isinstance(p, dict):
            return p
        res = self.commit([p])[0]
        if isinstance(res, Reject):
            raise res
        return res

    def _fresh(self, hdr, digest):
        """The duplicate answer for an identical resend, else None; raises ReplayError for an old seq."""
        dup = self.store.one("SELECT round_id, digest FROM updates WHERE device_id=? AND seq=?", (hdr.device_id, hdr.seq))
        if dup is not None and bytes(dup[1]) == digest:
            return {"status": "duplicate", "round_id": dup[0], "accepted": self.round["accepted"]}
        check_fresh(hdr, last_seq=self.store.one("SELECT last_seq FROM devices WHERE device_id=?",
                                                 (hdr.device_id,))[0])
        return None

    def prepare(self, frame: bytes, claimed_device: str | None):
        """Everything that needs no write: authenticate, decode, validate. Returns a ``Pending`` to
        commit, or the answer to an identical resend; raises ``Reject``. The state-dependent checks are
        repeated by ``commit`` inside its transaction, because other frames may commit in between."""
        self.tick()
        if self.secure is not None:
            raise Reject(409, "SecureAggregationRequired", "this aggregator takes updates only through secure "
                         "aggregation", "follow the task's secagg steps (POST /v1/secagg)")
        try:
            hdr, _ = parse_header(frame, self.cfg.max_frame_len)
            if claimed_device is not None and hdr.device_id != claimed_device:
                raise Reject(403, "DeviceMismatch", f"device {claimed_device!r} sent a frame for device {hdr.device_id!r}",
                             "a device may only upload its own updates")
            key = self.key_of(hdr.device_id)
            verify_tag(frame, key if key is not None else (lambda _d: None), hdr.device_id)
            digest = hashlib.sha256(frame).digest()
            dup = self._fresh(hdr, digest)
            if dup is not None:
                return dup
            self._admit(hdr, self.round)
            upd = decode_update(frame, key, max_len=self.cfg.max_frame_len)
        except we.WireError as e:
            raise Reject.from_wire(e) from None
        delta = {t.name: t.values for t in upd.tensors}
        n = hdr.num_examples
        if not 1 <= n <= self.cfg.max_examples:
            raise Reject(422, "BadExampleCount", f"update claims {n} examples; expected 1-{self.cfg.max_examples}",
                         "send the number of local examples the update was trained on")
        try:
            self.acc.check(delta)
        except StrategyError as e:
            raise Reject(422, "BadUpdate", e.problem, e.fix) from None
        norm = float(np.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in delta.values())))
        if not norm <= self.cfg.max_update_norm:
            raise Reject(422, "UpdateNormTooLarge", f"update L2 norm {norm:.4g} exceeds {self.cfg.max_update_norm}",
                         "lower the learning rate or clip the update on the device")
        return Pending(hdr, frame, digest, delta)

    def commit(self, batch: list) -> list:
        """Accept prepared frames with one transaction (group commit): one fsync for the whole batch.

        Returns, per frame, its answer or a ``Reject``. Nothing is acknowledged or added to the running
        sum before the transaction holding it has committed, so a crash loses no acknowledged update.
        A batch that completes the quorum commits up to it, closes the round and goes on in the next.
        """
        out, i = [None] * len(batch), 0
        while i < len(batch):
            r, seg, nbytes, first = self.round, [], 0, i
            try:
                with self.store.tx() as c:
                    while i < len(batch) and r["accepted"] + len(seg) < r["target"]:
                        p = batch[i]
                        c.execute("SAVEPOINT one")
                        try:
                            ans = self._fresh(p.hdr, p.digest)
                            if ans is None:
                                w = self._admit(p.hdr, r)
                                c.execute("INSERT INTO updates(round_id, device_id, seq, base_version, num_examples, "
                                          "digest, frame, received) VALUES(?,?,?,?,?,?,?,?)",
                                          (r["round_id"], p.hdr.device_id, p.hdr.seq, p.hdr.model_version,
                                           p.hdr.num_examples, p.digest, p.frame, self.clock()))
                                c.execute("UPDATE devices SET last_seq=?, rounds_joined=rounds_joined+1, last_round=? "
                                          "WHERE device_id=?", (p.hdr.seq, r["round_id"], p.hdr.device_id))
                                seg.append((i, p, w))
                                nbytes += len(p.frame)
                            out[i] = ans
                            c.execute("RELEASE one")
                        except (Reject, we.WireError) as e:
                            c.execute("ROLLBACK TO one")
                            c.execute("RELEASE one")
                            out[i] = e if isinstance(e, Reject) else Reject.from_wire(e)
                        i += 1
                    if seg:
                        c.execute("UPDATE rounds SET accepted=accepted+?, bytes=bytes+? WHERE round_id=?",
                                  (len(seg), nbytes, r["round_id"]))
            except sqlite3.Error as e:  # e.g. a full or failing disk: this and every later frame waits for a resend
                staged = {j for j, _, _ in seg}
                for j in range(first, len(batch)):
                    if out[j] is None or j in staged:
                        out[j] = Reject(503, "StorageError", f"the update could not be stored ({e})",
                                        "resend it later; nothing was recorded")
                break
            for j, p, w in seg:
                self.acc.add(p.delta, p.hdr.num_examples, w)
                if self.cfg.mode == "sync":
                    self._note_arrival(r["round_id"], p.hdr.device_id, r["selected"])
                r["accepted"] += 1
                out[j] = {"status": "accepted", "round_id": r["round_id"], "accepted": r["accepted"]}
            if r["accepted"] >= r["target"]:
                self._close("quorum")
        return out

    def _admit(self, hdr, r):
        """Round/selection/staleness rules; returns the FedBuff weight (None in sync mode)."""
        contributed = self.store.one("SELECT 1 FROM updates WHERE round_id=? AND device_id=?",
                                     (r["round_id"], hdr.device_id))
        if self.cfg.mode == "sync":
            if hdr.round_id != r["round_id"]:
                self._note_arrival(hdr.round_id, hdr.device_id)  # a late upload: latency evidence only
                raise we.StaleRound(f"frame from {hdr.device_id!r} is for round {hdr.round_id}; round "
                                    f"{r['round_id']} is open" + (" (that round is closed)" if hdr.round_id < r["round_id"] else ""),
                                    fix="drop it and check in for the current round")
            if hdr.model_version != r["model_version"]:
                raise we.StaleModel(f"frame was trained from model v{hdr.model_version}; round {r['round_id']} "
                                    f"trains v{r['model_version']}", fix="install the current bundle and train again")
            if not self.store.one("SELECT 1 FROM selections WHERE round_id=? AND device_id=?",
                                  (r["round_id"], hdr.device_id)):
                raise Reject(403, "NotSelected", f"device {hdr.device_id!r} was not selected for round {r['round_id']}",
                             "check in first and train only when given a task")
        else:
            stale = self.reg.current - hdr.model_version
            if not 0 <= stale <= self.cfg.max_staleness:
                raise we.StaleModel(f"frame was trained from model v{hdr.model_version}, {stale} versions behind "
                                    f"v{self.reg.current} (limit {self.cfg.max_staleness})",
                                    fix="install the current bundle and train again")
            if not self.store.one("SELECT 1 FROM selections WHERE round_id=? AND device_id=?",
                                  (hdr.round_id, hdr.device_id)):
                raise Reject(403, "NotSelected", f"device {hdr.device_id!r} has no task {hdr.round_id}",
                             "check in first and train only when given a task")
        if contributed:
            raise Reject(409, "AlreadyContributed", f"device {hdr.device_id!r} already contributed to round "
                         f"{r['round_id']}", "one update per device per round; wait for the next round")
        return self._weight(hdr.num_examples, hdr.model_version)
