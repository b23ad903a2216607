"""The agent's federated rounds: on its schedule a background thread checks in with the aggregator
(``edge.fl.FLClient``: trains the federated head on the device's own examples and uploads when
selected) and posts what happened; between audio chunks the loop reads it back, counts the rounds
joined and the bytes uploaded, and has the version a round installed checked (``Versions``).
``_HeldTransport`` is how a test stops that thread at a named point (``EDGELEARN_AGENT_HOLD``).

Split from agent.py to keep each file about one thing; ``Agent`` inherits ``Federation``, and
``edge.agent`` imports the constants and ``_HeldTransport`` from here.

    >>> agent._poll_federation(agent.clock())   # between two chunks: a check-in when one is due
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from pathlib import Path

from edge.agent_versions import FL_DIR
from edge.atomic import atomic_write
from edge.errors import EdgelearnError

# copies of each labelled command clip in a federated round (bench/fl_voices: augment=8). The trainer
# stays FLClient's default (the whole head): the shipped-head task's keep_absent trainer
# (edge.fl.model.shipped_head_trainer) leaves the outputs of labels no device hears as a published
# version had them, so a broken version is never repaired there (tests/test_agent_fleet.py's v5)
FL_AUGMENT = 8
HOLD_ENV = "EDGELEARN_AGENT_HOLD"  # test-only: stop the federated thread at a named point (_HeldTransport)
# A refusal of the device's own credentials (a wrong or revoked --device-key, an unknown --device-id)
# will not heal by itself: the agent used to retry it at every check-in for ever, logging a 401 each
# time, while agent.json said nothing. Now it is recorded (``federation`` in agent.json) and the next
# check-ins back off: the interval times 2, 4, 8, then AUTH_BACKOFF_CAP; one that works resets it.
AUTH_BACKOFF_CAP = 10  # times --checkin-every


def refused_credentials(e) -> bool:
    """Whether the aggregator refused this device's own key or id: any 401 (no/unknown device, a MAC
    that does not match), the 403 of a check-in made as another device, or the 403 of a revoked key
    (``aggregator revoke``). Not a 403 "NotSelected" (the round moved on) nor a 409 (a replayed
    sequence): those are about one round, not the key."""
    status = getattr(e, "status", None)
    return status == 401 or (status == 403 and getattr(e, "reason", None) in ("DeviceMismatch", "DeviceRevoked"))


def check_federation(cfg) -> None:
    """What ``--aggregator``, ``--device-id`` and ``--device-key`` name, checked before the agent
    starts: an http URL with a host, and a readable device key file (one sentence each). An
    aggregator that is merely unreachable is a condition of the run: logged and retried."""
    from urllib.parse import urlsplit

    from edge.keys import load_hmac_key

    if not cfg.aggregator:
        return
    if not (cfg.device_id and cfg.device_key):
        raise EdgelearnError("--aggregator needs --device-id and --device-key",
                             fix="pass the id and the key file `edgelearn aggregator provision` wrote")
    try:
        url = urlsplit(str(cfg.aggregator))
        port_ok = url.port is None or url.port > 0
    except ValueError:
        url, port_ok = None, False
    if url is None or url.scheme != "http" or not url.hostname or not port_ok:
        raise EdgelearnError(f"--aggregator {cfg.aggregator} is not an aggregator URL (http://HOST:PORT)",
                             fix="pass the address `edgelearn aggregator serve` prints, e.g. "
                                 "http://192.168.1.10:8470 (put TLS in a reverse proxy)")
    key, fix = Path(cfg.device_key), "pass the key file `edgelearn aggregator provision` wrote for this device"
    if not key.is_file():
        raise EdgelearnError(f"--device-key {key}: {'not a file' if key.exists() else 'no such file'}", fix=fix)
    try:
        if key.stat().st_size > 4096:  # a key file is one short line (a WAV, say, is not read whole)
            raise EdgelearnError(f"{key}: not a device key (larger than 4096 bytes)")
        load_hmac_key(key)
    except (EdgelearnError, OSError) as e:
        why = getattr(e, "problem", None) or e.strerror or str(e)
        why = why if why.startswith(str(key)) else f"{key}: {why}"
        raise EdgelearnError(f"--device-key {why}", fix=fix) from None


class Federation:
    """Mixin: needs ``state_dir``, ``cfg``, ``trusted_keys``, ``sysfs_root``, ``status``, ``device``,
    ``fl``, ``_fl_thread``, ``_fl_results``, ``_next_checkin``, ``clock``, ``labelled_clips``,
    ``_write_status`` from ``Agent`` and ``_store_keys``, ``_drop_rejected``, ``_switch_version``
    from ``Versions``."""

    def _poll_federation(self, now: float) -> None:
        if not self.cfg.aggregator:
            return
        while True:
            try:
                kind, res = self._fl_results.get_nowait()
            except queue.Empty:
                break
            self._after_round(kind, res)
        busy = self._fl_thread is not None and self._fl_thread.is_alive()
        if busy or now < self._next_checkin:
            return
        self._next_checkin = now + self.cfg.checkin_every_s
        self._fl_thread = threading.Thread(target=self._round, name="edgelearn-fl", daemon=True)
        self._fl_thread.start()

    def _fl_client(self):
        if self.fl is None:
            from edge.fl import FLClient
            from edge.keys import load_hmac_key

            server = self.cfg.aggregator
            hold = os.environ.get(HOLD_ENV)
            if hold:
                from edge.fl.transport import HttpTransport

                server = _HeldTransport(HttpTransport(server), hold)
            self.fl = FLClient(server, self.cfg.device_id, load_hmac_key(self.cfg.device_key),
                               self.state_dir / FL_DIR, trusted_keys=self._store_keys(),
                               data=self._fl_examples)
        return self.fl

    def _fl_examples(self):
        """The device's own examples for a federated round (``edge.fl.local.local_examples``, what
        the fleet simulator's devices train on too): embeddings of its labelled clips (each command
        clip ``FL_AUGMENT`` times), of the confident detections ``Device.detect`` kept in the tail
        replay buffer, and of the embedding replay buffer."""
        from edge.fl.local import local_examples

        return local_examples(self.device, self.labelled_clips(), augment=FL_AUGMENT)

    def _checkin_status(self) -> dict:
        from edge.scheduler import read_sysfs

        r, _ = read_sysfs(self.sysfs_root, time.time())
        st = {"network": self.cfg.network}
        if r.battery_pct is not None:
            st["battery"] = r.battery_pct / 100.0
        elif r.has_battery is False:
            st["battery"] = 1.0
        if r.charging is not None or r.on_mains is not None:
            st["charging"] = bool(r.charging or r.on_mains)
        if r.temp_c is not None:
            st["temperature"] = float(r.temp_c)
        return st

    def _round(self) -> None:
        """One check-in (background thread): train and upload when selected; posts what happened,
        with the version the store holds now (a round that fails after its install still posts it)."""
        c = None
        try:
            c = self._fl_client()
            before = c.bytes_up
            c.skip_versions = set(self.status["rejected"])  # a rolled-back version is not pulled again
            ans = c.run_once(self._checkin_status())
            self._fl_results.put(("ok", {"answer": ans, "bytes": c.bytes_up - before,
                                         "version": c.current_version()}))
        except Exception as e:  # noqa: BLE001 - a failed round never ends the agent; the next check-in retries
            if isinstance(e, EdgelearnError):
                why = str(e)
            elif isinstance(e, OSError):
                why = f"aggregator unreachable ({e.__class__.__name__}: {e})"
            else:
                why = f"the round failed ({e.__class__.__name__}: {e})"
            try:
                version = None if c is None else c.current_version()
            except EdgelearnError:
                version = None
            self._fl_results.put(("error", {"error": why, "version": version, "auth": refused_credentials(e)}))

    def _after_round(self, kind: str, res: dict) -> None:
        """What a round did, counted and written at once (a check cut short keeps it); then the
        version it installed is checked."""
        now = time.time()
        if kind == "error":
            self.status["last_checkin"] = {"time": now, "error": res["error"]}
            if res.get("auth"):  # its own warning, and not "retrying every N s": it backs off
                self._credentials_refused(res["error"], now)
                self._checkin_failing = True
            # (an unreachable aggregator says nothing about the key: only a check-in that works ends a backoff)
            if not getattr(self, "_checkin_failing", False):  # once, until a check-in works again
                self._checkin_failing = True
                print(json.dumps({"warning": f"check-in with {self.cfg.aggregator} failed ({res['error']}); "
                                             f"retrying every {self.cfg.checkin_every_s:g} s"}),
                      file=sys.stderr, flush=True)
        else:
            self._checkin_failing = False
            self._auth_refusals, self.status["federation"] = 0, None  # accepted: the backoff is over
            ans = res["answer"]
            action = ans.get("action")
            self.status["last_checkin"] = {"time": now, "action": action, "round_id": ans.get("round_id"),
                                           "version": res["version"]}
            rid, last = ans.get("round_id"), self.status["last_round"]
            if action in ("uploaded", "secure"):
                self.status["rounds_joined"] += 1
                self.status["bytes_uploaded"] += int(res["bytes"])
                if isinstance(rid, int):
                    self.status["last_round"] = max(rid, last or 0)
            elif action == "wait" and isinstance(ans.get("contributed"), int) and last is not None \
                    and ans["contributed"] > last:
                # the aggregator has this round's update, but a kill -9 came before it was counted here
                self.status["rounds_joined"] += 1
                self.status["last_round"] = ans["contributed"]
        self._write_status()  # the round is on record before a version check that may be cut short
        # whatever the round's outcome, what it installed is checked (or dropped) now: the store keeps
        # only its current and previous versions, so the running one must stay one of them
        installed = res.get("version")
        running = self.device.bundle.version
        if installed is not None and installed != running:
            if installed in self.status["rejected"]:  # re-installed to train a round on it: not used again
                self._drop_rejected(installed)
                self._write_status()
            else:
                self._switch_version(installed)
                self._write_status()

    def _credentials_refused(self, why: str, now: float) -> None:
        """The aggregator refused this device's key or id: on record in agent.json (``federation``:
        the refusal, since when, how many, the wait before the next try) and the next check-in
        backs off exponentially, capped at ``AUTH_BACKOFF_CAP`` check-in intervals. Detection,
        adaptation and the status writes go on; only the check-ins wait."""
        n = getattr(self, "_auth_refusals", 0) + 1
        self._auth_refusals = n
        wait = self.cfg.checkin_every_s * min(2 ** n, AUTH_BACKOFF_CAP)
        self._next_checkin = self.clock() + wait
        since = (self.status.get("federation") or {}).get("since", now)
        self.status["federation"] = {
            "error": why, "since": since, "refusals": n, "retry_in_s": round(wait, 3),
            "fix": "check --device-id and --device-key: the key must be the one `edgelearn aggregator "
                   "provision` wrote for this device id on this aggregator"}
        if n == 1:  # said once (the generic warning says once that check-ins fail)
            print(json.dumps({"warning": f"{self.cfg.aggregator} refused this device's key ({why}); "
                                         f"check-ins back off up to every "
                                         f"{self.cfg.checkin_every_s * AUTH_BACKOFF_CAP:g} s",
                              "fix": self.status["federation"]["fix"]}), file=sys.stderr, flush=True)


class _HeldTransport:
    """Test-only, and off unless ``EDGELEARN_AGENT_HOLD`` is set (tests/test_agent_fleet.py): with
    ``before|after,PATH,N,MARKER`` the federated thread stops at its N-th request to PATH (before the
    request is sent, or after its answer arrived), writes MARKER and waits until the process is
    killed. How a test kills -9 an agent at a named point of a round; detection runs on meanwhile."""

    def __init__(self, inner, spec: str):
        try:
            when, self.path, n, self.marker = spec.split(",", 3)
            self.n = int(n)
        except ValueError:
            raise EdgelearnError(f"{HOLD_ENV}={spec!r} is not before|after,PATH,N,MARKER",
                                 fix=f"unset {HOLD_ENV} (it is for tests)") from None
        if when not in ("before", "after"):
            raise EdgelearnError(f"{HOLD_ENV}={spec!r}: {when!r} is not before or after", fix=f"unset {HOLD_ENV}")
        self.inner, self.when, self.seen = inner, when, 0

    def _hold(self, method, path):
        atomic_write(Path(self.marker), json.dumps({"pid": os.getpid(), "at": f"{self.when} {method} {path}"}).encode())
        threading.Event().wait()

    def request(self, method, path, body=b"", headers=None):
        hit = False
        if path == self.path:
            self.seen += 1
            hit = self.seen == self.n
        if hit and self.when == "before":
            self._hold(method, path)
        res = self.inner.request(method, path, body, headers)
        if hit:
            self._hold(method, path)
        return res

    def close(self):
        self.inner.close()
