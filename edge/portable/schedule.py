"""When may the device train, and how much: a pure policy fed by readings.

The policy never reads a file or a pin: the Linux runtime (``edge.scheduler``,
sysfs) and the ESP32 firmware (ADC, internal sensor) gather a ``Readings`` and
ask ``SchedulePolicy.decide``. A reading of ``None`` means *unknown* (missing
or unreadable) and is treated conservatively; the reason string says so.

Rules, in order (first that applies wins):

1. temperature: above ``temp_pause_c`` -> pause; once paused, stay paused until
   it falls below ``temp_resume_c`` (hysteresis, so a board at the limit does
   not toggle every reading). Unknown temperature -> train throttled to
   ``unknown_temp_share`` of the steps.
2. power: on battery (not charging, not on mains) below ``min_battery_pct`` ->
   wait; charging or on mains needs only ``min_battery_charging_pct``. A device
   that has a battery whose level or status is unknown -> wait. A device with
   no battery (``has_battery=False``, mains only) passes.
3. idleness: the user used the device less than ``min_idle_s`` ago -> wait;
   unknown idleness -> wait.
4. daily energy budget: ``joules_per_step`` each step; the budget resets at
   each day boundary of ``now_s`` (``day_s`` seconds). Nothing left -> wait.
   Warm (above ``temp_throttle_c``) -> half the steps.

``decide`` returns a ``Decision(action, steps, reason)`` with action one of
``"train"``, ``"wait"``, ``"pause"`` (``pause`` = stop an update in progress
now; ``wait`` = do not start). ``spend(steps, now_s)`` books energy actually
used. ``state_bytes()`` / ``load_state()`` persist the hysteresis flag and the
day's spend (struct, 13 bytes) so a reboot cannot reset the budget.

API (stable; the ESP32 firmware uses it):

    Readings(battery_pct=None, charging=None, on_mains=None, has_battery=None,
             temp_c=None, idle_s=None, now_s=0)
    SchedulePolicy(min_battery_pct=50, min_battery_charging_pct=20, temp_pause_c=70,
                   temp_resume_c=60, temp_throttle_c=55, min_idle_s=30, daily_budget_j=50.0,
                   joules_per_step=0.01, max_steps=200, unknown_temp_share=0.25, day_s=86400)
    .decide(readings) -> Decision        .spend(steps, now_s)     .remaining_j(now_s)
    .state_bytes() -> bytes              .load_state(data)

    >>> pol = SchedulePolicy(daily_budget_j=20.0, joules_per_step=0.05)
    >>> d = pol.decide(Readings(battery_pct=80, charging=True, has_battery=True, temp_c=41.0, idle_s=600, now_s=t))
    >>> d.action, d.steps, d.reason
    ('train', 200, 'ok: battery 80% charging, 41.0 C, idle 600 s, budget 20.00 J left; 200 steps (at most 200 a run)')
"""

import struct

TRAIN = "train"
WAIT = "wait"
PAUSE = "pause"
_STATE_FMT = "<4sBii"


class Readings:
    def __init__(self, battery_pct=None, charging=None, on_mains=None, has_battery=None,
                 temp_c=None, idle_s=None, now_s=0):
        self.battery_pct = battery_pct
        self.charging = charging
        self.on_mains = on_mains
        self.has_battery = has_battery
        self.temp_c = temp_c
        self.idle_s = idle_s
        self.now_s = now_s


class Decision:
    def __init__(self, action, steps, reason):
        self.action = action
        self.steps = steps
        self.reason = reason

    def __repr__(self):
        return "Decision(%r, %d, %r)" % (self.action, self.steps, self.reason)


class SchedulePolicy:
    def __init__(self, min_battery_pct=50, min_battery_charging_pct=20, temp_pause_c=70.0,
                 temp_resume_c=60.0, temp_throttle_c=55.0, min_idle_s=30, daily_budget_j=50.0,
                 joules_per_step=0.01, max_steps=200, unknown_temp_share=0.25, day_s=86400):
        if temp_resume_c >= temp_pause_c:
            raise ValueError("temp_resume_c (%s) must be below temp_pause_c (%s) for hysteresis"
                             % (temp_resume_c, temp_pause_c))
        if joules_per_step <= 0 or daily_budget_j < 0 or max_steps < 1:
            raise ValueError("joules_per_step must be > 0, daily_budget_j >= 0, max_steps >= 1")
        self.min_battery_pct = min_battery_pct
        self.min_battery_charging_pct = min_battery_charging_pct
        self.temp_pause_c = temp_pause_c
        self.temp_resume_c = temp_resume_c
        self.temp_throttle_c = temp_throttle_c
        self.min_idle_s = min_idle_s
        self.daily_budget_j = daily_budget_j
        self.joules_per_step = joules_per_step
        self.max_steps = max_steps
        self.unknown_temp_share = unknown_temp_share
        self.day_s = day_s
        self.hot = False
        self.day = -1
        self.spent_mj = 0  # millijoules, an int so the state packs exactly

    def _roll(self, now_s):
        day = int(now_s // self.day_s)
        if day != self.day:
            self.day = day
            self.spent_mj = 0

    def remaining_j(self, now_s):
        self._roll(now_s)
        left = self.daily_budget_j - self.spent_mj / 1000.0
        return left if left > 0 else 0.0

    def spend(self, steps, now_s):
        self._roll(now_s)
        self.spent_mj += int(steps * self.joules_per_step * 1000.0 + 0.5)

    def _thermal(self, t):
        """(blocked reason or None, share of steps, description)."""
        if t is None:
            return None, self.unknown_temp_share, ("temperature unknown (throttled to %d%% of the steps)"
                                                   % int(self.unknown_temp_share * 100 + 0.5))
        if self.hot and t < self.temp_resume_c:
            self.hot = False
        elif not self.hot and t >= self.temp_pause_c:
            self.hot = True
        if self.hot:
            return ("too hot: %.1f C (pause at %.1f C, resume below %.1f C)"
                    % (t, self.temp_pause_c, self.temp_resume_c)), 0.0, ""
        if t >= self.temp_throttle_c:
            return None, 0.5, "%.1f C (warm, throttled to 50%% of the steps)" % t
        return None, 1.0, "%.1f C" % t

    def _power(self, r):
        if r.has_battery is False:
            return None, "mains (no battery)"
        if r.has_battery is None and r.on_mains:
            return None, "mains, battery unknown"
        if r.battery_pct is None:
            return "battery level unknown (conservative)", ""
        if r.charging is None and r.on_mains is None:
            return "battery %d%% but charging state unknown (conservative)" % r.battery_pct, ""
        powered = bool(r.charging) or bool(r.on_mains)
        need = self.min_battery_charging_pct if powered else self.min_battery_pct
        desc = "battery %d%% %s" % (r.battery_pct, "charging" if powered else "discharging")
        if r.battery_pct < need:
            return "%s, below %d%%" % (desc, need), ""
        return None, desc

    def decide(self, r):
        self._roll(r.now_s)
        hot, share, tdesc = self._thermal(r.temp_c)
        if hot:
            return Decision(PAUSE, 0, hot)
        blocked, pdesc = self._power(r)
        if blocked:
            return Decision(PAUSE, 0, blocked)
        if r.idle_s is None:
            return Decision(WAIT, 0, "idleness unknown (conservative)")
        if r.idle_s < self.min_idle_s:
            return Decision(WAIT, 0, "device in use: idle %d s < %d s" % (r.idle_s, self.min_idle_s))
        left = self.remaining_j(r.now_s)
        affordable = int(left / self.joules_per_step)
        if affordable < 1:
            return Decision(WAIT, 0, "daily energy budget spent (%.2f J)" % self.daily_budget_j)
        steps = min(self.max_steps, affordable)
        # what bounds the steps, so a run cut short can say why (``Device.adapt`` reports it)
        bound = ("at most %d a run" % self.max_steps if steps == self.max_steps
                 else "%d affordable" % affordable)
        steps = int(steps * share)
        if steps < 1:
            return Decision(WAIT, 0, "throttled to 0 steps: %s, budget %.2f J left" % (tdesc, left))
        return Decision(TRAIN, steps, "ok: %s, %s, idle %d s, budget %.2f J left; %d steps (%s)"
                        % (pdesc, tdesc, r.idle_s, left, steps, bound))

    def state_bytes(self):
        return struct.pack(_STATE_FMT, b"ESP1", 1 if self.hot else 0, self.day, self.spent_mj)

    def load_state(self, data):
        if len(data) != struct.calcsize(_STATE_FMT):
            raise ValueError("scheduler state is %d bytes, expected %d"
                             % (len(data), struct.calcsize(_STATE_FMT)))
        magic, hot, day, spent = struct.unpack(_STATE_FMT, data)
        if magic != b"ESP1":
            raise ValueError("not a scheduler state (magic %r)" % (magic,))
        self.hot, self.day, self.spent_mj = bool(hot), day, spent
