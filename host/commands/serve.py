"""``edgelearn serve``: serve a signed bundle over the Open Inference Protocol.

    $ edgelearn serve --bundle models/kws-dscnn-s --pubkey keys/edgelearn.pub --port 8000
    $ curl localhost:8000/v2/models/kws-dscnn-s

The server is ``host.serve.app.Server``; ``host.serve.background.BackgroundServer`` runs it on a
thread with an ephemeral loopback port, for the demo, tests and benchmarks.
"""

from __future__ import annotations

from host.config_args import add_config_arguments, config_from_args
from host.serve.config import ServeConfig

# the ServeConfig fields `edgelearn serve` offers as options (seconds shown as ms or s), in --help order
SERVE_FIELDS = ("replicas", "max_batch_size", "max_queue_delay", "max_queue", "max_queue_wait",
                "max_inflight_per_replica", "tenant_rate", "tenant_burst", "max_body_bytes", "breaker_slow_call",
                "breaker_open", "fault_injection")
UNITS = {"max_queue_delay": "ms", "max_queue_wait": "ms", "breaker_slow_call": "ms", "breaker_open": "s"}


def add_arguments(parser) -> None:
    parser.add_argument("--bundle", required=True, help="bundle directory or .zip to serve")
    parser.add_argument("--pubkey", action="append", default=None,
                        help="trusted Ed25519 public key(s) (.pub file or directory); repeatable "
                             "(default: $EDGELEARN_KEYS, /etc/edgelearn/keys, then models/keys)")
    parser.add_argument("--allow-unsigned", action="store_true", help="serve an unsigned bundle (local experiments)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    add_config_arguments(parser, ServeConfig, SERVE_FIELDS[:-1], units=UNITS, help={
        "replicas": "worker processes per model version",
        "max_queue": "queued requests per version before 503",
        "max_queue_wait": "503 at arrival when the predicted wait for a replica exceeds this (0 = off)",
        "max_inflight_per_replica": "batches sent to a replica before it counts as busy (1 = lowest queueing latency)",
        "tenant_rate": "requests/s per tenant (X-Tenant)",
        "breaker_slow_call": "a replica call slower than this counts as a failure for its circuit breaker",
        "breaker_open": "seconds a breaker stays open before probing"})
    parser.add_argument("--rollout-dir", default=None,
                        help="directory from which POST /v2/repository/models/M/load may take new bundles")
    add_config_arguments(parser, ServeConfig, SERVE_FIELDS[-1:], help={
        "fault_injection": "enable POST /v2/debug/.../fault (benchmarks only; never in production)"})


def build(args):
    from host.serve.app import Server
    cfg = config_from_args(ServeConfig, args, SERVE_FIELDS, units=UNITS)
    return Server(cfg, trusted_keys=args.pubkey, allow_unsigned=args.allow_unsigned, rollout_dir=args.rollout_dir)


def run(args) -> int:
    import uvicorn

    from edge.bundle import load_bundle

    if args.pubkey is None and not args.allow_unsigned:
        from edge.kws import default_trusted_keys
        args.pubkey = [str(default_trusted_keys())]
    # Verify before binding the port, so a bad bundle is one clear line, not a traceback.
    load_bundle(args.bundle, trusted_keys=args.pubkey, allow_unsigned=args.allow_unsigned)
    server = build(args)
    uvicorn.run(server.app(bundle=args.bundle), host=args.host, port=args.port, log_level="warning",
                access_log=False)
    return 0
