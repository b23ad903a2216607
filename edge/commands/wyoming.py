"""``edgelearn wyoming``: the device's keywords as a Wyoming wake-word service (Home Assistant).

    $ edgelearn wyoming --uri tcp://0.0.0.0:10400 --state /var/lib/edgelearn
    {"uri": "tcp://0.0.0.0:10400", "models": ["hey edge", "yes", "no", ...]}

Then in Home Assistant: Settings -> Devices & services -> Add integration -> Wyoming Protocol, the
board's address and port 10400; the keywords are wake words of a voice assistant's pipeline.
Enrol with ``edgelearn device enroll`` (same ``--state``) while it runs: the new keyword is offered
from the next ``describe`` on. Parsing and printing only: the server is ``edge.wyoming.WakeServer``.
"""

from __future__ import annotations

import json
from pathlib import Path


def add_arguments(p) -> None:
    p.add_argument("--uri", default="tcp://0.0.0.0:10400",
                   help="where to listen: tcp://HOST:PORT (port 0: any free one) or unix://PATH")
    p.add_argument("--state", type=Path, required=True, help="device state directory (its enrolled keywords)")
    p.add_argument("--bundle", type=Path, default=None, help="bundle dir or .zip (default: shipped)")
    p.add_argument("--pubkey", type=Path, default=None, help="trusted public key file or directory")
    p.add_argument("--backend", default="auto", help="litert | onnxruntime | auto")
    level = p.add_mutually_exclusive_group()
    level.add_argument("--threshold", type=float, default=None, help="base keyword threshold (default 0.7)")
    level.add_argument("--sensitivity", type=float, default=None, metavar="FA_PER_HOUR",
                       help="per-keyword thresholds from `device calibrate`")
    p.add_argument("--keywords", default=None,
                   help="comma-separated base keywords to offer, or 'all' (default: the bundle's commands)")


def run(args) -> int:
    from edge.device import Device
    from edge.wyoming import WakeServer

    kws = None if not args.keywords else "all" if args.keywords == "all" else \
        [w.strip() for w in args.keywords.split(",") if w.strip()]
    device = Device(args.state, args.bundle, backend=args.backend, trusted_keys=args.pubkey)
    server = WakeServer(device, args.uri, keywords=kws, threshold=args.threshold, sensitivity=args.sensitivity)
    server.serve_forever(on_ready=lambda: print(json.dumps({"uri": server.uri, "models": server.models()}),
                                                flush=True))
    return 0
