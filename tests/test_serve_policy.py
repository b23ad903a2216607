"""Serving policies driven by a fake clock: token buckets, breakers, routing, canaries."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from host.serve.policy import (ADVANCE, CLOSED, HALF_OPEN, HOLD, OPEN, PROMOTE, ROLLBACK, CanaryPolicy,
                               CircuitBreaker, OutcomeSummary, Outcomes, TenantQuotas, TokenBucket,
                               power_of_two)


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def advance(self, s):
        self.t += s


@pytest.fixture()
def clock():
    return FakeClock()


def test_token_bucket_burst_then_rate(clock):
    b = TokenBucket(rate=10, burst=3, clock=clock)
    assert [b.take()[0] for _ in range(3)] == [True, True, True]
    ok, wait = b.take()
    assert not ok and wait == pytest.approx(0.1)
    clock.advance(0.05)
    ok, wait = b.take()
    assert not ok and wait == pytest.approx(0.05)
    clock.advance(0.05)
    assert b.take() == (True, 0.0)
    clock.advance(100)
    assert b.tokens == pytest.approx(3)  # never more than the burst


def test_token_bucket_rejects_bad_parameters(clock):
    with pytest.raises(ValueError, match="rate > 0"):
        TokenBucket(0, 1, clock)
    with pytest.raises(ValueError, match="burst >= 1"):
        TokenBucket(1, 0.5, clock)


def test_tenant_quotas_are_independent_and_bounded(clock):
    q = TenantQuotas(rate=1, burst=2, clock=clock, max_tenants=3, overrides={"vip": (100, 100)})
    assert q.take("a")[0] and q.take("a")[0] and not q.take("a")[0]
    assert q.take("b")[0]  # a's exhaustion does not touch b
    assert all(q.take("vip")[0] for _ in range(50))
    for i in range(10):
        q.take(f"spam{i}")
    assert len(q) == 3  # made-up tenant names cannot grow memory


def test_breaker_opens_on_failure_rate_and_recovers_through_probes(clock):
    br = CircuitBreaker(clock, window=10, min_calls=4, failure_rate=0.5, slow_call_seconds=1.0,
                        open_seconds=2.0, probes=2)
    for ok in (True, False, True):
        assert br.allow()
        br.record(ok)
    assert br.state == CLOSED  # 3 calls < min_calls
    br.record(False)
    assert br.state == OPEN  # 2 failures of 4 = 50 %
    assert not br.allow() and not br.would_allow()
    clock.advance(1.99)
    assert br.state == OPEN
    clock.advance(0.02)
    assert br.state == HALF_OPEN
    assert br.allow() and br.allow()
    assert not br.allow()  # only two probes at a time
    br.record(True)
    assert br.state == HALF_OPEN
    br.record(True)
    assert br.state == CLOSED
    assert [s for _, s in br.transitions] == [OPEN, HALF_OPEN, CLOSED]


def test_breaker_failed_probe_reopens_and_slow_calls_count(clock):
    br = CircuitBreaker(clock, window=5, min_calls=3, failure_rate=0.6, slow_call_seconds=0.2,
                        open_seconds=1.0, probes=1)
    for _ in range(3):
        br.record(True, latency=0.7)  # correct but slow
    assert br.state == OPEN
    clock.advance(1.0)
    assert br.allow()
    br.record(False)
    assert br.state == OPEN
    br.record(True)  # a late answer while open changes nothing
    assert br.state == OPEN
    clock.advance(1.0)
    assert br.allow()
    br.record(True, latency=0.01)
    assert br.state == CLOSED


def test_breaker_window_forgets_old_failures(clock):
    br = CircuitBreaker(clock, window=4, min_calls=4, failure_rate=0.75)
    for ok in (False, False, True, True, True, True):
        br.record(ok)
    assert br.state == CLOSED


def test_power_of_two_prefers_less_loaded_and_spreads():
    rng = random.Random(1)
    load = {0: 5, 1: 0, 2: 9}
    picks = Counter(power_of_two([0, 1, 2], load.__getitem__, rng) for _ in range(3000))
    assert picks[2] == 0  # the most loaded never wins a pair
    assert picks[1] > picks[0] > 0  # 1 wins both its pairs, 0 wins only against 2
    assert power_of_two([7], load.get, rng) == 7
    with pytest.raises(ValueError):
        power_of_two([], load.get, rng)


def test_outcomes_window_error_rate_and_p99(clock):
    o = Outcomes(clock, horizon=10)
    for i in range(100):
        o.add(True, (i + 1) / 1000)
    o.add(False, 5.0)
    s = o.summary()
    assert s.count == 101 and s.error_rate == pytest.approx(1 / 101)
    assert s.p99 == pytest.approx(0.099)  # errors do not enter the latency percentile
    clock.advance(5)
    o.add(True, 1.0)
    assert o.summary(since=clock() - 1).count == 1
    clock.advance(20)
    s = o.summary()
    assert s.count == 0 and math.isnan(s.p99)


def _sum(n, err=0.0, p99=0.01):
    return OutcomeSummary(n, err, p99)


def test_canary_walks_the_steps_then_promotes(clock):
    c = CanaryPolicy(clock, min_requests=10, min_step_seconds=5)
    seen = []
    for _ in range(4):
        seen.append(c.weight)
        assert c.decide(_sum(100), _sum(9)) == HOLD        # too few requests
        assert c.decide(_sum(100), _sum(10)) == HOLD       # too early
        clock.advance(5)
        d = c.decide(_sum(100), _sum(10))
        if d == ADVANCE:
            c.advance()
    assert seen == [0.01, 0.10, 0.50, 1.0]
    assert d == PROMOTE


def test_canary_rolls_back_on_errors_and_on_p99(clock):
    c = CanaryPolicy(clock, min_requests=10, max_error_rate_increase=0.02, p99_factor=1.5, p99_slack=0.001)
    assert c.decide(_sum(100, err=0.01), _sum(4, err=1.0)) == HOLD  # 4 < rollback_min_requests
    assert c.decide(_sum(100, err=0.01), _sum(5, err=0.2)) == ROLLBACK
    assert "error rate 20.0%" in c.reason
    c2 = CanaryPolicy(clock, min_requests=10, p99_factor=1.5, p99_slack=0.001, p99_min_requests=20)
    assert c2.decide(_sum(100, p99=0.010), _sum(19, p99=0.5)) != ROLLBACK  # too few for a p99
    assert c2.decide(_sum(100, p99=0.010), _sum(20, p99=0.0159)) != ROLLBACK
    assert c2.decide(_sum(100, p99=0.010), _sum(20, p99=0.0161)) == ROLLBACK
    assert "p99 16.1 ms" in c2.reason


def test_a_failing_canary_never_advances_on_too_few_requests_to_roll_back(clock):
    """Found by test_serve_rollout under load: with min_requests (3) below rollback_min_requests (5),
    a step whose 3-4 canary requests all failed advanced, and a broken version was promoted."""
    c = CanaryPolicy(clock, min_requests=3, min_step_seconds=0.2, rollback_min_requests=5)
    clock.advance(1)
    assert c.decide(_sum(100), _sum(3, err=1.0)) == HOLD
    assert c.decide(_sum(100), _sum(4, err=0.5)) == HOLD
    assert c.decide(_sum(100), _sum(5, err=0.4)) == ROLLBACK
    c2 = CanaryPolicy(clock, min_requests=3, min_step_seconds=0.2, rollback_min_requests=5)
    clock.advance(1)
    assert c2.decide(_sum(100, err=0.05), _sum(3, err=0.0)) == ADVANCE  # healthy: goes on


def test_canary_rejects_bad_steps(clock):
    for steps in [(), (0.5, 0.1, 1.0), (0.1, 0.5), (0.0, 1.0)]:
        with pytest.raises(ValueError, match="canary steps"):
            CanaryPolicy(clock, steps=steps)


def test_canary_of_an_idle_model_walks_on_time_alone(clock):
    c = CanaryPolicy(clock, min_requests=10, min_step_seconds=5)
    assert c.decide(_sum(0), _sum(0)) == HOLD
    clock.advance(5)
    assert c.decide(_sum(0), _sum(0)) == ADVANCE
    assert c.decide(_sum(3), _sum(0)) == HOLD  # stable has traffic: the canary must earn its step


def _pool_with(clock, replicas=2, **cfg):
    """A ModelVersion whose replicas are stand-ins: predicted_wait only reads the
    router's view (health, breaker, batches in flight, the compute estimate)."""
    from types import SimpleNamespace

    from host.serve.config import ServeConfig
    from host.serve.metrics import Metrics
    from host.serve.pool import ModelVersion, Slot

    mv = ModelVersion("m", "1", "unused.onnx", None, ServeConfig(replicas=replicas, **cfg), Metrics(), clock=clock)
    for i in range(replicas):
        slot = Slot(SimpleNamespace(index=i, alive=True), CircuitBreaker(clock, 10, 5, 0.5, 1.0, 2.0, 1))
        slot.healthy = True
        mv.slots.append(slot)
    mv._compute_seconds = 0.010
    return mv


def _busy(mv, slot, sent, rows=1):
    from host.serve.pool import _Batch

    mv._seq += 1
    mv._batches[mv._seq] = _Batch(mv.slots[slot], [], rows, sent)


def test_predicted_wait_deals_the_queue_to_the_replica_that_frees_first(clock):
    from host.serve.pool import _Item

    mv = _pool_with(clock, max_batch_size=1)
    assert mv.predicted_wait() == 0.0                        # both idle
    _busy(mv, 0, clock())
    assert mv.predicted_wait() == 0.0                        # replica 1 is idle
    clock.advance(0.004)
    _busy(mv, 1, clock())
    clock.advance(0.002)                                     # 0 frees in 4 ms, 1 in 8 ms
    assert mv.predicted_wait() == pytest.approx(0.004)
    mv._queue.append(_Item({}, 1, None, clock()))            # one ahead takes replica 0
    assert mv.predicted_wait() == pytest.approx(0.008)
    mv._queue.append(_Item({}, 1, None, clock()))            # the next waits for 0 again
    assert mv.predicted_wait() == pytest.approx(0.014)
    mv.slots[1].healthy = False                              # an unhealthy replica frees nothing
    assert mv.predicted_wait() == pytest.approx(0.024)


def test_wait_budget_rejects_at_arrival_and_names_the_budget(clock):
    from host.serve.pool import Overloaded, _Item

    mv = _pool_with(clock, replicas=1, max_batch_size=4, max_queue=100, max_queue_wait=0.015)
    _busy(mv, 0, clock(), rows=4)
    mv.check_room()                                          # 10 ms < 15 ms: admitted
    for _ in range(4):                                       # a full batch queued ahead
        mv._queue.append(_Item({}, 1, None, clock()))
    with pytest.raises(Overloaded) as e:                     # 10 + 10 ms > 15 ms
        mv.check_room()
    assert e.value.reason == "queue_wait" and "15 ms budget" in str(e.value)
    assert e.value.retry_after == pytest.approx(0.020)
    mv.slots[0].healthy = False
    with pytest.raises(Overloaded) as e:
        mv.check_room()
    assert e.value.reason == "no_replica" and e.value.retry_after == mv.cfg.breaker_open
