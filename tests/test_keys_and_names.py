"""Trusted keys add to the shipped release keys (--pubkey, repeatable; $EDGELEARN_KEYS), and the shipped
bundles' names and .zip files work where a bundle is asked for (spot, serve, flash)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import wave
from pathlib import Path

import numpy as np
import pytest

from edge.errors import BundleError
from edge.kws import DEFAULT_BUNDLE, MODELS, REPO_KEYS
from host.bundle import sign_bundle, zip_bundle
from host.keys import generate_keypair

ROOT = Path(__file__).resolve().parents[1]
MCU = MODELS / "kws-mcu-tcnn"


def cli(*args, env=None, cwd=None, timeout=300):
    e = {k: v for k, v in os.environ.items() if k not in ("EDGELEARN_KEYS", "EDGELEARN_NO_SHIPPED_KEYS")}
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([e["PYTHONPATH"]] if e.get("PYTHONPATH") else []))
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "edge.cli", *map(str, args)], capture_output=True, text=True,
                          env=e, cwd=cwd or ROOT, timeout=timeout)


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    """Two new keys A and B, the shipped model re-signed with each, and a 1 s clip."""
    tmp = tmp_path_factory.mktemp("keys_and_names")
    k = type("Kit", (), {})()
    k.tmp = tmp
    for name in ("a", "b"):
        priv, pub = generate_keypair(tmp / f"keys_{name}", name=name)
        d = tmp / f"bundle_{name}"
        shutil.copytree(DEFAULT_BUNDLE, d)
        sign_bundle(d, priv)
        setattr(k, f"pub_{name}", pub)
        setattr(k, f"bundle_{name}", d)
    k.wav = tmp / "clip.wav"
    with wave.open(str(k.wav), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes((np.random.default_rng(0).normal(0, 300, 16000)).astype("<i2").tobytes())
    return k


def ok(r):
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    return r


def refused(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr
    return r


# --- 1: keys add to the shipped ones -------------------------------------------------------------

def test_pubkey_adds_to_the_shipped_keys(kit):
    # the QA case: --pubkey AGGREGATOR.pub used to drop the shipped key, so the default model was refused
    ok(cli("spot", "--pubkey", kit.pub_a, kit.wav))
    ok(cli("spot", "--bundle", kit.bundle_a, "--pubkey", kit.pub_a, kit.wav))


def test_new_key_and_shipped_bundle_verify_in_one_command(kit):
    from edge.device_models import open_bundle

    assert open_bundle(kit.bundle_a, [kit.pub_a]).key_id == open_bundle(kit.bundle_a, kit.pub_a).key_id
    assert open_bundle(None, [kit.pub_a]).root == DEFAULT_BUNDLE  # the shipped bundle, same keys
    ok(cli("bundle", "verify", kit.bundle_a, "--pubkey", kit.pub_a))
    ok(cli("bundle", "verify", "kws-dscnn-s", "--pubkey", kit.pub_a))


def test_two_pubkeys_both_count(kit):
    for bundle in (kit.bundle_a, kit.bundle_b, DEFAULT_BUNDLE):
        ok(cli("bundle", "verify", bundle, "--pubkey", kit.pub_a, "--pubkey", kit.pub_b))
    # the first of two used to be dropped silently
    ok(cli("spot", "--bundle", kit.bundle_a, "--pubkey", kit.pub_a, "--pubkey", kit.pub_b, kit.wav))


def test_edgelearn_keys_adds_too(kit):
    env = {"EDGELEARN_KEYS": str(kit.pub_a.parent)}
    ok(cli("spot", kit.wav, env=env))                               # shipped bundle, shipped key
    ok(cli("spot", "--bundle", kit.bundle_a, kit.wav, env=env))     # new bundle, key from the env


def test_unknown_key_still_refused_naming_signer_and_sources(kit):
    from edge.keys import load_public_keys

    kid_b = next(iter(load_public_keys(kit.pub_b)))
    r = refused(cli("spot", "--bundle", kit.bundle_b, "--pubkey", kit.pub_a, kit.wav),
                f"signed by key {kid_b}", str(kit.pub_a), str(REPO_KEYS))
    assert len(r.stderr.strip().splitlines()) == 1
    refused(cli("bundle", "verify", kit.bundle_b), f"signed by key {kid_b}", str(REPO_KEYS))


def test_opting_out_of_the_shipped_keys(kit):
    env = {"EDGELEARN_NO_SHIPPED_KEYS": "1"}
    ok(cli("bundle", "verify", kit.bundle_a, "--pubkey", kit.pub_a, env=env))
    refused(cli("bundle", "verify", "kws-dscnn-s", "--pubkey", kit.pub_a, env=env), "not among the trusted keys")
    refused(cli("bundle", "verify", "kws-dscnn-s", env=env), "no trusted public keys", "EDGELEARN_NO_SHIPPED_KEYS")


def test_edgelearn_keys_typo_is_one_sentence(kit):
    refused(cli("spot", kit.wav, env={"EDGELEARN_KEYS": str(kit.tmp / "no-such-dir")}), "EDGELEARN_KEYS=")


def test_resolve_trusted_keys(kit, monkeypatch):
    from edge.kws import resolve_trusted_keys

    monkeypatch.delenv("EDGELEARN_NO_SHIPPED_KEYS", raising=False)
    monkeypatch.setenv("EDGELEARN_KEYS", str(kit.pub_b))
    assert resolve_trusted_keys([kit.pub_a]) == [kit.pub_a, REPO_KEYS]      # --pubkey wins over the env
    assert resolve_trusted_keys(None) == [kit.pub_b, REPO_KEYS]
    monkeypatch.setenv("EDGELEARN_NO_SHIPPED_KEYS", "1")
    assert resolve_trusted_keys(str(kit.pub_a)) == [kit.pub_a]


# --- 2: serve refuses an MCU bundle before it binds ----------------------------------------------

def test_serve_mcu_bundle_is_one_sentence():
    r = refused(cli("serve", "--bundle", "kws-mcu-tcnn", "--port", "0", timeout=120), "no ONNX partition")
    assert "serving" not in r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


# --- 3: shipped names and .zip files for flash and spot ------------------------------------------

@pytest.mark.skipif(not (MCU / "manifest.json").is_file(), reason="MCU bundle not shipped")
def test_spot_names_the_mcu_bundle_and_why_it_cannot_run(kit):
    r = refused(cli("spot", "--bundle", "kws-mcu-tcnn", kit.wav), "kws-mcu-tcnn", "no encoder partition spot can run")
    assert "no such bundle" not in r.stderr


def test_spot_takes_a_shipped_name(kit):
    r = ok(cli("spot", "--bundle", "kws-dscnn-s", "--json", kit.wav, cwd=kit.tmp))
    assert '"label"' in r.stdout


@pytest.mark.skipif(not (MCU / "manifest.json").is_file(), reason="MCU bundle not shipped")
def test_flash_bundle_source_takes_names_and_zips(kit, tmp_path, monkeypatch):
    from host.flash import bundle_source

    monkeypatch.chdir(tmp_path)  # as for a wheel install: no models/ here

    assert bundle_source("kws-mcu-tcnn", tmp_path) == MCU
    assert bundle_source("models/kws-mcu-tcnn", tmp_path) == MCU
    z = zip_bundle(MCU, kit.tmp / "mcu.zip")
    got = bundle_source(z, tmp_path / "w1")
    assert (got / "manifest.json").read_bytes() == (MCU / "manifest.json").read_bytes()
    assert (got / "weights.elb").is_file()
    # a zip signed by a key that is not trusted is refused; given with --pubkey it is taken
    priv, pub = kit.pub_a.with_suffix(".key"), kit.pub_a
    d = kit.tmp / "mcu_a"
    shutil.copytree(MCU, d)
    sign_bundle(d, priv)
    za = zip_bundle(d, kit.tmp / "mcu_a.zip")
    with pytest.raises(BundleError, match="not among the trusted keys"):
        bundle_source(za, tmp_path / "w2")
    assert (bundle_source(za, tmp_path / "w3", [pub]) / "weights.elb").is_file()
    with pytest.raises(BundleError, match="no such bundle directory"):
        bundle_source("no-such-bundle", tmp_path / "w4")


def test_flash_cli_refuses_a_missing_bundle_before_the_board(kit):
    r = refused(cli("flash", "--port", "pty", "--fs", kit.tmp / "board", "--bundle", "no-such-bundle"),
                "no such bundle directory, .zip or shipped bundle", "kws-mcu-tcnn")
    assert not (kit.tmp / "board").exists()


def _micropython():
    try:
        from host.board.unixport import micropython_exe
        return micropython_exe()
    except Exception:  # noqa: BLE001 (no rig: skip)
        return None


@pytest.mark.skipif(not (MCU / "manifest.json").is_file() or _micropython() is None,
                    reason="MCU bundle or MicroPython unix port missing")
@pytest.mark.parametrize("how", ["name", "zip"])
def test_flash_pty_takes_shipped_name_and_zip(kit, how):
    bundle = "kws-mcu-tcnn" if how == "name" else zip_bundle(MCU, Path(tempfile.mkdtemp(dir=kit.tmp)) / "m.zip")
    r = ok(cli("flash", "--port", "pty", "--fs", kit.tmp / f"board_{how}", "--bundle", bundle, cwd=kit.tmp))
    assert "MODEL kws-mcu-tcnn" in r.stdout


def test_resolved_keys_survive_being_passed_on_as_one_string(kit, monkeypatch):
    """Code that hands keys on as one path (an agent's adapt child, a unit file) keeps all of them."""
    from edge.bundle import load_bundle
    from edge.kws import resolve_trusted_keys

    monkeypatch.delenv("EDGELEARN_NO_SHIPPED_KEYS", raising=False)
    joined = str(resolve_trusted_keys([kit.pub_a, kit.pub_b]))
    for bundle in (kit.bundle_a, kit.bundle_b, DEFAULT_BUNDLE):
        assert load_bundle(bundle, trusted_keys=joined).model_id == "kws-dscnn-s"
    monkeypatch.setenv("EDGELEARN_KEYS", os.pathsep.join([str(kit.pub_a), str(kit.pub_b)]))
    assert load_bundle(kit.bundle_b, trusted_keys=resolve_trusted_keys()).model_id == "kws-dscnn-s"


def test_agent_passes_every_pubkey_to_its_adapt_child(kit, tmp_path):
    """`device run --pubkey A --pubkey B`: the agent's adapt child gets both keys (not a list's repr)."""
    import argparse

    from edge.commands import device as cmd
    from edge.keys import load_public_keys

    p = argparse.ArgumentParser()
    cmd.add_arguments(p)
    args = p.parse_args(["run", "--state", str(tmp_path), "--pubkey", str(kit.pub_a), "--pubkey", str(kit.pub_b)])
    keys = cmd._one_or_list(args.pubkey)
    assert set(load_public_keys(str(keys))) == set(load_public_keys([kit.pub_a, kit.pub_b]))
    assert cmd._one_or_list([kit.pub_a]) == kit.pub_a and cmd._one_or_list(None) is None
