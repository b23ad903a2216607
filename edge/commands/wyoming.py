"""``edgelearn wyoming``: the device's keywords as a Wyoming wake-word service (Home Assistant).

    $ edgelearn wyoming --uri tcp://0.0.0.0:10400 --state /var/lib/edgelearn --zeroconf
    {"uri": "tcp://0.0.0.0:10400", "models": ["hey edge", "yes", "no", ...],
     "zeroconf": "b827eb12ab34._wyoming._tcp.local."}

Then in Home Assistant: Settings -> Devices & services, where the announced server (``--zeroconf
[NAME]``, mDNS) is "Discovered"; without it, Add integration -> Wyoming Protocol, the board's
address and port 10400. The keywords are wake words of a voice assistant's pipeline.
Enrol with ``edgelearn device enroll`` (same ``--state``) while it runs: the new keyword is offered
from the next ``describe`` on. Parsing and printing only: the server is ``edge.wyoming.WakeServer``.
"""

from __future__ import annotations

import json
from pathlib import Path

from edge.commands.device import add_second_stage, second_stage


def add_arguments(p) -> None:
    p.add_argument("--uri", default="tcp://0.0.0.0:10400",
                   help="where to listen: tcp://HOST:PORT (port 0: any free one) or unix://PATH")
    p.add_argument("--state", type=Path, required=True, help="device state directory (its enrolled keywords)")
    p.add_argument("--bundle", type=Path, default=None, help="bundle directory, .zip or a shipped bundle's name "
                                                                   "(default: the shipped kws-dscnn-s)")
    p.add_argument("--pubkey", type=Path, action="append", default=None,
                   help="trusted public key file or directory (repeatable; added to the shipped release keys)")
    p.add_argument("--backend", default="auto", help="litert | onnxruntime | auto")
    level = p.add_mutually_exclusive_group()
    level.add_argument("--threshold", type=float, default=None,
                       help="base keyword threshold (default: the version's own operating point, else 0.7)")
    level.add_argument("--sensitivity", type=float, default=None, metavar="FA_PER_HOUR",
                       help="per-keyword thresholds from `device calibrate`")
    add_zeroconf_argument(p)
    add_second_stage(p)
    p.add_argument("--keywords", default=None,
                   help="comma-separated base keywords to offer, or 'all' (default: the bundle's commands)")


def add_zeroconf_argument(p) -> None:
    """``--zeroconf [NAME]`` (``edgelearn wyoming`` and ``device run --wyoming``)."""
    p.add_argument("--zeroconf", nargs="?", const=True, default=False, metavar="NAME",
                   help="announce the server on mDNS as NAME._wyoming._tcp.local. so Home Assistant discovers it "
                        "(tcp:// only; NAME default: this machine's MAC address in hex)")


def run(args) -> int:
    from edge.device import Device
    from edge.wyoming import WakeServer

    kws = None if not args.keywords else "all" if args.keywords == "all" else \
        [w.strip() for w in args.keywords.split(",") if w.strip()]
    device = Device(args.state, args.bundle, backend=args.backend, trusted_keys=args.pubkey)
    server = WakeServer(device, args.uri, keywords=kws, threshold=args.threshold, sensitivity=args.sensitivity,
                        zeroconf=args.zeroconf, asr=second_stage(args))

    def ready():
        out = {"uri": server.uri, "models": server.models()}
        if server.zeroconf is not None:
            out["zeroconf"] = server.zeroconf.service
        print(json.dumps(out), flush=True)

    server.serve_forever(on_ready=ready)
    return 0
