"""The upload path of ``RoundManager``: authenticate, decode and check frames, then accept them in
group-committed transactions (host/aggregator/app.py ``GroupCommit`` batches them over HTTP).

Split from rounds.py to keep each file about one thing; ``RoundManager`` inherits ``Uploads``.

    p = mgr.prepare(frame, "pi-001")          # Pending, or the answer to an identical resend
    answers = mgr.commit([p, ...])            # one transaction, one fsync, a few statements per batch
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

import numpy as np

from edge.portable import wire_errors as we
from edge.portable.wire_decode import check_fresh, parse_header, verify_tag
from host.aggregator.errors import Reject, revoked
from host.fl.strategies import StrategyError
from host.wire_numpy import decode_update


CHECK_CHUNK = 1000  # frames checked by one query: 6 parameters each, well under SQLite's and PostgreSQL's limits


class Pending(NamedTuple):
    """A frame that passed every check that needs no write, waiting for its transaction."""
    hdr: object
    frame: bytes
    digest: bytes
    delta: dict
    key: bytes = b""  # the device key its tag verified with (``commit`` checks it is still the device's)


class Uploads:
    """Mixin: needs ``cfg``, ``store``, ``round``, ``acc``, ``reg``, ``clock``, ``secure``, ``tick``,
    ``_keys`` (the credentials' cache), ``_weight``, ``_note_arrival``, ``_close`` from ``RoundManager``.
    The devices' credentials (``credentials``, ``key_of``) are here too: uploads check them first."""

    def credentials(self, device_id: str, fresh: bool = False):
        """(HMAC key, Unix time it was revoked or None) of a device, or None when it is not provisioned.
        Cached; ``fresh`` reads the database, where ``aggregator revoke`` and ``provision`` (a new key
        for a revoked device) change them while this process serves: signed check-ins and secure-
        aggregation messages ask fresh (app.py), uploads use the cache and ``commit`` checks both
        against the database inside its transaction (``_facts``)."""
        c = None if fresh else self._keys.get(device_id)
        if c is None:
            row = self.store.one("SELECT key, revoked FROM devices WHERE device_id=?", (device_id,))
            if row is None:
                self._keys.pop(device_id, None)
                return None
            c = self._keys[device_id] = (bytes(row[0]), None if row[1] is None else float(row[1]))
        return c

    def key_of(self, device_id: str, fresh: bool = False):
        c = self.credentials(device_id, fresh)
        return None if c is None else c[0]

    def submit(self, frame: bytes, claimed_device: str | None) -> dict:
        """Check, decode and accept one frame; returns the JSON answer or raises ``Reject`` (no state change)."""
        p = self.prepare(frame, claimed_device)
        if isinstance(p, dict):
            return p
        res = self.commit([p])[0]
        if isinstance(res, Reject):
            raise res
        return res

    def _facts(self, items, r) -> list:
        """What the state-dependent checks of each (header, digest) need, in one query (one round trip
        to a database server, whatever the batch): (the round of an identical committed frame or None,
        the device's last seq, whether it contributed to round ``r``, whether it was selected: for
        ``r`` in sync mode, for its task's round in async mode, how many of the window's earlier
        rounds accepted its update: ``update_weight="device"``, when its key was revoked or None, and
        whether the key the frame verified with is still its key: ``aggregator revoke`` and
        ``provision`` change both while this process serves). ``items``: (header, digest, key)."""
        sync = self.cfg.mode == "sync"
        args = []
        for i, (hdr, digest, key) in enumerate(items):
            args += (i, hdr.device_id, hdr.seq, digest, r["round_id"] if sync else hdr.round_id, key)
        return self.store.all(
            f"WITH b(i, dev, seq, digest, task, k) AS (VALUES {','.join(['(?,?,?,?,?,?)'] * len(items))}) SELECT "
            "(SELECT u.round_id FROM updates u WHERE u.device_id=b.dev AND u.seq=b.seq AND u.digest=b.digest), "
            "(SELECT d.last_seq FROM devices d WHERE d.device_id=b.dev), "
            "EXISTS(SELECT 1 FROM updates u WHERE u.round_id=? AND u.device_id=b.dev), "
            "EXISTS(SELECT 1 FROM selections s WHERE s.round_id=b.task AND s.device_id=b.dev), "
            "(SELECT COUNT(*) FROM contributions k WHERE k.device_id=b.dev AND k.round_id > ? AND k.round_id < ?), "
            "(SELECT d.revoked FROM devices d WHERE d.device_id=b.dev), "
            "EXISTS(SELECT 1 FROM devices d WHERE d.device_id=b.dev AND d.key=b.k) "
            "FROM b ORDER BY b.i",
            (*args, r["round_id"], r["round_id"] - self.cfg.fairness_window, r["round_id"]))

    def _still_valid(self, hdr, revoked_at, key_ok):
        """Refuse a frame whose device was revoked (403) or whose key was replaced (401) since its tag
        was verified with the cached key; the cache forgets the device, so its next request reads both."""
        if revoked_at is None and key_ok:
            return
        self._keys.pop(hdr.device_id, None)
        if revoked_at is not None:
            raise revoked(hdr.device_id, revoked_at)
        raise Reject(401, "AuthError", f"frame from {hdr.device_id!r} is signed with a key that is no longer "
                     "this device's (it was provisioned again)", "sign with the key file the last "
                     "`edgelearn aggregator provision` wrote for this device")

    def _fresh(self, hdr, dup, last):
        """The duplicate answer for an identical resend, else None; raises ReplayError for an old seq."""
        if dup is not None:
            return {"status": "duplicate", "round_id": dup, "accepted": self.round["accepted"]}
        try:
            check_fresh(hdr, last_seq=last)
        except we.ReplayError as e:  # the client continues above it: a field, so it need not parse the text
            raise Reject.from_wire(e, last_seq=int(last)) from None
        return None

    def prepare(self, frame: bytes, claimed_device: str | None):
        """Everything that needs no write: authenticate, decode, validate. Returns a ``Pending`` to
        commit, or the answer to an identical resend; raises ``Reject``. The state-dependent checks are
        repeated by ``commit`` inside its transaction, because other frames may commit in between."""
        if not self.store.shared:  # on a shared store the ticker and check-ins do (a query per frame saved)
            self.tick()
        if self.secure is not None:
            raise Reject(409, "SecureAggregationRequired", "this aggregator takes updates only through secure "
                         "aggregation", "follow the task's secagg steps (POST /v1/secagg)")
        try:
            hdr, _ = parse_header(frame, self.cfg.max_frame_len)
            if claimed_device is not None and hdr.device_id != claimed_device:
                raise Reject(403, "DeviceMismatch", f"device {claimed_device!r} sent a frame for device {hdr.device_id!r}",
                             "a device may only upload its own updates")
            key, revoked_at = self._verify(frame, hdr.device_id)
            if revoked_at is not None:
                raise revoked(hdr.device_id, revoked_at)
            digest = hashlib.sha256(frame).digest()
            if not self.store.shared:  # on a shared store commit() alone asks, under the lock: the round
                dup, last, contributed, selected, prior, revoked_at, key_ok = self._facts(  # read here may
                    [(hdr, digest, key)], self.round)[0]  # be gone by then, and each query is a round trip
                self._still_valid(hdr, revoked_at, key_ok)
                ans = self._fresh(hdr, dup, last)
                if ans is not None:
                    return ans
                self._admit(hdr, self.round, contributed, selected, prior)
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
        return Pending(hdr, frame, digest, delta, key)

    def _verify(self, frame, device_id):
        """(key, revoked time or None) of the device whose key verifies ``frame``'s tag; the cached
        credentials first, read again from the database when they fail or say revoked (``aggregator
        provision`` may have given the device a new key meanwhile). Raises the wire's AuthError."""
        cred = self.credentials(device_id)
        if cred is not None and cred[1] is None:
            try:
                verify_tag(frame, cred[0], device_id)
                return cred
            except we.AuthError:
                pass
        fresh = self.credentials(device_id, fresh=True)
        if fresh is None or fresh != cred or cred[1] is None:
            verify_tag(frame, fresh[0] if fresh is not None else (lambda _d: None), device_id)
            return fresh
        verify_tag(frame, cred[0], device_id)  # the same revoked key: its holder learns it is revoked
        return cred

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
                    r = self.round  # on a shared store, as another replica may have left it (resync)
                    taken = {}  # device -> (seq, digest) accepted in this transaction
                    # every check first, from one query per chunk of as many frames as the quorum still
                    # needs; a refused frame writes nothing, so the writes of the accepted ones are one
                    # statement per table (a round trip each on PostgreSQL, not four a frame)
                    while i < len(batch) and r["accepted"] + len(seg) < r["target"]:
                        chunk = batch[i:i + min(CHECK_CHUNK, r["target"] - r["accepted"] - len(seg))]
                        for p, (dup, last, contributed, selected, prior, revoked_at, key_ok) in zip(
                                chunk, self._facts([(p.hdr, p.digest, p.key) for p in chunk], r)):
                            dev = p.hdr.device_id
                            if dev in taken:  # a device's second frame in one batch: as if its first were committed
                                dup = r["round_id"] if taken[dev] == (p.hdr.seq, p.digest) else None
                                last, contributed = taken[dev][0], True
                            try:
                                self._still_valid(p.hdr, revoked_at, key_ok)
                                ans = self._fresh(p.hdr, dup, last)
                                if ans is None:
                                    seg.append((i, p, self._admit(p.hdr, r, contributed, selected, prior)))
                                    taken[dev] = (p.hdr.seq, p.digest)
                                    nbytes += len(p.frame)
                                out[i] = ans
                            except (Reject, we.WireError) as e:
                                out[i] = e if isinstance(e, Reject) else Reject.from_wire(e)
                            i += 1
                    if seg:
                        now = self.clock()
                        c.executemany("INSERT INTO updates(round_id, device_id, seq, base_version, num_examples, "
                                      "digest, frame, received) VALUES(?,?,?,?,?,?,?,?)",
                                      [(r["round_id"], p.hdr.device_id, p.hdr.seq, p.hdr.model_version,
                                        p.hdr.num_examples, p.digest, p.frame, now) for _, p, _ in seg])
                        c.executemany("INSERT INTO contributions(round_id, device_id) VALUES(?,?)",
                                      [(r["round_id"], p.hdr.device_id) for _, p, _ in seg])
                        c.executemany("UPDATE devices SET last_seq=?, rounds_joined=rounds_joined+1, last_round=? "
                                      "WHERE device_id=?", [(p.hdr.seq, r["round_id"], p.hdr.device_id)
                                                            for _, p, _ in seg])
                        c.execute("UPDATE rounds SET accepted=accepted+?, bytes=bytes+? WHERE round_id=?",
                                  (len(seg), nbytes, r["round_id"]))
            except self.store.Error as e:  # a full or failing disk, a lost database connection: this and every
                # later frame waits for a resend
                staged = {j for j, _, _ in seg}
                for j in range(first, len(batch)):
                    if out[j] is None or j in staged:
                        out[j] = Reject(503, "StorageError", f"the update could not be stored ({e})",
                                        "resend it later; nothing was recorded")
                break
            for j, p, w in seg:
                self.acc.add(p.delta, p.hdr.num_examples, w)
                self.added.add(p.hdr.device_id)
                if self.cfg.mode == "sync" and not self.store.shared:  # shared: _close reads it from the rows
                    self._note_arrival(r["round_id"], p.hdr.device_id, r["selected"])
                r["accepted"] += 1
                out[j] = {"status": "accepted", "round_id": r["round_id"], "accepted": r["accepted"]}
            if r["accepted"] >= r["target"]:
                self._close("quorum")  # on a shared store a no-op if another replica closed it first
        return out

    def _admit(self, hdr, r, contributed, selected, prior=0):
        """Round/selection/staleness rules (``_facts`` read the state); returns the update's weight
        (``RoundManager._weight``; None: its example count)."""
        sync = self.cfg.mode == "sync"
        if sync:
            if hdr.round_id != r["round_id"]:
                self._note_arrival(hdr.round_id, hdr.device_id)  # a late upload: latency evidence only
                raise we.StaleRound(f"frame from {hdr.device_id!r} is for round {hdr.round_id}; round "
                                    f"{r['round_id']} is open" + (" (that round is closed)" if hdr.round_id < r["round_id"] else ""),
                                    fix="drop it and check in for the current round")
            if hdr.model_version != r["model_version"]:
                raise we.StaleModel(f"frame was trained from model v{hdr.model_version}; round {r['round_id']} "
                                    f"trains v{r['model_version']}", fix="install the current bundle and train again")
            if not selected:
                raise Reject(403, "NotSelected", f"device {hdr.device_id!r} was not selected for round {r['round_id']}",
                             "check in first and train only when given a task")
        else:
            stale = self.reg.current - hdr.model_version
            if not 0 <= stale <= self.cfg.max_staleness:
                raise we.StaleModel(f"frame was trained from model v{hdr.model_version}, {stale} versions behind "
                                    f"v{self.reg.current} (limit {self.cfg.max_staleness})",
                                    fix="install the current bundle and train again")
            if not selected:
                raise Reject(403, "NotSelected", f"device {hdr.device_id!r} has no task {hdr.round_id}",
                             "check in first and train only when given a task")
        if contributed:
            raise Reject(409, "AlreadyContributed", f"device {hdr.device_id!r} already contributed to round "
                         f"{r['round_id']}", "one update per device per round; wait for the next round")
        return self._weight(hdr.num_examples, hdr.model_version, prior)
