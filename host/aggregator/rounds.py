"""Rounds: who trains, which updates count, when to aggregate; the aggregator's state machine.

Synchronous mode opens a round for the current model, selects eligible
devices as they check in (how many is learnt from who arrived in recent
rounds, ``policy.plan_selection``, between ``overselect`` and
``max_overselect`` × ``clients_per_round``), and closes as soon as ``clients_per_round`` updates are in (it never waits for
the slowest) or at the deadline with at least ``quorum_floor`` (else the round
fails and a new one opens). Asynchronous mode is FedBuff (Nguyen et al.
2022): updates against any of the last ``max_staleness`` versions are
buffered with weight n / sqrt(1 + staleness) and every ``buffer_size`` of them
make a new version. An update's weight is its example count, 1, or once per
device over the fairness window (``update_weight``, ``_weight``); which device
a round accepted is kept in ``contributions`` for the window (the fairness
budget and that weight count it). Every accepted update is committed (frame included)
before it touches the in-memory running sum, and the sum is rebuilt from the
database on start, so a crash neither loses nor double-counts an update.
On a shared store (PostgreSQL, several replicas; ``pgstore.py``) every write
transaction takes the database's advisory lock and, when another replica
committed since, first re-reads what this one holds in memory (``resync``:
the open round's row; after another replica closed the round, the new
version, strategy state, DP accountant, arrivals); a round's running sum is
completed from the committed rows this replica has not added (``_catch_up``)
inside the transaction that closes it, so a round closes once, from exactly
its accepted rows, whichever replica closes it.
Check-ins (eligibility, selection, the task) live in ``selection.py``;
uploads (prepare/commit, group commit, the devices' credentials) in ``uploads.py``; secure
aggregation rounds in ``secure.py``.

    mgr = RoundManager(cfg, store, registry)
    answer = mgr.checkin("pi-001", {"battery": 0.9, "charging": True})
    result = mgr.submit(frame, claimed_device="pi-001")
"""

from __future__ import annotations

import contextlib
import json
import math
import time

import numpy as np

from edge.portable import wire_errors as we
from host.aggregator.errors import STATUS, Reject  # noqa: F401  (re-exported: app, secure)
from host.aggregator.selection import Selection
from host.aggregator.uploads import Pending, Uploads  # noqa: F401
from host.fl.strategies import make_strategy
from host.wire_numpy import decode_update

HISTORY = 10  # rounds of arrival evidence kept for over-selection


class RoundManager(Selection, Uploads):
    """Owns the open round, its running sum, and every state change (called from one thread)."""

    def __init__(self, cfg, store, registry, clock=time.time):
        self.cfg, self.store, self.reg, self.clock = cfg, store, registry, clock
        self.rng = np.random.default_rng(cfg.seed)
        self.strategy = make_strategy(cfg.strategy, **cfg.strategy_options)
        if cfg.dp_noise > 0 or cfg.dp_clip > 0:
            from host.privacy.accountant import RdpAccountant
            from host.privacy.dp import DPStrategy
            n_dev = self.store.one("SELECT COUNT(*) FROM devices")[0]
            # its generator is replaced by the round's own (``_round_rng``) before each aggregation
            self.strategy = DPStrategy(self.strategy, cfg.dp_clip or 1.0, cfg.dp_noise, cfg.clients_per_round,
                                       population=max(n_dev, cfg.clients_per_round))
            s = self.store.get_meta("dp_accountant")
            if s:
                self.strategy.accountant = RdpAccountant.from_state(json.loads(s))
        self.strategy.load_state(self.reg.strategy_state(self.reg.current))
        self.round = None
        self.acc = None
        self.added = set()   # devices whose update of the open round is in self.acc
        self._synced = None  # the change counter this replica last re-read without the lock (SQLite: data_version)
        self._keys = {}
        self.secure = None
        if cfg.secure_aggregation:
            from host.aggregator.secure import SecureRounds
            self.secure = SecureRounds(self)
        # arrivals of recent rounds (round id -> selected, {device: seconds from selection to upload}),
        # late uploads included: the evidence for adaptive over-selection (policy.plan_selection)
        self.arrivals = json.loads(self.store.get_meta("arrivals") or "{}")
        self.recover()
        if self.store.shared:
            self.store.on_stale = self.resync

    # --- rounds ---------------------------------------------------------------
    _COLS = ("round_id", "model_version", "status", "opened", "deadline", "target", "selected", "accepted")

    def _row(self, round_id=None):
        """The round's row as a dict (``round_id`` None: the open round's, or None when none is open)."""
        where = "round_id=?" if round_id is not None else "status='open' ORDER BY round_id DESC LIMIT 1"
        r = self.store.one(f"SELECT {', '.join(self._COLS)} FROM rounds WHERE {where}",
                           () if round_id is None else (round_id,))
        return None if r is None else dict(zip(self._COLS, r))

    def recover(self) -> None:
        """Load the open round and rebuild its running sum from the committed updates."""
        with self.store.tx():  # under the lock: replicas starting together open one round
            r = self.store.one("SELECT round_id FROM rounds WHERE status='open' ORDER BY round_id DESC LIMIT 1")
            if r is None:
                self._open()
                return
            self._supersede_orphans(keep=r[0])
        self.round = self._row(r[0])
        self.acc = self.strategy.begin(self.reg.params())
        self.added = set()
        self._add_rows(self.store.all("SELECT device_id, frame, base_version FROM updates "
                                      "WHERE round_id=? ORDER BY received", (r[0],)))

    def _add_rows(self, rows) -> None:
        prior = self._prior([dev for dev, _, _ in rows])
        for dev, frame, base in rows:
            try:
                upd = decode_update(bytes(frame), self.key_of(dev))
            except we.AuthError:  # the cached key was replaced (re-provisioned after a revocation): re-read it
                upd = decode_update(bytes(frame), self.key_of(dev, fresh=True))
            self.acc.add({t.name: t.values for t in upd.tensors}, upd.header.num_examples,
                         self._weight(upd.header.num_examples, base, prior.get(dev, 0)))
            self.added.add(dev)

    def _prior(self, devices) -> dict:
        """Per device, how many of the ``fairness_window`` - 1 rounds before the open one accepted its
        update (what ``update_weight="device"`` divides by; the same numbers ``_facts`` read at upload)."""
        if self.cfg.update_weight != "device" or not devices:
            return {}
        rid = self.round["round_id"]
        rows = self.store.all("SELECT device_id, COUNT(*) FROM contributions WHERE round_id > ? AND round_id < ? "
                              "GROUP BY device_id", (rid - self.cfg.fairness_window, rid))
        want = set(devices)
        return {d: int(n) for d, n in rows if d in want}

    # --- replicas (shared store) ------------------------------------------------
    def sync(self) -> None:
        """Before deciding anything on a shared store: re-read the shared state if another replica
        committed since (a read without the lock; every write transaction re-checks under it). On
        SQLite, when another process committed (``aggregator revoke`` or ``provision`` beside this
        ``serve``; ``PRAGMA data_version``): the running sum and the round's count follow the rows
        (a revocation takes an accepted update back); closing the round re-checks it in its transaction."""
        if self.store.shared:
            n = self.store.changed()
            if n is not None and n != self._synced:
                self.resync()
                self._synced = n
        elif self.secure is None and self.round is not None:
            n = self.store.data_version()
            if n != self._synced:
                self._reconcile()
                self._synced = n

    def resync(self) -> None:
        """Re-read what another replica may have changed: the open round's row and, when it closed our
        round, the version it published, the strategy state, the DP accountant and the arrivals."""
        row = self._row()  # one query (a round trip): on two busy replicas nearly every transaction asks
        if row is None:
            return  # no round open yet (the first transaction of a new database opens it)
        if self.round is not None and row["round_id"] == self.round["round_id"]:
            self.round.update(row)
        else:
            self.strategy.load_state(self.reg.strategy_state(self.reg.current))
            if hasattr(self.strategy, "accountant"):
                from host.privacy.accountant import RdpAccountant
                s = self.store.get_meta("dp_accountant")
                self.strategy.accountant = RdpAccountant.from_state(json.loads(s)) if s else RdpAccountant()
            self.arrivals = json.loads(self.store.get_meta("arrivals") or "{}")
            self.round = row
            self.acc = self.strategy.begin(self.reg.params())
            self.added = set()
        if self.secure is not None:
            self.secure.load()

    def _reconcile(self) -> None:
        """Make the running sum hold exactly the open round's committed updates (inside the closing
        transaction): add those another replica accepted, and when an update this process added is
        gone (``aggregator revoke`` took a revoked device's back, possibly from another process)
        rebuild the sum from the rows and re-read the round's count."""
        rid = self.round["round_id"]
        have = {d for (d,) in self.store.all("SELECT device_id FROM updates WHERE round_id=?", (rid,))}
        if self.added - have:
            self.acc = self.strategy.begin(self.reg.params())
            self.added = set()
            self._add_rows(self.store.all("SELECT device_id, frame, base_version FROM updates "
                                          "WHERE round_id=? ORDER BY received", (rid,)))
            self.round["accepted"] = self.store.one("SELECT accepted FROM rounds WHERE round_id=?", (rid,))[0]
            return
        for dev in sorted(have - self.added):
            self._add_rows(self.store.all("SELECT device_id, frame, base_version FROM updates "
                                          "WHERE round_id=? AND device_id=?", (rid, dev)))

    def _supersede_orphans(self, keep: int | None) -> None:
        """Close as failed every open round but ``keep`` (None: all of them), inside the caller's
        transaction. A storage failure mid-round (a write refused while the process moved on to the
        next round) leaves the old round's row "open" for good; only the live round may be open."""
        c = self.store.db
        orphans = [rid for (rid,) in c.execute("SELECT round_id FROM rounds WHERE status='open'").fetchall()
                   if rid != keep]
        for rid in orphans:
            c.execute("UPDATE rounds SET status='failed', closed=?, note=? WHERE round_id=?",
                      (self.clock(), "superseded (left open by a storage failure)", rid))
            c.execute("DELETE FROM updates WHERE round_id=?", (rid,))
            c.execute("DELETE FROM contributions WHERE round_id=?", (rid,))

    def _open(self) -> None:
        now = self.clock()
        sync = self.cfg.mode == "sync"
        c = self.store.db
        self._supersede_orphans(keep=None)  # the round this replaces is closed already; others are orphans
        last = c.execute("SELECT COALESCE(MAX(round_id), 0) FROM rounds").fetchone()[0]
        c.execute("INSERT INTO rounds(round_id, mode, model_version, status, opened, deadline, target) "
                  "VALUES(?,?,?,?,?,?,?)", (last + 1, self.cfg.mode, self.reg.current, "open", now,
                                            now + self.cfg.round_timeout if sync else None,
                                            self.cfg.clients_per_round if sync else self.cfg.buffer_size))
        self.round = self._row(last + 1)
        self.acc = self.strategy.begin(self.reg.params())
        self.added = set()

    def _weight(self, n, base_version, prior: int = 0):
        """An accepted update's weight in the round's mean (None: its example count ``n``).

        ``update_weight``: "examples" n (FedAvg), "update" 1, "device" 1 / (1 + ``prior``), ``prior``
        being how many of the window's earlier rounds accepted this device's update: a device heard in
        every round counts about as much over a window as one heard once (inverse participation
        weighting, as FedAU, Wang & Ji 2023, without its estimator's state). Async (FedBuff) divides by
        sqrt(1 + staleness) as well."""
        w = self.cfg.update_weight
        base = float(n) if w == "examples" else 1.0 if w == "update" else 1.0 / (1 + max(0, int(prior)))
        if self.cfg.mode == "async":
            return base / math.sqrt(1 + max(0, self.reg.current - base_version))
        return None if w == "examples" else base

    def tick(self) -> None:
        """Close a synchronous round whose deadline passed, or one whose quorum is in (a replica that
        committed the last update can die before closing it)."""
        self.sync()
        r = self.round
        if r["deadline"] is not None and self.clock() >= r["deadline"]:
            self._close("deadline")
        elif r["accepted"] >= r["target"] and self.secure is None:
            self._close("quorum")
        elif self.secure is not None:
            self.secure.tick()

    def fail_round(self, why: str) -> None:
        """Close the open round as failed (nothing aggregated) and open the next."""
        self.acc = self.strategy.begin(self.reg.params())
        self._close(why, aggregate=False)

    def publish_params(self, params: dict, note: str = "operator") -> int:
        """Publish ``params`` as version current+1 outside any round (an operator's rollout, e.g. a
        hand-fixed head): the current version's tensors with the same shapes, finite, written and
        signed as a round's result is. The open round trained the old version, so it ends as
        ``failed`` ("superseded by vN", its updates dropped) and the next round trains the new one.
        No held-out check: the operator decides. Returns the new version."""
        from edge.errors import EdgelearnError

        cur = self.reg.params()
        new = {k: np.asarray(v, np.float32) for k, v in params.items()}
        if set(new) != set(cur) or any(new[k].shape != cur[k].shape for k in cur):
            raise EdgelearnError(f"the new head has tensors {sorted((k, v.shape) for k, v in new.items())}; "
                                 f"version {self.reg.current} has {sorted((k, v.shape) for k, v in cur.items())}",
                                 fix="publish the same tensors with the same shapes")
        if not all(np.all(np.isfinite(v)) for v in new.values()):
            raise EdgelearnError("the new head holds NaN or infinite values", fix="publish finite numbers")
        with self._publishing(), self.store.tx() as c:
            r = self.round
            v = self.reg.publish(new, None, self.reg.accuracy(new, self.cfg.eval_metric), None, self.strategy.state())
            c.execute("UPDATE rounds SET status='failed', closed=?, note=? WHERE round_id=?",
                      (self.clock(), f"superseded by v{v} ({note})"[:200], r["round_id"]))
            c.execute("DELETE FROM updates WHERE round_id=?", (r["round_id"],))
            c.execute("DELETE FROM contributions WHERE round_id=?", (r["round_id"],))
            self._open()
        return v

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

    @contextlib.contextmanager
    def _publishing(self):
        """On a shared store, a publication that fails (or whose commit is in doubt) leaves no local
        files behind to shadow what another replica publishes under that version number."""
        try:
            yield
        except BaseException:
            if self.store.shared:
                try:
                    v = self.reg.current + 1
                except Exception:  # the database is gone too: forget every local copy
                    v = None
                self.reg.drop_cache(v)
            raise

    def _close(self, why: str, aggregate: bool = True) -> None:
        with self._publishing():
            self._close_tx(why, aggregate)

    def _close_tx(self, why: str, aggregate: bool) -> None:
        rid = self.round["round_id"]
        with self.store.tx() as c:
            r = self.round
            if r["round_id"] != rid:
                return  # another replica closed it meanwhile (resync, at the start of this transaction)
            if aggregate and self.secure is None:  # (a secure round's sum is masked: secure.py)
                self._reconcile()
                if why == "quorum" and r["accepted"] < r["target"]:
                    return  # a revocation took an update back: the round waits for another one
            if self.store.shared and aggregate:
                self._merge_arrivals(rid)
            ok = self.acc.count >= (self.cfg.quorum_floor if why == "deadline" else 1)
            if r["selected"]:
                h = self.arrivals.setdefault(str(r["round_id"]), {"selected": 0, "lat": {}})
                h["selected"] = r["selected"]
                for rid in sorted(self.arrivals, key=int)[:-HISTORY]:
                    del self.arrivals[rid]
                self.store.set_meta("arrivals", json.dumps(self.arrivals))
            # a failed round heard nobody (nothing was aggregated); rounds before the window are forgotten
            c.execute("DELETE FROM contributions WHERE round_id <= ?" + ("" if ok else " OR round_id = ?"),
                      (r["round_id"] - self.cfg.fairness_window,) + (() if ok else (r["round_id"],)))
            if not ok:
                c.execute("UPDATE rounds SET status='failed', closed=?, note=? WHERE round_id=?",
                          (self.clock(), f"{why}: {self.acc.count} of {r['target']} updates", r["round_id"]))
            else:
                params = self.reg.params()
                snapshot = self.strategy.state()
                if hasattr(self.strategy, "rng"):
                    self.strategy.rng = self._round_rng(r["round_id"])
                new = self.strategy.apply(params, self.acc)
                eps = None
                if hasattr(self.strategy, "accountant"):
                    eps = self.strategy.accountant.epsilon(self.cfg.dp_delta)
                    if not math.isfinite(eps):
                        eps = None  # clipping without noise (dp_noise=0) guarantees nothing; JSON has no inf
                    self.store.set_meta("dp_accountant", json.dumps(self.strategy.accountant.state()))
                publish, acc, cur = self.reg.check(new, self.cfg.eval_tolerance, self.cfg.eval_metric,
                                                   self.cfg.eval_against)
                note = why
                for a in ([] if publish else self.cfg.eval_shrink):
                    # part of the step: the strategy's state stays the aggregated one (a DP accountant
                    # counts this release too; momentum keeps the whole step it saw)
                    part = {k: params[k] + np.float32(a) * (w - params[k]) if k in params else w
                            for k, w in new.items()}
                    ok, a_acc, a_cur = self.reg.check(part, self.cfg.eval_tolerance, self.cfg.eval_metric,
                                                      self.cfg.eval_against)
                    if ok:
                        note = (f"{why}; published {a:g} of the aggregate (whole: held-out {self.cfg.eval_metric} "
                                f"{acc:.4f} < {self.cfg.eval_against} {cur:.4f} - {self.cfg.eval_tolerance})")
                        new, publish, acc, cur = part, True, a_acc, a_cur
                        break
                if publish:
                    v = self.reg.publish(new, r["round_id"], acc, eps, self.strategy.state())
                    c.execute("UPDATE rounds SET status='closed', closed=?, result_version=?, accuracy=?, note=? "
                              "WHERE round_id=?", (self.clock(), v, acc, note, r["round_id"]))
                else:
                    self.strategy.load_state(snapshot)
                    c.execute("UPDATE rounds SET status='rejected', closed=?, accuracy=?, note=? WHERE round_id=?",
                              (self.clock(), acc, f"held-out {self.cfg.eval_metric} {acc:.4f} < "
                               f"{self.cfg.eval_against} {cur:.4f} - {self.cfg.eval_tolerance}: rolled back",
                               r["round_id"]))
            c.execute("DELETE FROM updates WHERE round_id=?", (r["round_id"],))
            self._open()

    def _merge_arrivals(self, round_id: int) -> None:
        """Latency evidence of the updates other replicas accepted (each notes only its own)."""
        h = self.arrivals.setdefault(str(round_id), {"selected": self.round["selected"], "lat": {}})
        for dev, lat in self.store.all("SELECT u.device_id, u.received - s.selected_at FROM updates u JOIN "
                                       "selections s ON s.round_id=u.round_id AND s.device_id=u.device_id "
                                       "WHERE u.round_id=?", (round_id,)):
            h["lat"].setdefault(dev, round(float(lat), 4))

    def _round_rng(self, round_id: int):
        """DP noise for one round, a function of (seed, round id) alone: the same whichever replica
        closes it and after a restart (a round re-closed after a crash adds the same noise to the same
        sum), and never the same for two rounds. The seed is a secret of the database (``dp_seed``,
        made by ``init_state``, or here under the lock for a database made before it), so knowing the
        config does not reveal the noise; ``dp_reproducible`` uses the public ``cfg.seed`` instead."""
        if self.cfg.dp_reproducible:
            return np.random.default_rng([int(self.cfg.seed), round_id])
        seed = self.store.get_meta("dp_seed")
        if seed is None:
            from host.aggregator.setup import new_dp_seed
            seed = new_dp_seed()
            self.store.set_meta("dp_seed", seed)
        return np.random.default_rng([int(seed), round_id])
