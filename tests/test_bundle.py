"""Bundles: build, sign, verify, zip; every tampering is refused with its documented error and no disk change."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from edge.bundle import MAC, MANIFEST, SIGNATURE, check_contents, load_bundle
from edge.errors import BundleError
from host import bundle as hb
from host.keys import generate_device_key, generate_keypair, sign_manifest_bytes

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def env(tmp_path, monkeypatch):
    """Keys, two source files, a built bundle; temp dirs go under tmp_path so leaks are visible."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    priv, pub = generate_keypair(tmp_path / "keys")
    other_priv, other_pub = generate_keypair(tmp_path / "other", name="other")
    src = tmp_path / "src"
    src.mkdir()
    (src / "enc.tflite").write_bytes(os.urandom(3000))
    (src / "neg.npy").write_bytes(os.urandom(500))
    manifest = {"model_id": "kws-test", "version": 2, "labels": ["yes", "no", "_unknown_"],
                "frontend": {"sample_rate": 16000, "normalize": {"mean": 0.0, "std": 1.0}},
                "target": "rpi4",
                "partitions": [{"name": "encoder", "file": "enc.tflite", "format": "tflite",
                                "placement": "cpu", "precision": "int8", "inputs": [], "outputs": []}]}
    files = {"enc.tflite": src / "enc.tflite", "banks/neg.npy": src / "neg.npy"}
    out = hb.build_bundle(tmp_path / "bundle", files, manifest, priv)

    class E:
        pass
    e = E()
    e.__dict__.update(tmp=tmp_path, priv=priv, pub=pub, other_priv=other_priv, other_pub=other_pub,
                      src=src, manifest=manifest, files=files, bundle=out, scratch=scratch)
    return e


def snapshot(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None, p.stat().st_mode)
            for p in sorted(root.rglob("*"))}


def refused(path, match, root, **kw):
    """load_bundle must raise a BundleError matching `match` and leave everything under root as it was."""
    before = snapshot(root)
    with pytest.raises(BundleError, match=match):
        load_bundle(path, **kw)
    assert snapshot(root) == before


def resign(bundle: Path, manifest: dict, priv) -> None:
    raw = json.dumps(manifest).encode()
    (bundle / MANIFEST).write_bytes(raw)
    (bundle / SIGNATURE).write_text(sign_manifest_bytes(raw, priv))


def test_build_and_load_directory_and_zip(env):
    b = load_bundle(env.bundle, trusted_keys=env.pub)
    assert (b.model_id, b.version, b.labels) == ("kws-test", 2, ["yes", "no", "_unknown_"])
    assert b.path("enc.tflite").read_bytes() == (env.src / "enc.tflite").read_bytes()
    assert b.partition("encoder")["precision"] == "int8"
    m = b.manifest
    assert m["format"] == "edgelearn-bundle" and m["format_version"] == 1 and m["created_utc"].endswith("Z")
    assert set(m["files"]) == {"enc.tflite", "banks/neg.npy"} and m["files"]["banks/neg.npy"]["bytes"] == 500
    assert m["frontend"]["normalize"] == {"mean": 0.0, "std": 1.0}
    with pytest.raises(BundleError, match="no partition 'decoder'"):
        b.partition("decoder")
    with pytest.raises(BundleError, match="not a file of bundle"):
        b.path("../etc/passwd")
    z = hb.zip_bundle(env.bundle, env.tmp / "b.zip")
    bz = load_bundle(z, trusted_keys=env.tmp / "keys")  # a directory of .pub files works too
    assert bz.root != env.bundle and bz.path("banks/neg.npy").read_bytes() == (env.src / "neg.npy").read_bytes()
    root = bz.root
    del bz, b
    import gc
    gc.collect()
    assert not root.exists(), "the temp extraction of a zip is removed with the Bundle"
    assert zipfile.ZipFile(z).namelist()[0] != "bundle/manifest.json"


def test_zip_with_one_top_level_folder_is_accepted(env):
    z = env.tmp / "folder.zip"
    with zipfile.ZipFile(z, "w") as zf:
        for p in sorted(env.bundle.rglob("*")):
            if p.is_file():
                zf.write(p, "kws/" + p.relative_to(env.bundle).as_posix())
    assert load_bundle(z, trusted_keys=env.pub).version == 2


@pytest.mark.parametrize("as_zip", [False, True])
def test_tampered_byte_is_a_digest_mismatch(env, as_zip):
    p = env.bundle / "enc.tflite"
    data = bytearray(p.read_bytes())
    data[1234] ^= 0x01
    p.write_bytes(bytes(data))
    target = env.bundle
    if as_zip:
        target = env.tmp / "t.zip"
        with zipfile.ZipFile(target, "w") as zf:
            for f in sorted(env.bundle.rglob("*")):
                if f.is_file():
                    zf.write(f, f.relative_to(env.bundle).as_posix())
    refused(target, r"enc.tflite: SHA-256 mismatch \(bundle changed after signing\); re-download", env.tmp,
            trusted_keys=env.pub)


def test_truncated_file_is_a_size_mismatch(env):
    p = env.bundle / "banks" / "neg.npy"
    p.write_bytes(p.read_bytes()[:-1])
    refused(env.bundle, r"banks/neg.npy: 499 bytes, manifest says 500", env.tmp, trusted_keys=env.pub)


def test_missing_and_extra_files(env):
    (env.bundle / "banks" / "neg.npy").unlink()
    refused(env.bundle, r"banks/neg.npy: listed in manifest.json but missing", env.tmp, trusted_keys=env.pub)
    env2 = hb.build_bundle(env.tmp / "b2", env.files, env.manifest, env.priv)
    (env2 / "evil.py").write_text("print('hi')")
    refused(env2, r"evil.py: in the bundle but not listed", env.tmp, trusted_keys=env.pub)


def test_wrong_key_and_unsigned(env):
    refused(env.bundle, r"signed by key [0-9a-f]{16}, which is not among the trusted keys", env.tmp,
            trusted_keys=env.other_pub)
    refused(env.bundle, r"no trusted public keys given", env.tmp)
    with pytest.warns(UserWarning, match="signature NOT checked"):
        assert load_bundle(env.bundle, allow_unsigned=True).key_id is None
    # allow_unsigned never excuses a signature that is present and wrong
    refused(env.bundle, r"not among the trusted keys", env.tmp, trusted_keys=env.other_pub, allow_unsigned=True)
    refused(env.bundle, r"is a private key", env.tmp, trusted_keys=env.priv)
    (env.bundle / SIGNATURE).unlink()
    refused(env.bundle, r"manifest.sig: missing, the bundle is unsigned", env.tmp, trusted_keys=env.pub)
    with pytest.warns(UserWarning, match="UNSIGNED"):
        b = load_bundle(env.bundle, allow_unsigned=True)
    assert b.key_id is None and b.authenticated_by == "unsigned"


def test_signature_from_other_key_with_forged_key_id(env):
    # Signed by an untrusted key but labelled with the trusted key's id.
    raw = (env.bundle / MANIFEST).read_bytes()
    good_id = (env.bundle / SIGNATURE).read_text().split()[1]
    forged = sign_manifest_bytes(raw, env.other_priv).split()
    (env.bundle / SIGNATURE).write_text(f"{forged[0]} {good_id} {forged[2]}\n")
    refused(env.bundle, r"signature does not match manifest.json", env.tmp, trusted_keys=env.pub)


def test_edited_manifest_breaks_signature(env):
    m = json.loads((env.bundle / MANIFEST).read_text())
    m["version"] = 99
    (env.bundle / MANIFEST).write_text(json.dumps(m))
    refused(env.bundle, r"manifest.sig: signature does not match manifest.json \(manifest changed after signing\)",
            env.tmp, trusted_keys=env.pub)


def test_corrupt_manifest_json(env):
    raw = (env.bundle / MANIFEST).read_bytes()
    (env.bundle / MANIFEST).write_bytes(raw[: len(raw) // 2])
    # authenticated before it is parsed: a cut manifest fails its signature first
    refused(env.bundle, r"manifest.sig: signature does not match", env.tmp, trusted_keys=env.pub)
    with pytest.raises(BundleError, match=r"manifest.json: not valid JSON"):
        check_contents(env.bundle)


@pytest.mark.parametrize("fv, match", [(0, "format version 0 is older than the supported version 1"),
                                       (2, "format version 2 is newer than this runtime supports"),
                                       ("1", "format_version '1' is not an integer")])
def test_format_version(env, fv, match):
    m = json.loads((env.bundle / MANIFEST).read_text())
    m["format_version"] = fv
    resign(env.bundle, m, env.priv)
    refused(env.bundle, match, env.tmp, trusted_keys=env.pub)


@pytest.mark.parametrize("name", ["../escape.bin", "/etc/passwd", "a/../../b", "a\\b", "C:x", "a//b", "./a"])
def test_path_traversal_in_manifest(env, name):
    m = json.loads((env.bundle / MANIFEST).read_text())
    m["files"][name] = {"sha256": "0" * 64, "bytes": 1}
    resign(env.bundle, m, env.priv)
    refused(env.bundle, r"unsafe file name", env.tmp, trusted_keys=env.pub)


def test_zip_slip_entries_are_refused(env):
    for bad in ("../evil.txt", "/abs.txt"):
        z = env.tmp / "slip.zip"
        with zipfile.ZipFile(z, "w") as zf:
            for f in sorted(env.bundle.rglob("*")):
                if f.is_file():
                    zf.write(f, f.relative_to(env.bundle).as_posix())
            zf.writestr(bad, b"pwned")
        refused(z, r"unsafe file name", env.tmp, trusted_keys=env.pub)
        assert not (env.tmp / "evil.txt").exists()
        z.unlink()
    z = env.tmp / "link.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr(MANIFEST, (env.bundle / MANIFEST).read_bytes())
        info = zipfile.ZipInfo("enc.tflite")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, "/etc/passwd")
    refused(z, r"is a symbolic link", env.tmp, trusted_keys=env.pub)


def test_symlink_in_directory_is_refused(env):
    (env.bundle / "enc.tflite").unlink()
    (env.bundle / "enc.tflite").symlink_to(env.src / "enc.tflite")
    refused(env.bundle, r"enc.tflite: is a symbolic link", env.tmp, trusted_keys=env.pub)


def test_not_a_bundle_and_bad_zip(env):
    refused(env.tmp / "nope", r"no such bundle", env.tmp, trusted_keys=env.pub)
    (env.tmp / "junk.zip").write_bytes(b"PK\x03\x04 not really")
    refused(env.tmp / "junk.zip", r"not a readable zip", env.tmp, trusted_keys=env.pub)
    refused(env.src, r"no manifest.json", env.tmp, trusted_keys=env.pub)


def test_schema_errors(env):
    original = (env.bundle / MANIFEST).read_text()
    for key, value, match in [("model_id", "../x", "model_id"), ("version", True, "version"),
                              ("labels", "yes", "labels"), ("partitions", [{"name": "e", "file": "nope.tflite",
                               "format": "tflite", "placement": "cpu"}], "not in files")]:
        m = json.loads(original)
        m[key] = value
        resign(env.bundle, m, env.priv)
        refused(env.bundle, match, env.tmp, trusted_keys=env.pub)


def test_device_mac_scheme(env):
    dev = generate_device_key(env.tmp / "dev")
    dev2 = generate_device_key(env.tmp / "dev", name="other")
    assert stat.S_IMODE(dev.stat().st_mode) == 0o600
    kid = hb.add_device_mac(env.bundle, dev)
    b = load_bundle(env.bundle, device_key=dev)
    assert b.authenticated_by == "hmac-sha256" and b.key_id == kid
    assert load_bundle(env.bundle, trusted_keys=env.pub).version == 2  # the signature still holds
    refused(env.bundle, r"manifest.mac: made for device key", env.tmp, device_key=dev2)
    text = (env.bundle / MAC).read_text().split()
    text[2] = ("0" if text[2][0] != "0" else "1") + text[2][1:]
    (env.bundle / MAC).write_text(" ".join(text) + "\n")
    refused(env.bundle, r"manifest.mac: HMAC does not match", env.tmp, device_key=dev)
    (env.bundle / MAC).write_text(f"{text[0]} {text[1]} é{text[2][1:]}\n")  # non-ASCII garbage, same error
    refused(env.bundle, r"manifest.mac: HMAC does not match", env.tmp, device_key=dev)
    (env.bundle / MAC).unlink()
    refused(env.bundle, r"manifest.mac: missing", env.tmp, device_key=dev)


def test_build_replaces_existing_and_refuses_bad_input(env):
    m2 = dict(env.manifest, version=3)
    hb.build_bundle(env.bundle, env.files, m2, env.priv)
    assert load_bundle(env.bundle, trusted_keys=env.pub).version == 3
    assert [p.name for p in env.bundle.parent.iterdir() if p.name.startswith(".bundle")] == []
    before = snapshot(env.tmp)
    with pytest.raises(BundleError, match="is a private or device key"):
        hb.build_bundle(env.tmp / "x", {"k": env.priv}, env.manifest, env.priv)
    with pytest.raises(BundleError, match="unsafe file name"):
        hb.build_bundle(env.tmp / "x", {"../k": env.src / "neg.npy"}, env.manifest, env.priv)
    with pytest.raises(BundleError, match="placement"):
        bad = dict(env.manifest, partitions=[dict(env.manifest["partitions"][0], placement="gpu")])
        hb.build_bundle(env.bundle, env.files, bad, env.priv)
    with pytest.raises(BundleError, match="exists and is not a bundle"):
        hb.build_bundle(env.src, env.files, env.manifest, env.priv)
    with pytest.raises(BundleError, match="not plain JSON"):
        hb.build_bundle(env.tmp / "x", env.files, dict(env.manifest, extra={"x": float("nan")}), env.priv)
    with pytest.raises(BundleError, match="is a public key"):
        hb.build_bundle(env.tmp / "x", env.files, env.manifest, env.pub)
    assert snapshot(env.tmp) == before


def test_sign_refresh_after_intentional_edit(env):
    (env.bundle / "banks" / "neg.npy").write_bytes(b"new bank")
    with pytest.raises(BundleError, match="banks/neg.npy: 8 bytes"):
        hb.sign_bundle(env.bundle, env.priv)
    kid = hb.sign_bundle(env.bundle, env.other_priv, refresh=True)
    b = load_bundle(env.bundle, trusted_keys=[env.pub, env.other_pub])
    assert b.key_id == kid and b.manifest["files"]["banks/neg.npy"]["bytes"] == 8


def test_keygen_modes_and_no_overwrite(env):
    assert stat.S_IMODE(env.priv.stat().st_mode) == 0o600
    assert env.priv.read_text().startswith("edgelearn-ed25519-private ")
    assert env.pub.read_text().startswith("edgelearn-ed25519-public ")
    before = env.priv.read_bytes()
    with pytest.raises(BundleError, match="already exists"):
        generate_keypair(env.tmp / "keys")
    assert env.priv.read_bytes() == before
    assert "PRIVATE" not in json.dumps(check_contents(env.bundle))


def cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "edge.cli", "bundle", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd)


def test_cli(env):
    r = cli("keygen", "--out", env.tmp / "clikeys")
    assert r.returncode == 0 and (env.tmp / "clikeys" / "edgelearn.key").exists(), r.stderr
    r = cli("verify", env.bundle, "--pubkey", env.pub)
    assert r.returncode == 0 and "OK kws-test v2" in r.stdout, r.stderr
    r = cli("verify", env.bundle, "--pubkey", env.tmp / "clikeys" / "edgelearn.pub")
    assert r.returncode == 2 and "not among the trusted keys" in r.stderr and "Traceback" not in r.stderr
    r = cli("inspect", env.bundle, "--json")
    s = json.loads(r.stdout)
    assert s["partitions"][0] == {"name": "encoder", "file": "enc.tflite", "format": "tflite", "placement": "cpu",
                                  "precision": "int8", "bytes": 3000}
    assert s["total_bytes"] == 3500 and s["signature"]["verified"] is False
    r = cli("inspect", env.bundle, "--pubkey", env.pub)
    assert "kws-test" in r.stdout and "verified" in r.stdout and "3500 bytes" in r.stdout
    r = cli("zip", env.bundle, "--out", env.tmp / "c.zip")
    assert r.returncode == 0 and load_bundle(env.tmp / "c.zip", trusted_keys=env.pub).version == 2
    r = cli("sign", env.bundle, "--key", env.tmp / "clikeys" / "edgelearn.key")
    assert r.returncode == 0
    assert cli("verify", env.bundle, "--pubkey", env.tmp / "clikeys").returncode == 0


def test_cli_device_key_flow(env):
    r = cli("keygen", "--device", "--out", env.tmp / "dev", "--name", "esp32-01")
    key = env.tmp / "dev" / "esp32-01.hmac"
    assert r.returncode == 0 and stat.S_IMODE(key.stat().st_mode) == 0o600, r.stderr
    assert cli("sign", env.bundle, "--device-key", key).returncode == 0
    r = cli("verify", env.bundle, "--device-key", key)
    assert r.returncode == 0 and "hmac-sha256" in r.stdout, r.stderr
    r = cli("verify", env.bundle)  # no key given: the keys spot and device trust, which did not sign it
    assert r.returncode == 2 and "not among the trusted keys" in r.stderr
    r = cli("sign", env.bundle)
    assert r.returncode == 2 and "nothing to sign with" in r.stderr
    # Re-signing with a refreshed file table invalidates the MAC, so it is removed rather than left stale.
    hb.sign_bundle(env.bundle, env.priv, refresh=True)
    assert not (env.bundle / MAC).exists()


def test_zip_duplicate_entries_and_existing_extract_target(env):
    z = env.tmp / "dup.zip"
    with zipfile.ZipFile(z, "w") as zf:
        for f in sorted(env.bundle.rglob("*")):
            if f.is_file():
                zf.write(f, f.relative_to(env.bundle).as_posix())
        with pytest.warns(UserWarning, match="Duplicate name"):
            zf.writestr("enc.tflite", b"shadow copy")
    refused(z, r"enc.tflite appears twice", env.tmp, trusted_keys=env.pub)
    good = hb.zip_bundle(env.bundle, env.tmp / "good.zip")
    refused(good, r"already exists", env.tmp, trusted_keys=env.pub, extract_to=env.src)
    b = load_bundle(good, trusted_keys=env.pub, extract_to=env.tmp / "unz")
    assert b.root == env.tmp / "unz" and load_bundle(b.root, trusted_keys=env.pub).version == 2


def test_oversized_zip_entry_stops_at_declared_size(env):
    # An entry whose data is larger than the manifest says is refused without extracting all of it.
    big = env.tmp / "big"
    big.mkdir()
    m = json.loads((env.bundle / MANIFEST).read_text())
    (big / "enc.tflite").write_bytes(b"\0" * (4 << 20))
    for n in m["files"]:
        if n != "enc.tflite":
            (big / n).parent.mkdir(parents=True, exist_ok=True)
            (big / n).write_bytes((env.bundle / n).read_bytes())
    (big / MANIFEST).write_bytes((env.bundle / MANIFEST).read_bytes())
    (big / SIGNATURE).write_bytes((env.bundle / SIGNATURE).read_bytes())
    z = env.tmp / "bomb.zip"
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(big.rglob("*")):
            if f.is_file():
                zf.write(f, f.relative_to(big).as_posix())
    refused(z, r"enc.tflite: 4194304 bytes, manifest says 3000", env.tmp, trusted_keys=env.pub)


def test_check_name_never_lets_a_path_escape(tmp_path):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from edge.bundle import check_name

    root = (tmp_path / "bundle").resolve()
    parts = st.sampled_from(["..", ".", "", "a", "b.tflite", "/", "\\", "C:", "\x00", "é", "..a", " "])

    @settings(max_examples=400, deadline=None)
    @given(st.lists(parts, min_size=1, max_size=6).map("".join) | st.text(max_size=20))
    def prop(name):
        try:
            check_name(name)
        except BundleError:
            return
        resolved = (root / name).resolve()
        assert resolved != root and root in resolved.parents, name

    prop()
