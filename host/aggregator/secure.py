"""Secure-aggregation rounds in the aggregator: the four message phases over HTTP, phase deadlines,
and the unmasked sum folded into the round's strategy (host/privacy/secagg.py has the protocol).

With ``secure_aggregation`` on, a selected device does not POST a frame to
/v1/updates; it drives ``POST /v1/secagg`` with signed JSON messages
``{"round_id", "step", ...}``, step one of ``advertise``, ``share``,
``masked``, ``unmask`` or ``state`` (a poll), and each answer tells it the
current phase and what it needs for it (roster and threshold, its inbox of
encrypted shares, the survivor list). A phase closes when every device of the
previous phase answered, or at its deadline (``secagg_phase_timeout``) with
whoever did; below the threshold the round fails and reveals nothing. The
session lives in memory: an aggregator restart aborts the secure round (the
devices' keys are per round), it never reveals a partial sum. On a shared
store (several replicas on PostgreSQL) each message is handled inside one
locked transaction that loads the session another replica saved (``load``),
applies the message and saves it back (``meta.secagg``), so a device may send
each step to any replica; what a device sent stays as secret as in memory
(masked vectors and encrypted shares only), but the session then survives a
replica's restart.

    sec = SecureRounds(round_manager)
    answer = sec.message("pi-001", {"round_id": 4, "step": "state"})
"""

from __future__ import annotations

import base64
import contextlib
import json
import math

import numpy as np

from edge.secagg import SecAggError
from host.aggregator.rounds import Reject
from host.privacy.secagg import SecAggSession, fold_sum

STEPS = ("advertise", "share", "masked", "unmask", "state")


def _names(u):
    return None if u is None else sorted(u)


def layout(shapes: dict) -> tuple[list, int]:
    """(tensor names in vector order, vector length incl. the weight slot) for {name: shape}."""
    return sorted(shapes), sum(int(np.prod(s)) for s in shapes.values()) + 1


class SecureRounds:
    def __init__(self, rm):
        self.rm, self.cfg = rm, rm.cfg
        self.session: SecAggSession | None = None
        self.deadline = None
        self.failures = 0

    def task_fields(self) -> dict:
        names, dim = layout(self.rm.acc.shapes)
        return {"secagg": {"frac_bits": self.cfg.secagg_frac_bits, "names": names, "dim": dim}}

    def _session(self, round_id: int) -> SecAggSession:
        r = self.rm.round
        if round_id != r["round_id"]:
            raise Reject(410, "StaleRound", f"secure round {round_id} is over; round {r['round_id']} is open",
                         "check in for the current round")
        if self.session is None or self.session.round_id != round_id:
            self.session = SecAggSession(round_id, threshold=2, dim=layout(self.rm.acc.shapes)[1])
            self.deadline = self.rm.clock() + self.cfg.secagg_phase_timeout
        return self.session

    # --- the session on a shared store ------------------------------------------------------------
    def _locked(self):
        """The transaction a message runs in on a shared store (loads the session if another replica saved one)."""
        return self.rm.store.tx() if self.rm.store.shared else contextlib.nullcontext()

    def save(self) -> None:
        if not self.rm.store.shared:
            return
        s = self.session
        d = None if s is None else {
            "round_id": s.round_id, "t": s.t, "dim": s.dim, "phase": s.phase, "keys": s.keys, "shares": s.shares,
            "masked": {k: base64.b64encode(v.astype("<u4").tobytes()).decode() for k, v in s.masked.items()},
            "unmasks": s.unmasks, "u1": _names(s.u1), "u2": _names(s.u2), "u3": _names(s.u3),
            "total": None if s.total is None else base64.b64encode(s.total.astype("<u4").tobytes()).decode(),
            "deadline": self.deadline}
        self.rm.store.set_meta("secagg", json.dumps(d))

    def load(self) -> None:
        """The session as the last replica to handle a message left it (resync calls this)."""
        raw = self.rm.store.get_meta("secagg")
        d = json.loads(raw) if raw else None
        if d is None or d["round_id"] != self.rm.round["round_id"]:
            self.session = None
            return
        s = SecAggSession(d["round_id"], threshold=d["t"], dim=d["dim"])
        s.phase, s.keys, s.shares, s.unmasks = d["phase"], d["keys"], d["shares"], d["unmasks"]
        s.masked = {k: np.frombuffer(base64.b64decode(v), "<u4").astype(np.uint32) for k, v in d["masked"].items()}
        s.u1, s.u2, s.u3 = (None if d[k] is None else frozenset(d[k]) for k in ("u1", "u2", "u3"))
        s.total = None if d["total"] is None else np.frombuffer(base64.b64decode(d["total"]), "<u4").astype(np.uint32)
        self.session, self.deadline = s, d["deadline"]

    def message(self, dev: str, msg: dict) -> dict:
        step, rid = msg.get("step"), msg.get("round_id")
        if step not in STEPS or not isinstance(rid, int):
            raise Reject(400, "BadRequest", f"secagg message needs an integer round_id and a step in {STEPS}",
                         "send the message edge.fl builds")
        self.rm.tick()
        with self._locked():
            out = self._message(dev, msg, step, rid)
            self.save()
        return out

    def _message(self, dev: str, msg: dict, step, rid) -> dict:
        if not self.rm.store.one("SELECT 1 FROM selections WHERE round_id=? AND device_id=?", (rid, dev)):
            raise Reject(403, "NotSelected", f"device {dev!r} was not selected for round {rid}",
                         "check in first and take part only when given a task")
        if step == "state" and rid != self.rm.round["round_id"]:
            return self.view(dev, rid)  # how that round ended
        s = self._session(rid)
        try:
            if step == "advertise":
                s.advertise(dev, msg.get("keys") or {})
            elif step == "share":
                s.share(dev, msg.get("shares") or {})
            elif step == "masked":
                try:
                    y = np.frombuffer(base64.b64decode(msg.get("y", ""), validate=True), "<u4")
                except ValueError:
                    raise SecAggError("masked input is not base64 of little-endian uint32",
                                      fix="send masked_input() as base64") from None
                s.mask(dev, y.astype(np.uint32))
            elif step == "unmask":
                s.unmask(dev, msg.get("shares") or {})
        except SecAggError as e:
            raise Reject(409, "SecAggError", e.problem, e.fix) from None
        except (ValueError, TypeError, AttributeError) as e:
            raise Reject(400, "BadRequest", f"secagg {step} message is malformed ({e})",
                         "send the message edge.fl builds") from None
        self.advance()
        return self.view(dev, rid)

    def view(self, dev: str, rid: int) -> dict:
        s = self.session
        if s is None or s.round_id != rid:
            r = self.rm.store.one("SELECT status, note FROM rounds WHERE round_id=?", (rid,))
            return {"phase": "done" if r and r[0] in ("closed", "rejected") else "failed",
                    "round_id": rid, "note": r[1] if r else None}
        out = {"phase": s.phase, "round_id": rid}
        if s.phase == "share" and dev in s.u1:
            out.update(roster=s.roster(), threshold=s.t)
        elif s.phase == "masked" and dev in s.u2:
            out.update(inbox=s.inbox(dev))
        elif s.phase == "unmask" and dev in s.u3:
            out.update(survivors=s.survivors())
        return out

    def tick(self) -> None:
        if self.session is not None and self.rm.clock() >= self.deadline:
            with self._locked():  # on a shared store: re-checked on the session as it is now
                if self.session is not None and self.rm.clock() >= self.deadline:
                    self.advance(force=True)
                    self.save()

    def advance(self, force: bool = False) -> None:
        """Close every phase that is complete (or overdue); finish or fail the round at the end."""
        s, r = self.session, self.rm.round
        while s is not None and s.phase in ("advertise", "share", "masked", "unmask"):
            if s.phase == "advertise":
                full = r["selected"] >= self.rm.selection_target() and len(s.keys) >= r["selected"]
                if not (full or force):
                    return
                # more than half of the roster, so no server can hold both kinds of share of a device
                s.t = max(2, len(s.keys) // 2 + 1, math.ceil(self.cfg.secagg_threshold * len(s.keys)))
            elif not (s.ready() or force):
                return
            force = False
            try:
                s.close_phase()
            except SecAggError as e:
                self.failures += 1
                self.session = None
                self.rm.fail_round(f"secure aggregation: {e.problem}")
                return
            self.deadline = self.rm.clock() + self.cfg.secagg_phase_timeout
        if s is not None and s.phase == "done":
            names, _ = layout(self.rm.acc.shapes)
            fold_sum(self.rm.acc, s.result(), names, self.cfg.secagg_frac_bits, count=len(s.u3))
            self.session = None
            with self.rm.store.tx() as c:
                c.execute("UPDATE rounds SET accepted=? WHERE round_id=?", (len(s.u3), s.round_id))
                # who the round heard (never what each sent): the fairness budget counts it
                c.executemany("INSERT INTO contributions(round_id, device_id) VALUES(?,?) ON CONFLICT DO NOTHING",
                              [(s.round_id, d) for d in sorted(s.u3)])
            r["accepted"] = len(s.u3)
            self.rm._close("secure aggregation")
