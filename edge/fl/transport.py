"""HTTP to the aggregator: one keep-alive connection, reconnected once on a dropped connection, and
the aggregator's refusals as ``FLError`` (status, reason, the problem and fix it sent, and its
machine-readable fields: a frame's 409 ``ReplayError`` has ``last_seq``); a revoked key's 403 is
``DeviceRevoked``.

Only standard-library HTTP (``http.client``), so a Pi needs nothing beyond the device runtime.
Anything with ``request(method, path, body, headers) -> (status, body)`` can stand in for
``HttpTransport`` (the fleet simulator's in-process transport, a test's tampering proxy).

    http = HttpTransport("http://agg:8470")
    status, body = call(http, "POST", "/v1/checkin", body, headers)   # FLError unless 200
"""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

from edge.errors import EdgelearnError


class FLError(EdgelearnError):
    """The aggregator refused a request or could not be reached. ``fields``: the error body's other
    members (``last_seq`` ...), {} when it sent none (an older aggregator) or was not reached."""

    def __init__(self, problem, fix=None, status=None, reason=None, fields=None):
        super().__init__(problem, fix)
        self.status, self.reason = status, reason
        self.fields = dict(fields or {})


class DeviceRevoked(FLError):
    """The aggregator revoked this device's key (``edgelearn aggregator revoke``; HTTP 403
    ``DeviceRevoked``): nothing signed with it is accepted again, and re-provisioning gives the
    device a new key file. The agent backs off from it as from a 401
    (``edge.agent_federation.refused_credentials``): retrying will not heal either."""

    def __init__(self, problem, fix=None, fields=None):
        super().__init__(problem, fix, status=403, reason="DeviceRevoked", fields=fields)


class HttpTransport:
    """A keep-alive HTTP/1.1 connection to the aggregator (reconnects once on a dropped connection)."""

    def __init__(self, base_url: str, timeout: float = 30.0):
        u = urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise EdgelearnError(f"aggregator URL {base_url!r} is not http://host:port",
                                 fix="e.g. http://192.168.1.10:8470 (put TLS in a reverse proxy)")
        self.host, self.port, self.timeout = u.hostname, u.port or 80, timeout
        self.conn = None

    def request(self, method: str, path: str, body: bytes = b"", headers=None):
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self.conn.request(method, path, body=body, headers=headers or {})
                r = self.conn.getresponse()
                return r.status, r.read()
            except (ConnectionError, http.client.HTTPException, OSError) as e:
                self.close()
                if attempt:
                    raise FLError(f"aggregator at {self.host}:{self.port} unreachable ({e})",
                                  fix="check the network; the device retries at its next check-in") from None

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def call(http, method: str, path: str, body: bytes = b"", headers=None, ok=(200,)):
    """One request; ``(status, body)`` when the status is in ``ok``, else FLError with the
    aggregator's problem, fix, reason and other fields (its JSON error body, or the start of whatever
    it sent); ``DeviceRevoked`` for a 403 ``DeviceRevoked``."""
    status, raw = http.request(method, path, body, headers)
    if status not in ok:
        try:
            err = json.loads(raw)
        except ValueError:
            err = None
        if not isinstance(err, dict):
            err = {"problem": raw[:200].decode(errors="replace")}
        fields = {k: v for k, v in err.items() if k not in ("error", "problem", "fix")}
        problem = f"{method} {path} -> {status}: {err.get('problem')}"
        if status == 403 and err.get("error") == "DeviceRevoked":
            raise DeviceRevoked(problem, fix=err.get("fix"), fields=fields)
        raise FLError(problem, fix=err.get("fix"), status=status, reason=err.get("error"), fields=fields)
    return status, raw
