"""``edgelearn serve``: serve a signed bundle over the Open Inference Protocol.

    $ edgelearn serve --port 8000            # the shipped bundle, verified with the shipped key
    $ edgelearn serve --bundle out/kws --pubkey keys/edgelearn.pub
    $ curl localhost:8000/v2/models/kws-dscnn-s

The server is ``host.serve.app.Server``; ``host.serve.background.BackgroundServer`` runs it on a
thread with an ephemeral loopback port, for the demo, tests and benchmarks.
"""

from __future__ import annotations

import errno

from host.config_args import add_config_arguments, config_from_args
from host.serve.config import ServeConfig

# the ServeConfig fields `edgelearn serve` offers as options (seconds shown as ms or s), in --help order
SERVE_FIELDS = ("replicas", "max_batch_size", "max_queue_delay", "max_queue", "max_queue_wait",
                "max_inflight_per_replica", "tenant_rate", "tenant_burst", "max_body_bytes", "breaker_slow_call",
                "breaker_open", "fault_injection")
UNITS = {"max_queue_delay": "ms", "max_queue_wait": "ms", "breaker_slow_call": "ms", "breaker_open": "s"}


def port_number(text: str) -> int:
    """argparse type: a TCP port, 1-65535 (0: any free port, which the `serving ... on` line names)."""
    import argparse

    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port: give a number from 1 to 65535 "
                                         "(0: any free port)")
    return port


def bind(host: str, port: int):
    """A listening socket on ``host``:``port``, or one EdgelearnError (port in use, unknown host)."""
    import socket

    from edge.errors import EdgelearnError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise EdgelearnError(f"cannot listen on --host {host}: no such host or address ({e})",
                             fix="give an address of this machine, e.g. 127.0.0.1 or 0.0.0.0") from None
    family, kind, proto, _name, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise EdgelearnError(f"cannot listen on {host}:{port}: the port is already in use",
                                 fix="stop what uses it or pass another --port") from None
        raise EdgelearnError(f"cannot listen on {host}:{port}: {e.strerror or e}",
                             fix="pass another --host or --port (ports below 1024 need root)") from None
    return sock


def add_arguments(parser) -> None:
    parser.add_argument("--bundle", default=None,
                        help="bundle directory or .zip to serve, or a shipped bundle's name (default: the shipped "
                             "kws-dscnn-s)")
    parser.add_argument("--pubkey", action="append", default=None,
                        help="trusted Ed25519 public key(s) (.pub file or directory); repeatable "
                             "(default: $EDGELEARN_KEYS, /etc/edgelearn/keys, then models/keys)")
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
    from host.bundle import bundle_arg

    args.bundle = str(bundle_arg(args.bundle))
    if args.pubkey is None and not args.allow_unsigned:
        from edge.kws import default_trusted_keys
        args.pubkey = [str(default_trusted_keys())]
    # Verify and bind before anything starts, so a bad bundle, host or port is one clear line.
    b = load_bundle(args.bundle, trusted_keys=args.pubkey, allow_unsigned=args.allow_unsigned)
    sock = bind(args.host, args.port)
    server = build(args)
    config = uvicorn.Config(server.app(bundle=args.bundle), log_level="warning", access_log=False, lifespan="on")
    where = f"[{args.host}]" if ":" in args.host else args.host
    port = sock.getsockname()[1]
    print(f"serve: serving {b.model_id} v{b.version} ({args.bundle}) on http://{where}:{port}", flush=True)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
    return 0
