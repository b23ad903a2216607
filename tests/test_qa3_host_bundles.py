"""Bundles the tools deploy and write (QA pass 3): ``flash`` verifies a bundle directory as it does a .zip;
bundles are written public (umask) and an unreadable one is said as "permission denied"; a shipped
bundle's name works wherever a bundle is opened (``edge.kws.named_bundle``)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bundle_key_helpers import MCU, _default_keys, needs_mcu  # noqa: F401 (an autouse fixture)
from edge import bundle as eb
from edge.cli import main as cli
from edge.errors import BundleError
from edge.kws import DEFAULT_BUNDLE, MODELS
from host.bundle import add_device_mac, build_bundle, sign_bundle, zip_bundle
from host.keys import generate_device_key, generate_keypair

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


# -- 1. flash verifies a directory exactly as a .zip --------------------------------------------------

def _flash(tmp_path, bundle, *extra):
    return cli(["flash", "--port", "pty", "--fs", str(tmp_path / "board"), "--bundle", str(bundle), *extra])


@needs_mcu
@pytest.mark.parametrize("damage", ["flip-weights", "no-signature", "untrusted-key"])
def test_flash_refuses_a_tampered_unsigned_or_untrusted_directory(tmp_path, capsys, damage):
    from host.flash import bundle_source

    d = tmp_path / "mcu"
    shutil.copytree(MCU, d)
    if damage == "flip-weights":
        raw = bytearray((d / "weights.elb").read_bytes())
        raw[100] ^= 1
        (d / "weights.elb").write_bytes(bytes(raw))
        want = "SHA-256 mismatch"
    elif damage == "no-signature":
        (d / "manifest.sig").unlink()
        want = "unsigned"
    else:
        priv, _ = generate_keypair(tmp_path / "keys")
        sign_bundle(d, priv)
        want = "not among the trusted keys"
    with pytest.raises(BundleError, match=want):
        bundle_source(d, tmp_path / "work")
    assert _flash(tmp_path, d) == 2
    err = capsys.readouterr().err
    assert want in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "board").exists()  # refused before any board was opened


@needs_mcu
def test_flash_takes_a_directory_signed_by_a_key_given_with_pubkey(tmp_path):
    from host.flash import bundle_source

    priv, pub = generate_keypair(tmp_path / "keys")
    d = tmp_path / "mcu"
    shutil.copytree(MCU, d)
    sign_bundle(d, priv)
    assert bundle_source(d, tmp_path / "work", [str(pub)]) == d


@needs_mcu
def test_flash_says_what_a_bundle_without_the_board_files_lacks(tmp_path, capsys):
    """A verified bundle the board cannot run (no graph.json, no MicroPython partition, no front end)
    is one sentence, not the deploy's traceback or "rebuild the bundle"."""
    from host.flash import bundle_source

    priv, pub = generate_keypair(tmp_path / "keys")
    m = json.loads((MCU / "manifest.json").read_text())
    base = {k: v for k, v in m.items() if k not in ("files", "format", "format_version", "created_utc")}
    files = {n: MCU / n for n in m["files"]}
    no_graph = build_bundle(tmp_path / "g", {n: p for n, p in files.items() if n != "graph.json"},
                            {**base, "partitions": [{k: v for k, v in p.items() if k != "graph"}
                                                    for p in base["partitions"]]}, priv)
    no_front = build_bundle(tmp_path / "f", files, {**base, "frontend": {}}, priv)
    for d, want in ((no_graph, "has no graph.json"), (no_front, "has no frontend.normalize.scale"),
                    (DEFAULT_BUNDLE, "has no MicroPython partition")):
        with pytest.raises(BundleError, match=want) as e:
            bundle_source(d, tmp_path / "work", [str(pub)])
        assert "kws-mcu-tcnn" in e.value.fix


# -- 2. bundles are public: the umask's modes; unreadable is "permission denied" ---------------------

def _built(where: Path) -> Path:
    """The shipped MCU bundle rebuilt by ``build_bundle`` (signed with a new key) under ``where``."""
    priv, _ = generate_keypair(where / "keys")
    m = json.loads((MCU / "manifest.json").read_text())
    return build_bundle(where / "b", {n: MCU / n for n in m["files"]},
                        {k: v for k, v in m.items() if k not in ("files", "format", "format_version")}, priv)


@needs_mcu
def test_bundles_the_tools_write_follow_the_umask(tmp_path, umask022):
    out = _built(tmp_path)
    priv = tmp_path / "keys" / "edgelearn.key"
    assert _mode(out) == 0o755
    for n in ("manifest.json", "manifest.sig", "weights.elb", "graph.json"):
        assert _mode(out / n) == 0o644, n
    (out / "manifest.sig").chmod(0o600)
    sign_bundle(out, priv)
    assert _mode(out / "manifest.sig") == 0o644
    add_device_mac(out, generate_device_key(tmp_path / "dev"))
    assert _mode(out / "manifest.mac") == 0o644
    assert _mode(zip_bundle(out, tmp_path / "b.zip")) == 0o644
    assert _mode(priv) == 0o600  # keys stay private


def test_an_unreadable_bundle_file_is_permission_denied(tmp_path, monkeypatch):
    d = tmp_path / "b"
    shutil.copytree(DEFAULT_BUNDLE, d)

    def denied(path, *a, **k):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(eb, "open", denied, raising=False)  # as another user meets a 0600 manifest.json
    with pytest.raises(BundleError, match=r"cannot read .*manifest\.json: permission denied"):
        eb.load_bundle(d, trusted_keys=MODELS / "keys")


def _as_nobody(code: str, *args):
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                           "-c", code, *map(str, args)], capture_output=True, text=True, cwd=ROOT, timeout=120)


@needs_mcu
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_another_user_reads_a_bundle_and_is_told_when_it_cannot(umask022):
    probe = _as_nobody("import edge.bundle")
    if probe.returncode != 0:  # the checkout or its venv is not readable by another user (a 0700 clone)
        pytest.skip(f"user nobody cannot import edgelearn here: {probe.stderr.strip().splitlines()[-1:]}")
    top = Path(tempfile.mkdtemp(prefix="qa3-perm-"))  # not under pytest's 0700 tmp: another user must reach it
    try:
        top.chmod(0o755)
        d = _built(top)
        z = zip_bundle(d, top / "b.zip")
        code = ("import sys\nfrom edge.bundle import check_contents\nfrom edge.errors import BundleError\n"
                "try:\n    print(check_contents(sys.argv[1])['model_id'])\n"
                "except BundleError as e:\n    print('ERR', e)\n")
        for path in (d, z):  # written by the tools: readable by a service user
            assert _as_nobody(code, path).stdout.strip() == "kws-mcu-tcnn"
        d.chmod(0o700)
        z.chmod(0o600)
        for path in (d, z):
            out = _as_nobody(code, path).stdout
            assert f"ERR cannot read {path}: permission denied" in out, out
    finally:
        shutil.rmtree(top, ignore_errors=True)


# -- 3. a shipped bundle's name where a bundle is opened ------------------------------------------------

def test_open_bundle_takes_a_shipped_name_outside_a_checkout(tmp_path, monkeypatch):
    from edge.device_models import open_bundle

    monkeypatch.chdir(tmp_path)  # as installed from the wheel: no models/ here
    assert open_bundle("kws-dscnn-s").root == DEFAULT_BUNDLE
    assert open_bundle("models/kws-dscnn-s", state_dir=tmp_path / "st").model_id == "kws-dscnn-s"


def test_aggregator_init_gets_the_shipped_bundle_for_its_name(tmp_path, monkeypatch):
    import host.aggregator.setup as setup

    got = {}

    def fake_init(state, cfg, bundle=None, **kw):
        got["bundle"] = bundle
        return 1

    monkeypatch.setattr(setup, "init_state", fake_init)
    monkeypatch.chdir(tmp_path)
    assert cli(["aggregator", "init", "--state", str(tmp_path / "agg"), "--bundle", "kws-dscnn-s"]) == 0
    assert Path(got["bundle"]) == DEFAULT_BUNDLE


def test_demo_opens_a_shipped_name_and_its_help_names_no_checkout_path(tmp_path, monkeypatch, capsys):
    import host.commands.demo as demo

    class Reached(Exception):
        pass

    def stop():
        raise Reached

    monkeypatch.setattr(demo, "make_clips", stop)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Reached):  # the bundle was found and verified; the demo went on to its clips
        cli(["demo", "--bundle", "kws-dscnn-s", "--no-fleet", "--no-cloud"])
    assert "verified" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli(["demo", "--help"])
    assert "models/" not in capsys.readouterr().out
