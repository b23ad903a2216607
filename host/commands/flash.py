"""``edgelearn flash``: deploy the firmware and an MCU bundle to a board over its raw REPL.

``--port pty`` flashes the unix port on a pseudo-terminal whose filesystem is ``--fs DIR`` (the
CI rig). The deploy and the board's own check are ``host.flash.flash``.

    $ edgelearn flash --port /dev/ttyUSB0 --bundle kws-mcu-tcnn --device-key keys/esp32-07.key
    $ edgelearn flash --port pty --fs build/pty-board
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from host.board.fs import DEFAULT_BUNDLE
from host.flash import bundle_source, flash


def add_arguments(p) -> None:
    p.add_argument("--port", required=True, help="serial port (/dev/ttyUSB0, COM3) or 'pty' for the unix-port rig")
    p.add_argument("--bundle", type=Path, default=DEFAULT_BUNDLE,
                   help="bundle with an mpy-blob partition: a directory, a .zip or a shipped bundle's name "
                        "(default: the shipped kws-mcu-tcnn)")
    p.add_argument("--pubkey", action="append", default=None,
                   help="trusted public key file or directory the bundle must be signed with (repeatable; added "
                        "to the shipped release keys)")
    p.add_argument("--device-id", default="esp32-01")
    p.add_argument("--device-key", type=Path, help="provisioned device key file (edgelearn-hmac-key <hex>)")
    p.add_argument("--fs", type=Path, help="with --port pty: the directory that is the board's filesystem")


def run(args) -> int:
    from edge.bundle import load_hmac_key
    from host.board.rigs import open_rig

    key = load_hmac_key(args.device_key) if args.device_key else None
    with tempfile.TemporaryDirectory() as work:  # a bad bundle is one sentence before any board is opened
        bundle_source(args.bundle, Path(work), args.pubkey)
    if args.port == "pty":
        from host.board.rigs import PtyRig
        if args.fs is None:
            sys.stderr.write("flash: --port pty needs --fs DIR (the board's filesystem)\n")
            return 2
        args.fs.mkdir(parents=True, exist_ok=True)
        rig = PtyRig(fs_dir=args.fs)
    else:
        rig = open_rig(args.port if args.port.startswith("serial:") else "serial:" + args.port)
    shown = []

    def progress(i, n, name):
        shown.append(i)
        sys.stderr.write(f"\rflash: {i}/{n} {name:40s}")

    with rig:
        t = rig.transport()
        try:
            lines = flash(t, args.bundle, args.device_id, key, trusted_keys=args.pubkey, progress=progress)
        finally:
            t.close()
            if shown:  # the progress line ends before the result, or before a refusal's one sentence
                sys.stderr.write("\n")
    for line in lines:
        print(line)
    if key is None:
        print("note: no --device-key given; the board cannot sign updates until one is provisioned")
    return 0 if any(line.startswith("MODEL") for line in lines) else 1
