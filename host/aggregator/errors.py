"""The aggregator's refusals: an HTTP status, a machine-readable reason and a one-line problem/fix,
plus, for some, machine-readable fields (a frame's 409 ``ReplayError`` carries ``last_seq``).

    raise Reject(409, "AlreadyContributed", "device 'pi-001' already contributed to round 4", "wait")
    raise revoked("pi-001", 1767225600.0)    # 403 DeviceRevoked: `edgelearn aggregator revoke`
"""

from __future__ import annotations

import sys
import time

from edge.portable import wire_errors as we

# wire error class -> HTTP status (docs/protocol.md); subclasses come first
STATUS = [(we.OversizedFrame, 413), (we.UnknownDevice, 401), (we.AuthError, 401), (we.ReplayError, 409),
          (we.StaleRound, 410), (we.StaleModel, 409), (we.ChunkError, 400), (we.WireError, 400)]


class Reject(Exception):
    """A request refused with an HTTP status, a machine-readable reason and a one-line problem/fix."""

    def __init__(self, status: int, error: str, problem: str, fix: str | None = None, **fields):
        super().__init__(problem)
        self.status, self.error, self.problem, self.fix = status, error, problem, fix
        self.fields = fields  # machine-readable extras of the body (``last_seq``): a client need not parse text

    @classmethod
    def from_wire(cls, e: we.WireError, **fields) -> "Reject":
        status = next(s for c, s in STATUS if isinstance(e, c))
        return cls(status, type(e).__name__, e.problem, e.fix, **fields)

    def body(self) -> dict:
        return {"error": self.error, "problem": self.problem, "fix": self.fix, **self.fields}


def revoked_on(t: float) -> str:
    """A revocation time as the refusal and ``aggregator status`` print it (UTC, to the second)."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(t)))


def revoked(device_id: str, t: float) -> Reject:
    """The 403 every request signed with a revoked device's key gets (``edgelearn aggregator revoke``)."""
    return Reject(403, "DeviceRevoked", f"device {device_id!r} was revoked on {revoked_on(t)}; "
                  "provision it again to rejoin",
                  f"run `edgelearn aggregator provision --device {device_id}` and install the new key file "
                  "on the device (the old key is never accepted again)")


def log_storage_error(seen: set, where: str, exc: BaseException) -> None:
    """One stderr line per kind of storage failure (where, exception type, first line): devices
    already get 503s, and an outage of a minute would otherwise be thousands of identical lines
    (or, as before, none at all)."""
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    kind = (where, type(exc).__name__, first)
    if kind not in seen:
        seen.add(kind)
        print(f"aggregator: {where} failed: {type(exc).__name__}: {first} "
              f"(devices are answered 503; this kind is not logged again)", file=sys.stderr, flush=True)
