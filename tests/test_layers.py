"""The layers of docs/design.md, held by parsing every import (AST: runs everywhere, imports nothing).

- ``edge/`` (the Linux device runtime) imports nothing from ``host``, ``bench``, ``hil``,
  ``firmware``, ``tests`` or ``scripts``, and of third-party code only numpy, ``cryptography`` and
  the interpreters its backends wrap;
- ``edge/portable/`` imports only itself and modules MicroPython has;
- ``firmware/`` imports only ``edge.portable``, itself and modules MicroPython has;
- ``host/`` imports no test, benchmark or hardware-in-the-loop code;
- ``bench/`` imports no test code (tests import benchmark helpers, never the other way);
- no two top-level layers import each other (no circles).

Every import counts, also the ones inside functions: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("edge", "host", "bench", "hil", "firmware", "tests", "scripts")

# What MicroPython (the ESP32 port and the unix port the tests run) can import; ``ulab`` is the
# optional numpy-like C module some firmware builds carry (edge/portable/mfcc.py falls back without it).
MICROPYTHON = {
    "array", "asyncio", "binascii", "builtins", "cmath", "collections", "errno", "gc", "hashlib",
    "heapq", "io", "json", "math", "micropython", "os", "platform", "random", "re", "select",
    "socket", "ssl", "struct", "sys", "time", "uctypes", "zlib", "deflate", "framebuf",
    "machine", "network", "esp", "esp32", "bluetooth", "vfs", "ulab",
}
EDGE_THIRD_PARTY = {"numpy", "cryptography", "ai_edge_litert", "tflite_runtime", "onnxruntime", "tflite_micro",
                    # the Wyoming protocol (edge/wyoming.py, `edgelearn wyoming`): pure Python, the
                    # optional `wyoming` extra; the server runs on the device; zeroconf (same extra):
                    # its mDNS announcement for Home Assistant's discovery (edge/wyoming_mdns.py)
                    "wyoming", "zeroconf",
                    # the base commands' recogniser second stage on a Pi (edge/confirm.py, the
                    # optional `asr` extra): PocketSphinx and its bundled US-English models
                    "pocketsphinx",
                    # the base commands' phrase second stage (edge/phrase_stage.py, the optional
                    # `phrase` extra): TFLite Micro's audio front end, the C code ESPHome runs
                    "pymicro_features"}


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in ``path``, relative imports resolved; ``from a import b``
    gives ``a.b``."""
    rel = path.relative_to(ROOT).with_suffix("")
    package = list(rel.parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name == "__future__":
                continue
            # ``from a import b`` depends on a.b when b is a module and on a otherwise: a.b holds both
            out += [(node.lineno, f"{name}.{a.name}" if name else a.name) for a in node.names]
    return out


def files(top: str):
    return sorted(p for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


def layer(module: str) -> str:
    if module == "edge.portable" or module.startswith("edge.portable."):
        return "edge.portable"
    return module.split(".")[0]


def violations(top: str, allowed) -> list[str]:
    bad = []
    for p in files(top):
        for line, mod in imports(p):
            if not allowed(p, mod):
                bad.append(f"{p.relative_to(ROOT)}:{line} imports {mod}")
    return bad


def test_the_parser_sees_every_kind_of_import(tmp_path, monkeypatch):
    """The checker itself: plain, from, relative and function-level imports are all found."""
    src = "import os\nfrom edge.portable import wire\nfrom . import features\ndef f():\n    import host.serve\n"
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "edge").mkdir()
    target = tmp_path / "edge" / "mod.py"
    target.write_text(src)
    assert [m for _, m in imports(target)] == ["os", "edge.portable.wire", "edge.features", "host.serve"]
    assert layer("edge.portable.wire") == "edge.portable" and layer("edge.features") == "edge"


def test_edge_imports_no_host_bench_hil_or_firmware():
    def ok(p, mod):
        top = mod.split(".")[0]
        if top in PROJECT:
            return top == "edge"
        return top in sys.stdlib_module_names or top in EDGE_THIRD_PARTY

    bad = violations("edge", lambda p, m: ok(p, m) or "portable" in p.parts)
    assert not bad, "edge/ must stay the device runtime (docs/design.md, Layers):\n" + "\n".join(bad)


def test_portable_code_imports_only_itself_and_micropython_modules():
    def ok(p, mod):
        return layer(mod) == "edge.portable" or mod.split(".")[0] in MICROPYTHON

    bad = [v for p in files("edge/portable") for v in
           (f"{p.relative_to(ROOT)}:{line} imports {mod}" for line, mod in imports(p) if not ok(p, mod))]
    assert not bad, "edge/portable/ also runs on MicroPython:\n" + "\n".join(bad)


def test_firmware_imports_only_portable_code_and_micropython_modules():
    def ok(p, mod):
        return layer(mod) in ("edge.portable", "firmware") or mod.split(".")[0] in MICROPYTHON

    bad = violations("firmware", ok)
    assert not bad, "firmware/ is the board's application (host-side build code lives in host/):\n" + "\n".join(bad)


def test_host_imports_no_test_bench_or_hil_code():
    bad = violations("host", lambda p, m: m.split(".")[0] not in ("tests", "bench", "hil", "scripts"))
    assert not bad, "host/ ships in the wheel; test, benchmark and rig code does not:\n" + "\n".join(bad)


def test_bench_imports_no_test_code():
    bad = violations("bench", lambda p, m: m.split(".")[0] != "tests")
    assert not bad, "a benchmark runs without the test tree (its helpers live in bench/):\n" + "\n".join(bad)


@pytest.mark.parametrize("top", ["edge", "host", "firmware"])
def test_shipped_code_imports_no_pytest_or_hypothesis(top):
    bad = violations(top, lambda p, m: m.split(".")[0] not in ("pytest", "hypothesis"))
    assert not bad, "\n".join(bad)


def test_no_two_layers_import_each_other():
    graph = defaultdict(set)
    for top in ("edge", "host", "firmware", "bench", "hil"):
        for p in files(top):
            src = "edge.portable" if top == "edge" and "portable" in p.parts else top
            for _, mod in imports(p):
                dst = layer(mod)
                if dst in PROJECT + ("edge.portable",) and dst != src:
                    graph[src].add(dst)
    circles = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if a in graph.get(b, ())})
    assert not circles, f"layers importing each other: {circles}"
