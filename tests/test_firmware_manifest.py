"""The deploy manifest (firmware/manifest.py) and the freeze manifest (firmware/manifest_freeze.py) agree."""

from __future__ import annotations

from pathlib import Path

from firmware import manifest

ROOT = Path(__file__).resolve().parents[1]


def test_freeze_manifest_lists_the_deployed_modules_and_they_exist():
    calls = []
    env = {"include": lambda p: calls.append(("include", p)),
           "package": lambda name, files=None, base_path=".", opt=None: calls.append(("package", name, files, base_path)),
           "module": lambda *a, **k: calls.append(("module", a))}
    exec(compile((ROOT / "firmware" / "manifest_freeze.py").read_text(), "manifest_freeze.py", "exec"), env)
    assert env["PORTABLE"] == manifest.PORTABLE and env["FIRMWARE"] == manifest.FIRMWARE
    assert calls[0] == ("include", "$(PORT_DIR)/boards/manifest.py")
    for _, name, files, base in [c for c in calls if c[0] == "package"]:
        for f in files:
            assert (ROOT / "firmware" / base / name / f).is_file(), f
    frozen = {f"{name}/{f}" for _, name, files, _ in [c for c in calls if c[0] == "package"] for f in files}
    deployed = {f"edge/portable/{n}.py" for n in manifest.PORTABLE} | {f"firmware/{n}.py" for n in manifest.FIRMWARE}
    assert deployed <= frozen
