"""Prometheus metrics of the serving shim, in a registry per server.

A registry per server (not the global default) so two servers in one process,
as in the tests, never share counters. Gauges that mirror state (queue depth,
breaker state, replica health, canary weight) are refreshed at scrape time
from the live objects, so they can never drift from the truth.

    >>> m = Metrics()
    >>> m.requests.labels("kws", "3", "acme", "200").inc()
    >>> body = m.render(models)          # text exposition format for GET /metrics
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from host.serve.policy import BREAKER_STATES

# Latency buckets from 0.25 ms: the shim's own overhead is sub-millisecond.
_LATENCY = (0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_BATCH = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        p = "edgelearn_serve_"
        self.requests = Counter(p + "requests", "Inference requests answered, by HTTP status",
                                ["model", "version", "tenant", "status"], registry=r)
        self.latency = Histogram(p + "request_seconds", "End-to-end latency of admitted requests",
                                 ["model", "version", "tenant"], buckets=_LATENCY, registry=r)
        self.rejections = Counter(p + "rejections", "Requests refused before execution",
                                  ["model", "version", "tenant", "reason"], registry=r)
        self.batch_size = Histogram(p + "batch_size", "Rows per batch sent to a replica",
                                    ["model", "version", "replica"], buckets=_BATCH, registry=r)
        self.replica_batches = Counter(p + "replica_batches", "Batches answered by a replica, by outcome",
                                       ["model", "version", "replica", "outcome"], registry=r)
        self.replica_seconds = Histogram(p + "replica_seconds", "Time from send to answer per batch",
                                         ["model", "version", "replica"], buckets=_LATENCY, registry=r)
        self.queue_depth = Gauge(p + "queue_depth", "Requests waiting for a replica",
                                 ["model", "version"], registry=r)
        self.breaker = Gauge(p + "breaker_state", "1 for the breaker's current state",
                             ["model", "version", "replica", "state"], registry=r)
        self.healthy = Gauge(p + "replica_healthy", "1 if the replica passes its deep check",
                             ["model", "version", "replica"], registry=r)
        self.outstanding = Gauge(p + "replica_outstanding_rows", "Rows in flight per replica",
                                 ["model", "version", "replica"], registry=r)
        self.canary_weight = Gauge(p + "canary_weight", "Share of unversioned traffic sent to a version",
                                   ["model", "version"], registry=r)
        self.rollouts = Counter(p + "rollouts", "Rollout outcomes", ["model", "version", "outcome"], registry=r)

    def render(self, models) -> bytes:
        """Refresh state gauges from ``models`` (name -> ServedModel) and render."""
        self.queue_depth.clear()
        self.breaker.clear()
        self.healthy.clear()
        self.outstanding.clear()
        self.canary_weight.clear()
        for name, model in models.items():
            for version, mv in model.versions.items():
                self.queue_depth.labels(name, version).set(mv.queue_depth)
                self.canary_weight.labels(name, version).set(model.weight_of(version))
                for slot in mv.slots:
                    rid = str(slot.index)
                    state = slot.breaker.state
                    for s in BREAKER_STATES:
                        self.breaker.labels(name, version, rid, s).set(1.0 if s == state else 0.0)
                    self.healthy.labels(name, version, rid).set(1.0 if slot.routable_health else 0.0)
                    self.outstanding.labels(name, version, rid).set(slot.replica.outstanding_rows)
        return generate_latest(self.registry)
