"""Serving knobs in one place, with the reasoning behind each default.

    >>> cfg = ServeConfig(replicas=3, max_batch_size=32, tenant_rate=200)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edge.errors import EdgelearnError


@dataclass
class ServeConfig:
    replicas: int = 2                  # worker processes per model version (one core each)
    max_batch_size: int = 32           # rows per ONNX Runtime call
    # 0 = dispatch as soon as a replica has room; batches still form under load
    # because requests queue while every replica is busy. A positive delay trades
    # latency for larger batches when traffic is light.
    max_queue_delay: float = 0.0
    max_queue: int = 128               # queued requests per version before 503
    # Latency-budget admission: > 0 rejects (503 + Retry-After) a request whose
    # predicted wait for a replica exceeds this many seconds, at arrival, so an
    # admitted request's latency stays near one service time under overload.
    # 0 = only the queue bound applies. (Triton's queue policy times requests
    # out after they waited; predicting at arrival rejects them in microseconds.)
    max_queue_wait: float = 0.0
    max_inflight_per_replica: int = 2  # batches per replica: one computing, one waiting in its pipe
    batch_timeout: float = 5.0         # a batch not answered by then fails over
    max_attempts: int = 2              # a failed batch is retried once on another replica
    tenant_rate: float = 1000.0        # requests/s per tenant (token refill)
    tenant_burst: float = 2000.0
    tenant_header: str = "x-tenant"
    tenant_overrides: dict = field(default_factory=dict)  # tenant -> (rate, burst)
    max_body_bytes: int = 4 << 20
    # A body must arrive whole within this many seconds, else 408: a client trickling 1 byte/s
    # (or sending headers and no body) would otherwise hold a connection and its task for good.
    body_timeout: float = 5.0
    breaker_window: int = 20
    breaker_min_calls: int = 5
    breaker_failure_rate: float = 0.5
    breaker_slow_call: float = 0.25    # seconds; a call slower than this counts as failed
    breaker_open: float = 2.0          # seconds open before half-open probes
    breaker_probes: int = 2
    health_interval: float = 5.0       # seconds between deep checks per replica
    restart_failed: bool = True
    canary_steps: tuple = (0.01, 0.10, 0.50, 1.0)
    canary_min_requests: int = 50
    canary_min_step_seconds: float = 5.0
    canary_max_error_increase: float = 0.02
    canary_p99_factor: float = 1.5
    canary_p99_min_requests: int = 100
    fault_injection: bool = False      # enables POST /v2/debug/... (tests and benchmarks only)

    def __post_init__(self) -> None:
        checks = [
            (self.replicas >= 1, "replicas must be at least 1"),
            (self.max_batch_size >= 1, "max_batch_size must be at least 1"),
            (self.max_queue_delay >= 0, "max_queue_delay must be >= 0 seconds"),
            (self.max_queue >= 1, "max_queue must be at least 1"),
            (self.max_queue_wait >= 0, "max_queue_wait must be >= 0 seconds"),
            (self.max_inflight_per_replica >= 1, "max_inflight_per_replica must be at least 1"),
            (self.batch_timeout > 0, "batch_timeout must be > 0 seconds"),
            (self.max_attempts >= 1, "max_attempts must be at least 1"),
            (self.tenant_rate > 0 and self.tenant_burst >= 1, "tenant_rate must be > 0 and tenant_burst >= 1"),
            (self.max_body_bytes >= 1024, "max_body_bytes must be at least 1024"),
            (self.body_timeout > 0, "body_timeout must be > 0 seconds"),
            (self.health_interval > 0, "health_interval must be > 0 seconds"),
        ]
        for ok, problem in checks:
            if not ok:
                raise EdgelearnError(f"serve config: {problem}", fix="change the option and start again")
