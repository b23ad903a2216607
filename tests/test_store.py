"""Device bundle store: install, refuse, smoke check, rollback, and survive SIGKILL mid-install."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from edge.errors import BundleError
from edge.store import BundleStore
from host.bundle import build_bundle, zip_bundle
from host.keys import generate_keypair

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def make(tmp_path):
    priv, pub = generate_keypair(tmp_path / "keys")
    other_priv, _ = generate_keypair(tmp_path / "keys", name="other")

    def make_bundle(version, *, model_id="kws", big=0, key=priv, name=None):
        src = tmp_path / f"src-{model_id}-{version}"
        src.mkdir(exist_ok=True)
        (src / "enc.tflite").write_bytes(f"model {model_id} v{version}".encode() * 100)
        files = {"enc.tflite": src / "enc.tflite"}
        if big:
            (src / "big.bin").write_bytes(os.urandom(big))
            files["big.bin"] = src / "big.bin"
        manifest = {"model_id": model_id, "version": version, "labels": ["yes", "no"],
                    "partitions": [{"name": "encoder", "file": "enc.tflite", "format": "tflite", "placement": "cpu"}]}
        return build_bundle(tmp_path / (name or f"{model_id}-{version}"), files, manifest, key)

    make_bundle.pub, make_bundle.other_priv, make_bundle.tmp = pub, other_priv, tmp_path
    return make_bundle


def tree(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() if p.is_file() else None
            for p in sorted(root.rglob("*")) if p.name != ".lock"}


def test_install_upgrade_rollback(make):
    store = BundleStore(make.tmp / "state", trusted_keys=make.pub)
    assert store.current() is None
    seen = []
    b1 = store.install(make(1), smoke_check=lambda b: seen.append(b.path("enc.tflite").read_bytes()))
    assert b1.version == 1 and seen == [b"model kws v1" * 100]
    assert b1.root == make.tmp / "state" / "bundles" / "kws-v1"
    store.install(zip_bundle(make(2), make.tmp / "kws-2.zip"))  # a .zip installs the same way
    assert store.current().version == 2
    assert store.pointer() == {"current": "kws-v2", "previous": "kws-v1"}
    store.install(make(3))
    assert sorted(p.name for p in store.bundles_dir.iterdir()) == ["kws-v2", "kws-v3"]  # older ones pruned
    assert store.rollback().version == 2
    assert store.current().version == 2 and store.pointer()["previous"] is None
    with pytest.raises(BundleError, match="no previous bundle"):
        store.rollback()
    assert store.install(make(3, name="kws-3b")).version == 3  # re-installing after a rollback works


def test_refusals_change_nothing(make):
    store = BundleStore(make.tmp / "state", trusted_keys=make.pub)
    store.install(make(2))
    before = tree(store.state_dir)
    with pytest.raises(BundleError, match=r"kws v2 is not newer than the installed v2"):
        store.install(make(2, name="again"))
    with pytest.raises(BundleError, match=r"kws v1 is not newer"):
        store.install(make(1))
    with pytest.raises(BundleError, match=r"is model 'other'"):
        store.install(make(5, model_id="other"))
    with pytest.raises(BundleError, match=r"not among the trusted keys"):
        store.install(make(6, key=make.other_priv))

    def broken(b):
        raise RuntimeError("interpreter failed to allocate tensors")
    with pytest.raises(BundleError, match=r"kws v7: smoke check failed \(RuntimeError: interpreter failed"):
        store.install(make(7), smoke_check=broken)
    tampered = make(8)
    (tampered / "enc.tflite").write_bytes(b"X" + (tampered / "enc.tflite").read_bytes()[1:])
    with pytest.raises(BundleError, match=r"enc.tflite: SHA-256 mismatch"):
        store.install(tampered)
    assert tree(store.state_dir) == before
    assert store.current().version == 2
    assert store.install(make(1, name="down"), allow_downgrade=True).version == 1
    assert store.install(make(5, model_id="other"), allow_model_change=True).model_id == "other"


def test_default_smoke_check_runs_the_model(make, tmp_path):
    tflm = pytest.importorskip("tflite_micro", reason="uses the sine model shipped in the tflite-micro package")
    sine = Path(tflm.__file__).parent / "python" / "tflite_micro" / "sine_float.tflite"
    if not sine.is_file():
        pytest.skip("tflite-micro no longer ships sine_float.tflite")
    from edge.store import smoke_check_models

    def bundle_with(model_bytes, version):
        (tmp_path / "m.tflite").write_bytes(model_bytes)
        manifest = {"model_id": "sine", "version": version, "labels": [],
                    "partitions": [{"name": "m", "file": "m.tflite", "format": "tflite", "placement": "cpu"}]}
        return build_bundle(tmp_path / f"sine-{version}", {"m.tflite": tmp_path / "m.tflite"}, manifest,
                            make.tmp / "keys" / "edgelearn.key")

    store = BundleStore(make.tmp / "state", trusted_keys=make.pub)
    assert store.install(bundle_with(sine.read_bytes(), 1), smoke_check=smoke_check_models).version == 1
    # Signed and intact, but not a runnable model: the smoke check keeps v1.
    with pytest.raises(BundleError, match=r"sine v2: smoke check failed \(EdgelearnError: m.tflite: litert cannot load"):
        store.install(bundle_with(b"TFL3" + bytes(200), 2), smoke_check=smoke_check_models)
    assert store.current().version == 1
    with pytest.raises(BundleError, match="no partition with placement npu to run"):
        store.install(make(9, model_id="sine", name="nomodel"), smoke_check=lambda b: smoke_check_models(b, placements=("npu",)))


def test_current_detects_on_disk_corruption(make):
    store = BundleStore(make.tmp / "state", trusted_keys=make.pub)
    store.install(make(1))
    store.install(make(2))
    (store.bundles_dir / "kws-v2" / "enc.tflite").write_bytes(b"flipped bits")
    with pytest.raises(BundleError, match="enc.tflite"):
        store.current()
    assert store.rollback().version == 1


_CHILD = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from edge.store import BundleStore

    state, bundle, pub, stage, ready = sys.argv[1:6]

    def pause():
        Path(ready).write_text(stage)
        time.sleep(600)

    class Paused(BundleStore):
        def _copy_file(self, src, dst):
            if stage == "copy" and src.name == "big.bin":
                with open(src, "rb") as fi, open(dst, "wb") as fo:
                    fo.write(fi.read(1 << 20))
                    fo.flush()
                    pause()
            super()._copy_file(src, dst)

        def _write_pointer(self, current, previous):
            if stage == "pointer":
                pause()
            super()._write_pointer(current, previous)

    store = Paused(state, trusted_keys=pub)
    store.install(bundle, smoke_check=(lambda b: pause()) if stage == "smoke" else None)
""")


@pytest.mark.parametrize("stage", ["copy", "smoke", "pointer"])
def test_sigkill_mid_install_keeps_previous_bundle(make, stage):
    """Kill -9 while copying a large file, during the smoke check, and just before the switch."""
    state = make.tmp / "state"
    store = BundleStore(state, trusted_keys=make.pub)
    store.install(make(1))
    new = make(2, big=6 << 20)
    ready = make.tmp / "ready"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(state), str(new), str(make.pub), stage, str(ready)],
                             cwd=ROOT, env=env, stderr=subprocess.PIPE)
    try:
        for _ in range(1200):  # poll for the child's "I am at the stage" marker
            if ready.exists() or child.poll() is not None:
                break
            time.sleep(0.05)
        assert ready.exists(), f"child never reached {stage}: {child.stderr.read().decode() if child.poll() is not None else ''}"
        if stage == "copy":
            partial = list(state.glob("bundles/.incoming-*/b/big.bin"))
            assert partial and partial[0].stat().st_size == 1 << 20
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    after = BundleStore(state, trusted_keys=make.pub)
    assert after.current().version == 1
    assert json.loads((state / "current").read_text())["current"] == "kws-v1"
    assert not list(after.bundles_dir.glob(".incoming-*")), "start-up removes the interrupted install"
    assert after.install(new).version == 2  # and the same install succeeds afterwards
    assert after.current().path("big.bin").stat().st_size == 6 << 20


def test_disk_full_and_damaged_pointer(make, monkeypatch):
    import errno

    store = BundleStore(make.tmp / "state", trusted_keys=make.pub)
    store.install(make(1))
    before = tree(store.state_dir)

    def full(src, dst):
        dst.write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))
    monkeypatch.setattr(store, "_copy_file", full)
    with pytest.raises(BundleError, match=r"installing kws-2 failed: No space left on device.*previous bundle stays current"):
        store.install(make(2))
    assert tree(store.state_dir) == before and store.current().version == 1
    store.pointer_path.write_text("{not json")
    with pytest.raises(BundleError, match=r"current: unreadable.*install a bundle again"):
        store.current()
