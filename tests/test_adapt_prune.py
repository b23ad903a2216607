"""The adapt store prunes old versions after each commit (it kept every version for ever: a
long-running agent adapts every so often). Each context keeps its current version, the one rollback
goes to, its newest ``KEEP_VERSIONS`` and any version something names (``agent.json``'s running
model, the calibration's); a kill during the pruning leaves every version whole or gone, and the
store reads, rolls back and commits as before.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from devstate_helpers import make_data, make_sysfs, run_device

from edge.adapt.store import AdaptStore
from edge.errors import EdgelearnError

ROOT = Path(__file__).resolve().parents[1]


def adapt_args(w, state, *more):
    return ["adapt", "--state", state, "--data", w["data"], "--sysfs-root", w["sysfs"], "--steps", "3", *more]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """One real adapted version (``device adapt``), to copy into long histories."""
    base = tmp_path_factory.mktemp("prune")
    w = {"data": make_data(base / "data"), "sysfs": make_sysfs(base / "sysfs"), "base": base}
    st = base / "first"
    assert json.loads(run_device(adapt_args(w, st)))["version"] == 1
    w["first"] = st
    return w


def history(w, st: Path, contexts: dict) -> Path:
    """A state whose contexts ({name: (n versions on disk, current, previous)}) were adapted n times."""
    shutil.copytree(w["first"], st)
    meta = json.loads((st / "adapt" / "active.json").read_text())
    one = (st / "adapt" / "default" / "v1.npz").read_bytes()
    for name, (n, cur, prev) in contexts.items():
        (st / "adapt" / name).mkdir(exist_ok=True)
        for v in range(1, n + 1):
            (st / "adapt" / name / f"v{v}.npz").write_bytes(one)
        meta["contexts"][name] = {"current": cur, "previous": prev}
    meta["active"] = "default"
    (st / "adapt" / "active.json").write_text(json.dumps(meta))
    return st


def on_disk(st: Path, context: str) -> list[int]:
    return sorted(int(p.stem[1:]) for p in (st / "adapt" / context).glob("v*.npz"))


def bundle():
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, default_trusted_keys

    return load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys())


def test_a_commit_keeps_current_previous_the_newest_and_what_is_named(world, tmp_path):
    # default: adapted 14 times, then rolled back to v3 (rollback goes to `previous` only)
    st = history(world, tmp_path / "st", {"default": (14, 3, None), "kitchen": (12, 12, 11)})
    running = {"context": "default", "context_version": 2}
    (st / "agent.json").write_text(json.dumps({"state": "ended", "model": running}))
    (st / "operating.json").write_text(json.dumps({"for": {"context": "kitchen", "context_version": 1}}))
    res = json.loads(run_device(adapt_args(world, st)))
    assert res["status"] == "done" and res["version"] == 15
    # newest 10 (6..15), the current (15), the one rollback goes to (3), the agent's running model (2)
    assert on_disk(st, "default") == [2, 3] + list(range(6, 16))
    # another context: its newest 10 (3..12, current and previous among them), the calibration's (1)
    assert on_disk(st, "kitchen") == [1] + list(range(3, 13))
    status = json.loads(run_device(["status", "--state", st]))
    assert status["adapt"]["contexts"]["default"] == {"current": 15, "previous": 3}
    assert status["detection"]["context_version"] == 15
    assert json.loads(run_device(adapt_args(world, st, "--rollback")))["version"] == 3
    store = AdaptStore(st, bundle())
    assert store.current("default") == 3 and store.load("default")  # the version rollback went to, whole
    assert store.versions("default") == on_disk(st, "default")
    res = json.loads(run_device(adapt_args(world, st)))  # numbering goes on after the newest kept
    assert res["version"] == 16 and on_disk(st, "default") == [2, 3] + list(range(7, 17))


def test_keep_is_a_setting_of_the_store(world, tmp_path):
    from edge.adapt.store import KEEP_VERSIONS

    assert KEEP_VERSIONS == 10  # (the first test's numbers)
    st = history(world, tmp_path / "st", {"default": (6, 6, 5)})
    b = bundle()
    for bad in (0, -1, True, 2.5, "3"):
        with pytest.raises(EdgelearnError, match="--keep-versions .* is not a (whole number|number of versions)"):
            AdaptStore(st, b, keep=bad)
    store = AdaptStore(st, b, keep=3)
    assert store.prune() == [st / "adapt" / "default" / f"v{v}.npz" for v in (1, 2, 3)]
    assert on_disk(st, "default") == [4, 5, 6]
    delta = store.load("default")
    assert store.save("default", delta) == 7 and on_disk(st, "default") == [5, 6, 7]
    assert AdaptStore(st, b, keep=1).prune() == [st / "adapt" / "default" / "v5.npz"]  # 6: previous
    assert on_disk(st, "default") == [6, 7]


# --- a kill in the middle of pruning ---------------------------------------------------------------

DRIVER = r"""
import os, re, sys
from pathlib import Path
k, stage = int(sys.argv[1]), sys.argv[2]
n = [0]
VERSION = re.compile(r"^v\d+\.npz$")

def hook(event, path):
    p = Path(path)
    if not VERSION.match(p.name):
        return
    # a removal: the version is there when it begins and gone when it is done (a commit's rename
    # of a new version is the other way round)
    removing = p.exists() if event == "begin" else (event == "done" and not p.exists())
    if not removing:
        return
    if event == "begin":
        n[0] += 1
    if n[0] == k and event == stage:
        os._exit(137)

import edge.atomic as A
A.fault_hook = hook
from edge.cli import main
sys.exit(main(sys.argv[3:]))
"""


def killed(w, st, k, stage) -> bool:
    r = subprocess.run([sys.executable, "-c", DRIVER, str(k), stage, "device", *map(str, adapt_args(w, st))],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode in (0, 137), r.stderr
    return r.returncode == 137


@pytest.mark.parametrize("stage", ["begin", "done"])
def test_a_kill_while_pruning_leaves_each_version_whole_or_gone(world, tmp_path, stage):
    from edge.adapt.delta import check_delta, delta_shapes, npz_arrays, npz_info

    b = bundle()
    shapes = delta_shapes(b)
    whole = (world["first"] / "adapt" / "default" / "v1.npz").read_bytes()
    for k in (1, 2, 3):  # v13's commit prunes v1, v2 and v3: killed at each removal
        st = history(world, tmp_path / f"k{k}", {"default": (12, 12, 11)})
        assert killed(world, st, k, stage), f"removal {k} never happened"
        left = on_disk(st, "default")
        assert left == list(range(k + (stage == "done"), 14)), left
        for v in left[:-1]:  # whole: byte for byte what was there, and readable
            p = st / "adapt" / "default" / f"v{v}.npz"
            assert p.read_bytes() == whole
            arrays = npz_arrays(p)
            npz_info(arrays)  # (takes the run record out, as the store reads it)
            check_delta(arrays, shapes)
        assert not [p for p in (st / "adapt").rglob("*") if p.name.startswith(".") and p.name != ".lock"]
        # the commit stands (it came before the pruning); the store reads, lists and rolls back
        status = json.loads(run_device(["status", "--state", st]))
        assert status["adapt"]["contexts"]["default"] == {"current": 13, "previous": 12}
        assert "error" not in status["detection"] and status["detection"]["context_version"] == 13
        assert json.loads(run_device(adapt_args(world, st, "--rollback")))["version"] == 12
        assert AdaptStore(st, b).load("default")
        # the next commit prunes what the killed one left
        assert json.loads(run_device(adapt_args(world, st)))["version"] == 14
        assert on_disk(st, "default") == list(range(5, 15))  # 12, now previous, among the newest


def test_keep_versions_from_the_cli_and_the_agents_child(world, tmp_path):
    """``device adapt --keep-versions N`` (and ``Device.adapt(keep_versions=N)``, which the agent's
    ``device run --keep-versions N`` passes to its adaptation child) keeps the newest N besides the
    current and previous ones; 0 is argparse's one-line error and changes nothing."""
    from edge.agent import AgentConfig
    from edge.agent_unit import unit_options

    st = history(world, tmp_path / "st", {"default": (8, 8, 7)})
    res = subprocess.run([sys.executable, "-m", "edge.cli", "device", *adapt_args(world, st, "--keep-versions", "0")],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 2 and "--keep-versions: 0 is not a number of versions" in res.stderr, res.stderr
    assert on_disk(st, "default") == list(range(1, 9))
    res = json.loads(run_device(adapt_args(world, st, "--keep-versions", "2")))
    assert res["status"] == "done" and res["version"] == 9
    assert on_disk(st, "default") == [8, 9]  # the newest 2: the current (9) and the previous (8)
    cfg = AgentConfig(source="mic", data=Path("d"), keep_versions=3)
    assert "--keep-versions 3" in " ".join(unit_options(cfg))
    from types import SimpleNamespace

    from edge.agent_adapt import Adaptation

    agent = SimpleNamespace(state_dir=st, cfg=cfg, backend="auto", sysfs_root=Path("/"), trusted_keys=None,
                            device=SimpleNamespace(bundle=None))
    cmd = Adaptation._adapt_cmd(agent)  # the agent's adaptation child
    assert cmd[cmd.index("--keep-versions") + 1] == "3"
