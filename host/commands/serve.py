"""``edgelearn serve``: serve a signed bundle over the Open Inference Protocol.

    $ edgelearn serve --port 8000            # the shipped bundle, verified with the shipped key
    $ edgelearn serve --bundle out/kws --pubkey keys/edgelearn.pub
    $ curl localhost:8000/v2/models/kws-dscnn-s

The server is ``host.serve.app.Server``; ``host.serve.background.BackgroundServer`` runs it on a
thread with an ephemeral loopback port, for the demo, tests and benchmarks.
"""

from __future__ import annotations

from host.config_args import add_config_arguments, config_from_args
from host.netutil import bind, port_number  # noqa: F401 (shared with `aggregator serve`)
from host.serve.config import ServeConfig

# the ServeConfig fields `edgelearn serve` offers as options (seconds shown as ms or s), in --help order
SERVE_FIELDS = ("replicas", "max_batch_size", "max_queue_delay", "max_queue", "max_queue_wait",
                "max_inflight_per_replica", "tenant_rate", "tenant_burst", "max_body_bytes", "body_timeout", "breaker_slow_call",
                "breaker_open", "fault_injection")
UNITS = {"body_timeout": "s", "max_queue_delay": "ms", "max_queue_wait": "ms", "breaker_slow_call": "ms", "breaker_open": "s"}


def add_arguments(parser) -> None:
    parser.add_argument("--bundle", default=None,
                        help="bundle directory or .zip to serve, or a shipped bundle's name (default: the shipped "
                             "kws-dscnn-s)")
    parser.add_argument("--pubkey", action="append", default=None,
                        help="trusted Ed25519 public key(s) (.pub file or directory); repeatable "
                             "(default: $EDGELEARN_KEYS, else /etc/edgelearn/keys); the shipped release keys "
                             "are always added (set EDGELEARN_NO_SHIPPED_KEYS=1 to leave them out)")
    parser.add_argument("--allow-unsigned", action="store_true", help="serve an unsigned bundle (local experiments)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    parser.add_argument("--port", type=port_number, default=8000,
                        help="TCP port, 1-65535 (default 8000; 0: any free port)")
    add_config_arguments(parser, ServeConfig, SERVE_FIELDS[:-1], units=UNITS, help={
        "replicas": "worker processes per model version",
        "max_queue": "queued requests per version before 503",
        "max_queue_wait": "503 at arrival when the predicted wait for a replica exceeds this (0 = off)",
        "max_inflight_per_replica": "batches sent to a replica before it counts as busy (1 = lowest queueing latency)",
        "tenant_rate": "requests/s per tenant (X-Tenant)",
        "body_timeout": "a request body not received whole within this is answered 408",
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
    from edge.errors import BundleError
    from host.bundle import bundle_arg

    args.bundle = str(bundle_arg(args.bundle))
    if args.pubkey is not None or not args.allow_unsigned:
        from edge.kws import resolve_trusted_keys  # --pubkey (repeatable) or the defaults, plus the shipped keys
        args.pubkey = [str(k) for k in resolve_trusted_keys(args.pubkey)]
    # Verify and bind before anything starts, so a bad bundle, host or port is one clear line.
    b = load_bundle(args.bundle, trusted_keys=args.pubkey, allow_unsigned=args.allow_unsigned)
    if not any(p.get("format") == "onnx" for p in b.partitions):  # what host.serve.loader serves
        raise BundleError(f"bundle {b.model_id} v{b.version} has no ONNX partition, so serve has nothing to serve "
                          f"(its partitions: {', '.join(p['format'] for p in b.partitions) or 'none'})",
                          fix="serve a bundle with an ONNX encoder, e.g. the default kws-dscnn-s (omit --bundle); "
                              "flash an MCU bundle with `edgelearn flash`")
    sock = bind(args.host, args.port)
    server = build(args)
    # On SIGTERM/SIGINT uvicorn stops accepting, lets in-flight requests finish, then runs the
    # lifespan shutdown (replicas stop last). The wait is bounded so a stuck client cannot hold a
    # restart for good: bodies time out after body_timeout and batches after batch_timeout, so
    # GRACE covers every request that can still complete.
    grace = int(server.cfg.body_timeout + server.cfg.batch_timeout * server.cfg.max_attempts) + 5
    config = uvicorn.Config(server.app(bundle=args.bundle), log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=grace)
    where = f"[{args.host}]" if ":" in args.host else args.host
    port = sock.getsockname()[1]
    print(f"serve: serving {b.model_id} v{b.version} ({args.bundle}) on http://{where}:{port}", flush=True)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
    return 0
