"""Prometheus metrics of the aggregator (``GET /metrics``), read from its state at scrape time.

A collector instead of counters updated on every request: the hot upload path
pays nothing, and the numbers are the database's own (they survive restarts),
except the refusal and group-commit counters, which are per process.

    registry = metrics_registry(aggregator, refusals)   # refusals: {(status, error): count}
    text = prometheus_client.generate_latest(registry)
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class AggregatorCollector:
    def __init__(self, agg, refusals: dict):
        self.agg, self.refusals = agg, refusals

    def collect(self):
        s, rm = self.agg.store, self.agg.rounds
        g = GaugeMetricFamily("edgelearn_model_version", "Current published model version")
        g.add_metric([], rm.reg.current)
        yield g
        g = GaugeMetricFamily("edgelearn_devices", "Provisioned devices")
        g.add_metric([], s.one("SELECT COUNT(*) FROM devices")[0])
        yield g
        c = CounterMetricFamily("edgelearn_rounds", "Rounds that ended, by outcome", labels=["status"])
        for status, n in s.all("SELECT status, COUNT(*) FROM rounds WHERE status<>'open' GROUP BY status"):
            c.add_metric([status], n)
        yield c
        r = rm.round
        g = GaugeMetricFamily("edgelearn_open_round", "The open round's progress", labels=["field"])
        for f in ("round_id", "selected", "accepted", "target"):
            g.add_metric([f], r[f])
        g.add_metric(["selection_target"], rm.selection_target() if self.agg.cfg.mode == "sync" else r["target"])
        yield g
        c = CounterMetricFamily("edgelearn_upload_bytes", "Bytes of accepted updates, over all rounds")
        c.add_metric([], int(s.one("SELECT COALESCE(SUM(bytes), 0) FROM rounds")[0]))
        yield c
        c = CounterMetricFamily("edgelearn_refusals", "Requests refused since start, by status and reason",
                                labels=["status", "error"])
        for (status, error), n in sorted(self.refusals.items()):
            c.add_metric([str(status), error], n)
        yield c
        grp = self.agg.group
        if grp is not None:
            c = CounterMetricFamily("edgelearn_commit_batches", "Group-commit transactions since start")
            c.add_metric([], grp.batches)
            yield c
            c = CounterMetricFamily("edgelearn_committed_updates", "Updates committed through group commit since start")
            c.add_metric([], grp.committed)
            yield c
        if rm.secure is not None:
            c = CounterMetricFamily("edgelearn_secagg_failures", "Secure rounds that failed below the threshold")
            c.add_metric([], rm.secure.failures)
            yield c


def metrics_registry(agg, refusals: dict) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(AggregatorCollector(agg, refusals))
    return reg
