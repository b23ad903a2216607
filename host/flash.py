"""Deploy the firmware and an MCU bundle to a board over its raw REPL (``flash``);
``edgelearn flash`` (``host/commands/flash.py``) runs it.

Compiles ``edge/portable`` and ``firmware`` to .mpy, copies them with the
bundle's MicroPython blob, its graph and a ``bundle.json`` (into
``bundle.new/``, ``bundle.json`` last), the device config and key, then runs
the board's own check: the firmware verifies the digests, loads the model and
only then swaps ``bundle.new`` in (keeping ``bundle.old``). A transfer that is
cut short leaves the running bundle in place; run the command again. A board
whose filesystem is read-only or too full is one sentence
(``host.board.transport.BoardFsError``, rc 2 from the CLI) and keeps everything
it held: the free space is checked before anything is written, a file the board
has is replaced only once every file is across, and a write refused on the way
takes back what the flash wrote (no ``bundle.new/`` is left).
``--port pty`` flashes the unix port on a pseudo-terminal whose filesystem is
``--fs DIR`` (the CI rig). That rig boots with ``edge/portable`` and ``firmware``
frozen in a ROMFS image, as an ESP32 firmware image would carry them (so the
firmware fits the 100 KB heap, docs/firmware.md), and the deploy copies only
what a board keeps in its filesystem: the bundle, the config and the key.

    >>> with PtyRig(fs_dir=Path("build/pty-board")) as rig:      # host.board.rigs
    ...     flash(rig.transport(), Path("models/kws-mcu-tcnn"), "esp32-01", None)
"""

from __future__ import annotations

import tempfile
from pathlib import Path

CHECK = """
from firmware.board import make_board
from firmware.app import App
a = App(make_board())
print('MODEL', a.model_id, a.version)
for e in a.events:
    print('EVENT', e)
del a  # the raw REPL keeps globals: free the check's App before the firmware starts its own
import gc
gc.collect()
"""


def bundle_source(bundle, work: Path, trusted_keys=None) -> Path:
    """The bundle directory to deploy: ``bundle`` (a directory), a shipped bundle's name
    (``kws-mcu-tcnn``, ``host.bundle.bundle_arg``), or a .zip, verified with ``trusted_keys`` plus the
    shipped release keys (``edge.kws.resolve_trusted_keys``); a .zip is unpacked under ``work``.
    A directory is verified exactly as a .zip is (signature, then every file's size and SHA-256):
    a tampered, unsigned or untrusted bundle is one BundleError before anything reaches a board."""
    from edge.bundle import load_bundle
    from edge.errors import BundleError
    from edge.kws import MODELS, resolve_trusted_keys
    from host.bundle import bundle_arg

    path = bundle_arg(bundle)
    if path.is_dir():
        src = path
        b = load_bundle(path, trusted_keys=resolve_trusted_keys(trusted_keys))
    elif path.is_file():
        src = Path(work) / "bundle-src"
        b = load_bundle(path, trusted_keys=resolve_trusted_keys(trusted_keys), extract_to=src)
    else:
        shipped = ", ".join(sorted(p.name for p in MODELS.iterdir() if (p / "manifest.json").is_file()))
        raise BundleError(f"{bundle}: no such bundle directory, .zip or shipped bundle",
                          fix=f"pass a bundle directory, a .zip or a shipped bundle's name ({shipped})")
    check_flashable(b.manifest, bundle)
    return src


def check_flashable(manifest: dict, name) -> None:
    """What the board needs beside a verified bundle, said in one sentence before a board is opened:
    the MicroPython partition (format ``mpy-blob``), its ``graph.json`` (the op list the firmware runs,
    docs/firmware.md) and the front end's normalisation scale (``host.board.manifest.bundle_files``)."""
    from edge.errors import BundleError

    fix = ("flash the shipped kws-mcu-tcnn, or partition a bundle the board runs: "
           "edgelearn partition kws-mcu-tcnn --target esp32 --out DIR --key KEY")
    parts = [p for p in manifest.get("partitions", []) if p.get("format") == "mpy-blob"]
    if not parts:
        raise BundleError(f"{name} has no MicroPython partition (format mpy-blob) for the board to run", fix=fix)
    graph = parts[0].get("graph", "graph.json")
    if graph not in manifest.get("files", {}):
        raise BundleError(f"{name} has no {graph} (the op list the board's firmware runs) beside its "
                          f"{parts[0].get('file')}", fix=fix)
    frontend = manifest.get("frontend")
    norm = frontend.get("normalize") if isinstance(frontend, dict) else None
    if not isinstance(norm, dict) or not isinstance(norm.get("scale"), list):
        raise BundleError(f"{name} has no frontend.normalize.scale, which the board scales its features with "
                          "(a bundle partitioned from a bare model file has no front end)",
                          fix="partition a bundle, which keeps its front end: edgelearn partition kws-mcu-tcnn "
                              "--target esp32 --out DIR --key KEY")


def flash(transport, bundle: Path, device_id: str, key: bytes | None, progress=None,
          trusted_keys=None) -> list[str]:
    """Deploy to an open ``host.board.transport.BoardTransport``; returns the board's check output lines.
    ``bundle``: a directory, a shipped bundle's name or a .zip (``bundle_source``). A read-only or full board
    raises ``BoardFsError`` before the check runs, with the board as it was (``BoardTransport.deploy``)."""
    from host.board.fs import board_files

    with tempfile.TemporaryDirectory() as work:
        bundle = bundle_source(bundle, Path(work), trusted_keys)
        files = board_files(Path(work), bundle, device_id, key or b"")
        if key is None:
            files = [f for f in files if f[1] != "state/device.key"]
        transport.deploy(files, progress=progress)
        out = transport.exec(CHECK, timeout=120)
    return out.strip().splitlines()
