"""Small, pure policy objects for the serving shim: quotas, breakers, routing, canaries.

None of these touch the network, processes or the wall clock: each takes a
``clock`` callable (seconds, monotonic) so tests drive them with a fake clock
and the server passes ``time.monotonic``.

    >>> bucket = TokenBucket(rate=10.0, burst=20, clock=time.monotonic)
    >>> ok, retry_after = bucket.take()
    >>> breaker = CircuitBreaker(clock=time.monotonic)
    >>> if breaker.allow(): ...; breaker.record(ok=True, latency=0.004)

Why not a library: ``aiolimiter`` makes callers wait instead of rejecting, and
``limits`` counts fixed/moving windows, not a token bucket with a burst, and
reads the wall clock itself; ``pybreaker``/``circuitbreaker``/``aiobreaker``
wrap a call and count consecutive exceptions, with no slow-call accounting, no
bound on half-open probes and no way to ask "may I route here?" separately
from making the call, which is what a router needs. Each class here is a few
dozen lines and fully tested with a fake clock.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable, Sequence

Clock = Callable[[], float]


class TokenBucket:
    """``rate`` tokens per second refill a bucket of ``burst``; a request takes one."""

    def __init__(self, rate: float, burst: float, clock: Clock):
        if rate <= 0 or burst < 1:
            raise ValueError(f"token bucket needs rate > 0 and burst >= 1, got rate={rate}, burst={burst}")
        self.rate, self.burst, self._clock = float(rate), float(burst), clock
        self._tokens = float(burst)
        self._last = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now

    def take(self, n: float = 1.0) -> tuple[bool, float]:
        """Take ``n`` tokens: ``(True, 0)`` or ``(False, seconds until n tokens exist)``."""
        self._refill()
        if self._tokens >= n - 1e-9:  # float refill must not deny a token that is due
            self._tokens = max(0.0, self._tokens - n)
            return True, 0.0
        return False, (n - self._tokens) / self.rate

    @property
    def tokens(self) -> float:
        self._refill()
        return self._tokens


class TenantQuotas:
    """One token bucket per tenant, created on first sight.

    The table is bounded (least recently seen tenants are forgotten) so a
    client inventing tenant names cannot grow server memory; a forgotten
    tenant comes back with a full bucket, which is the generous failure mode.
    """

    def __init__(self, rate: float, burst: float, clock: Clock, max_tenants: int = 10000,
                 overrides: dict[str, tuple[float, float]] | None = None):
        TokenBucket(rate, burst, clock)  # validate once, up front
        self.rate, self.burst, self._clock = rate, burst, clock
        self.max_tenants = max_tenants
        self.overrides = dict(overrides or {})
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def take(self, tenant: str, n: float = 1.0) -> tuple[bool, float]:
        bucket = self._buckets.get(tenant)
        if bucket is None:
            rate, burst = self.overrides.get(tenant, (self.rate, self.burst))
            bucket = self._buckets[tenant] = TokenBucket(rate, burst, self._clock)
            if len(self._buckets) > self.max_tenants:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(tenant)
        return bucket.take(n)

    def __len__(self) -> int:
        return len(self._buckets)


CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
BREAKER_STATES = (CLOSED, OPEN, HALF_OPEN)


class CircuitBreaker:
    """Closed -> open on a high failure rate over the last ``window`` calls; open ->
    half-open after ``open_seconds``; half-open lets ``probes`` calls through and
    closes if they all succeed, reopens on the first failure.

    A call slower than ``slow_call_seconds`` counts as a failure, so a replica
    that answers correctly but late is taken out like one that errors.
    """

    def __init__(self, clock: Clock, window: int = 20, min_calls: int = 5,
                 failure_rate: float = 0.5, slow_call_seconds: float = 0.25,
                 open_seconds: float = 2.0, probes: int = 2):
        if not (0 < failure_rate <= 1) or window < 1 or not (1 <= min_calls <= window) or probes < 1:
            raise ValueError("breaker needs 0 < failure_rate <= 1, 1 <= min_calls <= window, probes >= 1")
        self._clock = clock
        self.window, self.min_calls, self.failure_rate = window, min_calls, failure_rate
        self.slow_call_seconds, self.open_seconds, self.probes = slow_call_seconds, open_seconds, probes
        self._outcomes: deque[bool] = deque(maxlen=window)  # True = failure
        self._state = CLOSED
        self._opened_at = 0.0
        self._probes_sent = 0
        self._probes_ok = 0
        self.transitions: list[tuple[float, str]] = []

    @property
    def state(self) -> str:
        if self._state == OPEN and self._clock() - self._opened_at >= self.open_seconds:
            self._to(HALF_OPEN)
        return self._state

    def _to(self, state: str) -> None:
        self._state = state
        self.transitions.append((self._clock(), state))
        if state == OPEN:
            self._opened_at = self._clock()
        if state in (HALF_OPEN, CLOSED):
            self._probes_sent = self._probes_ok = 0
        if state == CLOSED:
            self._outcomes.clear()

    def allow(self) -> bool:
        """May a call be routed here now? In half-open this reserves a probe slot."""
        state = self.state
        if state == CLOSED:
            return True
        if state == HALF_OPEN and self._probes_sent < self.probes:
            self._probes_sent += 1
            return True
        return False

    def would_allow(self) -> bool:
        """Like ``allow`` but reserves nothing (for choosing among candidates)."""
        state = self.state
        return state == CLOSED or (state == HALF_OPEN and self._probes_sent < self.probes)

    def record(self, ok: bool, latency: float = 0.0) -> None:
        failed = (not ok) or latency > self.slow_call_seconds
        state = self.state
        if state == HALF_OPEN:
            if failed:
                self._to(OPEN)
            else:
                self._probes_ok += 1
                if self._probes_ok >= self.probes:
                    self._to(CLOSED)
            return
        if state == OPEN:
            return  # a late answer from before the breaker opened changes nothing
        self._outcomes.append(failed)
        n = len(self._outcomes)
        if n >= self.min_calls and sum(self._outcomes) / n >= self.failure_rate:
            self._to(OPEN)


def power_of_two(candidates: Sequence[int], load: Callable[[int], float],
                 rng: random.Random) -> int:
    """Pick two distinct candidates at random and return the less loaded one.

    Mitzenmacher's power of two choices: nearly the balance of "least loaded"
    without every router herding onto the same momentarily idle replica.
    """
    if not candidates:
        raise ValueError("no candidates to choose from")
    if len(candidates) == 1:
        return candidates[0]
    a, b = rng.sample(list(candidates), 2)
    return a if load(a) <= load(b) else b


def predicted_wait(busy: Sequence[float], batch_seconds: float, batches_ahead: int) -> float:
    """Seconds until a new request starts computing, for admission by predicted wait.

    ``busy``: for each replica that may take work, how long it stays busy with
    what it already has (rest of its running batch plus one batch time per batch
    waiting in its pipe); ``inf`` when there is none. The ``batches_ahead`` queued
    batches go, one batch time each, to whichever replica frees first (what
    power-of-two-choices approximates); the request starts when the next frees.
    """
    if not busy:
        return float("inf")
    free = sorted(busy)
    for _ in range(batches_ahead):
        free[0] += batch_seconds
        free.sort()
    return free[0]


class Outcomes:
    """Outcomes of requests over the last ``horizon`` seconds: count, error rate, p99."""

    def __init__(self, clock: Clock, horizon: float = 30.0, max_items: int = 20000):
        self._clock, self.horizon = clock, horizon
        self._items: deque[tuple[float, bool, float]] = deque(maxlen=max_items)

    def add(self, ok: bool, latency: float) -> None:
        self._items.append((self._clock(), ok, latency))

    def _recent(self, since: float | None = None) -> list[tuple[float, bool, float]]:
        cut = self._clock() - self.horizon
        if since is not None:
            cut = max(cut, since)
        while self._items and self._items[0][0] < self._clock() - self.horizon:
            self._items.popleft()
        return [it for it in self._items if it[0] >= cut]

    def summary(self, since: float | None = None) -> "OutcomeSummary":
        items = self._recent(since)
        n = len(items)
        errors = sum(1 for _, ok, _ in items if not ok)
        lat = sorted(l for _, ok, l in items if ok)
        p99 = lat[min(len(lat) - 1, math.ceil(0.99 * len(lat)) - 1)] if lat else float("nan")
        return OutcomeSummary(n, errors / n if n else 0.0, p99)


@dataclass(frozen=True)
class OutcomeSummary:
    count: int
    error_rate: float
    p99: float


HOLD, ADVANCE, PROMOTE, ROLLBACK = "hold", "advance", "promote", "rollback"


class CanaryPolicy:
    """Decides a canary's next move from the stable and canary outcomes.

    Each step (1 -> 10 -> 50 -> 100 % of traffic) lasts at least
    ``min_step_seconds`` and ``min_requests`` canary requests; it rolls back as
    soon as the canary's error rate exceeds the stable one by
    ``max_error_rate_increase`` or its p99 exceeds ``p99_factor`` x stable p99
    (plus ``p99_slack`` seconds, so sub-millisecond noise is not a regression).
    """

    def __init__(self, clock: Clock, steps: Sequence[float] = (0.01, 0.10, 0.50, 1.0),
                 min_requests: int = 50, min_step_seconds: float = 5.0,
                 max_error_rate_increase: float = 0.02, p99_factor: float = 1.5,
                 p99_slack: float = 0.005, rollback_min_requests: int = 5, p99_min_requests: int = 100):
        if not steps or any(not (0 < s <= 1) for s in steps) or list(steps) != sorted(steps) or steps[-1] != 1.0:
            raise ValueError("canary steps must increase within (0, 1] and end at 1.0")
        self._clock = clock
        self.steps = tuple(steps)
        self.min_requests, self.min_step_seconds = min_requests, min_step_seconds
        self.max_error_rate_increase, self.p99_factor, self.p99_slack = (
            max_error_rate_increase, p99_factor, p99_slack)
        self.rollback_min_requests = rollback_min_requests
        # A p99 from fewer samples is just the maximum: one scheduling hiccup would
        # roll a good version back. Until then only the error rate can.
        self.p99_min_requests = p99_min_requests
        self.step = 0
        self.step_started = clock()
        self.reason = ""

    @property
    def weight(self) -> float:
        return self.steps[self.step]

    def decide(self, stable: OutcomeSummary, canary: OutcomeSummary) -> str:
        """``canary`` counts only this step's requests; ``stable`` a recent window."""
        if canary.count >= self.rollback_min_requests:
            if canary.error_rate > stable.error_rate + self.max_error_rate_increase:
                self.reason = (f"error rate {canary.error_rate:.1%} vs stable {stable.error_rate:.1%} "
                               f"at {self.weight:.0%} traffic")
                return ROLLBACK
            if (not math.isnan(stable.p99) and not math.isnan(canary.p99)
                    and canary.count >= self.p99_min_requests
                    and canary.p99 > stable.p99 * self.p99_factor + self.p99_slack):
                self.reason = (f"p99 {canary.p99 * 1e3:.1f} ms vs stable {stable.p99 * 1e3:.1f} ms "
                               f"at {self.weight:.0%} traffic")
                return ROLLBACK
        if self._clock() - self.step_started < self.min_step_seconds:
            return HOLD
        # A model nobody calls (e.g. a split model's cloud half before devices use
        # it) would otherwise hold its canary forever and block the next rollout;
        # with no traffic on either version there is nothing to compare or risk.
        idle = canary.count == 0 and stable.count == 0
        if canary.count < self.min_requests and not idle:
            return HOLD
        if canary.count and canary.error_rate > stable.error_rate + self.max_error_rate_increase:
            # too few requests to roll back on (min_requests < rollback_min_requests), too many
            # errors to go on: a broken canary must never advance, however little traffic it saw
            return HOLD
        if self.step == len(self.steps) - 1:
            return PROMOTE
        return ADVANCE

    def advance(self) -> None:
        self.step = min(self.step + 1, len(self.steps) - 1)
        self.step_started = self._clock()
