"""Battery- and temperature-aware training scheduler for Linux boards (sysfs readings).

Readings come from an injectable sysfs root (``/`` on a device, a fake tree or
a recorded trace in tests): ``sys/class/power_supply/*/{type,capacity,status,online}``
and ``sys/class/thermal/thermal_zone*/temp`` (millidegrees; the hottest zone
counts). A missing or unreadable file is *unknown*, recorded with its path in every
decision and warned about once per ``Scheduler`` (a training run asks before every step), and
the policy (``edge.portable.schedule``, shared with the ESP32) treats unknowns conservatively. Every decision is logged with its reason to
``<state>/scheduler.log`` (one JSON line each; 0600, fdatasync'd, rotated to
``scheduler.log.1`` at ``LOG_MAX_BYTES`` so it never grows past two files; a line torn by a
crash is skipped by ``last_record``) and the policy's budget and hysteresis are persisted
atomically in ``scheduler.state``, so a reboot cannot reset them.

Charges are idempotent: ``charge(seq, steps)`` spends only if ``seq`` is above the last
charge applied (kept in ``scheduler.state`` after the portable policy's bytes), so a run
that recorded its charge beside its result (``edge.adapt.store``) is charged exactly once
however often a crash makes the charge be replayed.

The energy per training step is estimated from the target profile's energy per
MAC (``[compute.cpu] energy_pj_per_mac`` in a profile TOML) times the MACs of
one step of the tail (forward + backward ~ 3x forward, per example).

    >>> sch = Scheduler(state_dir, sysfs_root="/", idle_s=lambda: 600)
    >>> d = sch.decide()                 # logged
    >>> train(..., should_continue=sch.should_continue)
"""

from __future__ import annotations

import json
import logging
import struct
import time
from pathlib import Path

from edge.atomic import append_line, atomic_write
from edge.errors import EdgelearnError
from edge.portable.schedule import PAUSE, TRAIN, Readings, SchedulePolicy

log = logging.getLogger("edgelearn.scheduler")
DEFAULT_PJ_PER_MAC = 800.0  # rpi4 profile: ~4 W under load / 5 GMAC/s
LOG_MAX_BYTES = 64 * 1024
LOG_NAME, STATE_NAME = "scheduler.log", "scheduler.state"
_CHARGED = struct.Struct("<4sQ")  # after the portable state: b"CHG1", the last charge sequence applied


def last_record(state_dir) -> dict | None:
    """The newest whole decision in ``scheduler.log`` (or its rotated ``.1``); torn or foreign lines
    are skipped. None when there is none; one EdgelearnError if the log cannot be read at all."""
    for path in (Path(state_dir) / LOG_NAME, Path(state_dir) / (LOG_NAME + ".1")):
        try:
            if not path.exists():
                continue
            with open(path, "rb") as f:
                f.seek(max(0, path.stat().st_size - 2 * LOG_MAX_BYTES))
                lines = f.read().splitlines()
        except OSError as e:
            raise EdgelearnError(f"scheduler log {path} is unreadable ({e.strerror or e})",
                                 fix="fix its permissions, or delete it (it is only a log)") from None
        for line in reversed(lines):
            try:
                rec = json.loads(line)
            except (ValueError, UnicodeDecodeError):
                continue
            if isinstance(rec, dict) and isinstance(rec.get("action"), str):
                return rec
    return None


def read_sysfs(root, now_s: float, idle_s=None) -> tuple[Readings, list[str]]:
    """Readings from a sysfs tree, plus the problems found (each one made a value unknown)."""
    root = Path(root)
    problems: list[str] = []

    def read(path: Path):
        try:
            return path.read_text().strip()
        except (OSError, UnicodeDecodeError) as e:
            problems.append(f"{path}: unreadable ({e.__class__.__name__})")
            return None

    r = Readings(now_s=now_s, idle_s=idle_s)
    ps = root / "sys/class/power_supply"
    if ps.is_dir():
        supplies = sorted(p for p in ps.iterdir() if p.is_dir() or p.is_symlink())
        batteries = [p for p in supplies if (read(p / "type") if (p / "type").exists() else "") == "Battery"]
        mains = [p for p in supplies if p not in batteries]
        r.has_battery = bool(batteries)
        online = []
        for p in mains:
            if (p / "online").exists():
                v = read(p / "online")
                if v is not None:
                    online.append(v == "1")
            else:
                problems.append(f"{p / 'online'}: missing")
        r.on_mains = any(online) if online else None
        if batteries:
            b = batteries[0]
            cap = read(b / "capacity") if (b / "capacity").exists() else problems.append(
                f"{b / 'capacity'}: missing")
            try:
                r.battery_pct = None if cap is None else max(0, min(100, int(cap)))
            except ValueError:
                problems.append(f"{b / 'capacity'}: not a number ({cap!r})")
            st = read(b / "status") if (b / "status").exists() else problems.append(f"{b / 'status'}: missing")
            if st is not None:
                r.charging = st in ("Charging", "Full") if st != "Unknown" else None
    else:
        problems.append(f"{ps}: missing (power state unknown)")
    temps = []
    th = root / "sys/class/thermal"
    zones = sorted(th.glob("thermal_zone*")) if th.is_dir() else []
    for z in zones:
        v = read(z / "temp") if (z / "temp").exists() else problems.append(f"{z / 'temp'}: missing")
        try:
            if v is not None:
                temps.append(int(v) / 1000.0)
        except ValueError:
            problems.append(f"{z / 'temp'}: not a number ({v!r})")
    if not zones:
        problems.append(f"{th}: no thermal zones (temperature unknown)")
    r.temp_c = max(temps) if temps else None
    return r, problems


# MACs of one example through the conv tail the device trains (dw4 3x3 + pw4 1x1 on 25x5x64,
# then the 64->37 classifier); the backbone's output is cached, so it is not rerun.
TAIL_MACS = 125 * 64 * 9 + 125 * 64 * 64 + 64 * 37


def joules_per_step(pj_per_mac: float, macs_per_example: int = TAIL_MACS, batch: int = 32) -> float:
    macs = 3 * batch * macs_per_example  # forward + about two forward-sized backward passes
    return macs * pj_per_mac * 1e-12


def profile_pj_per_mac(path) -> float:
    import tomllib

    with open(path, "rb") as f:
        prof = tomllib.load(f)
    return float(prof.get("compute", {}).get("cpu", {}).get("energy_pj_per_mac", DEFAULT_PJ_PER_MAC))


class Scheduler:
    def __init__(self, state_dir, sysfs_root="/", idle_s=lambda: None, clock=time.time,
                 policy: SchedulePolicy | None = None):
        self.state = Path(state_dir)
        self.root = Path(sysfs_root)
        self.idle_s, self.clock = idle_s, clock
        self.policy = policy or SchedulePolicy(joules_per_step=joules_per_step(DEFAULT_PJ_PER_MAC))
        self.log_path = self.state / LOG_NAME
        self.state_path = self.state / STATE_NAME
        self.charged = 0  # the last charge sequence applied
        sp = self.state_path
        if sp.exists():
            try:
                data = sp.read_bytes()
                n = len(self.policy.state_bytes())
                if len(data) == n + _CHARGED.size:
                    magic, self.charged = _CHARGED.unpack_from(data, n)
                    if magic != b"CHG1":
                        raise ValueError(f"not a charge record (magic {magic!r})")
                    data = data[:n]
                self.policy.load_state(data)
            except (ValueError, OSError, struct.error) as e:
                self.charged = 0
                log.warning("scheduler state %s unreadable (%s); starting a fresh day budget", sp, e)
        self.last = None
        self._warned: set[str] = set()  # sysfs problems already warned about (once per scheduler)

    def decide(self):
        r, problems = read_sysfs(self.root, self.clock(), self.idle_s())
        d = self.policy.decide(r)
        rec = {"t": round(r.now_s, 3), "action": d.action, "steps": d.steps, "reason": d.reason,
               "battery_pct": r.battery_pct, "charging": r.charging, "on_mains": r.on_mains,
               "temp_c": r.temp_c, "idle_s": r.idle_s, "unknown": problems}
        for p in problems:  # every decision's record lists them; the warning is said once per run
            if p not in self._warned:
                self._warned.add(p)
                log.warning("sysfs: %s", p)
        log.info("schedule: %s %d steps (%s)", d.action, d.steps, d.reason)
        self.state.mkdir(parents=True, exist_ok=True)
        append_line(self.log_path, json.dumps(rec), LOG_MAX_BYTES)
        self.last = d
        return d

    def should_continue(self) -> bool:
        """The mid-update check: false as soon as a condition breaks (pause or wait)."""
        return self.decide().action == TRAIN

    def spend(self, steps: int) -> None:
        self.policy.spend(steps, self.clock())
        self._save()

    def charge(self, seq: int, steps: int) -> bool:
        """Spend ``steps`` unless charge ``seq`` (or a later one) was already applied; True if spent."""
        if seq <= self.charged:
            return False
        self.policy.spend(steps, self.clock())
        self.charged = seq
        self._save()
        return True

    def _save(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        atomic_write(self.state_path, self.policy.state_bytes() + _CHARGED.pack(b"CHG1", self.charged))


__all__ = ["Scheduler", "read_sysfs", "last_record", "joules_per_step", "profile_pj_per_mac", "PAUSE", "TRAIN",
           "LOG_MAX_BYTES"]
