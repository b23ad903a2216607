"""Build, sign, authenticate and package model bundles; ``edgelearn bundle``
(``host/commands/bundle.py``) runs them.

    >>> from host.bundle import build_bundle
    >>> build_bundle("out/kws", {"encoder_int8.tflite": Path("enc.tflite")},
    ...              {"model_id": "kws-dscnn-s", "version": 3, "labels": ["yes", "no"],
    ...               "partitions": [{"name": "encoder", "file": "encoder_int8.tflite", "format": "tflite",
    ...                               "placement": "cpu", "precision": "int8"}]},
    ...              private_key_path="keys/release.key")
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
from datetime import datetime, timezone
from pathlib import Path

from edge import bundle as eb
from edge.atomic import _umask, atomic_file, atomic_write, replace_dir
from edge.errors import BundleError
from host import keys as hk

_DEFAULTS = {"frontend": {}, "target": None, "partitions": [], "trainable": {}, "quantization": {}, "extra": {}}
# Bundles are public by design (docs/faults.md): what the tools write follows the umask (0755 directories,
# 0644 files under umask 022), so a service user running the agent can read a bundle its operator built.
# Only keys and device state are 0600. ``atomic_write``'s default is 0600, hence ``mode=PUBLIC`` below.
PUBLIC = None


def public_dir(path: Path) -> Path:
    """Give a directory made by ``tempfile.mkdtemp`` (always 0700) the mode a plain ``mkdir`` would."""
    os.chmod(path, 0o777 & ~_umask())
    return path


def bundle_arg(value=None) -> Path:
    """The bundle a user named: the shipped bundle when ``value`` is None, else ``value`` or the shipped
    bundle of that name (``edge.kws.named_bundle``: ``kws-dscnn-s`` works outside a checkout)."""
    from edge.kws import DEFAULT_BUNDLE, named_bundle

    return DEFAULT_BUNDLE if value is None else named_bundle(value)


def manifest_bytes(manifest: dict) -> bytes:
    """The canonical serialisation: sorted keys, 2-space indent, UTF-8, trailing newline."""
    try:
        return (json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n").encode()
    except (TypeError, ValueError) as e:
        raise BundleError(f"manifest is not plain JSON ({e})", fix="use str/int/float/list/dict values, no NaN") from None


def _file_entry(path: Path) -> dict:
    with open(path, "rb") as f:
        digest, n = eb._hash_stream(f)
    return {"sha256": digest, "bytes": n}


def _check_inputs(files: dict) -> dict:
    out = {}
    for name, src in files.items():
        eb.check_name(name, "build_bundle files")
        if name in eb.META_FILES:
            raise BundleError(f"{name}: reserved for the bundle's own metadata", fix="rename the file")
        src = Path(src)
        if not src.is_file():
            raise BundleError(f"{src}: not found (for bundle file {name})", fix="produce the file first")
        if hk.is_private_key_file(src):
            raise BundleError(f"{src}: is a private or device key", fix="never put secret keys into a bundle")
        out[name] = src
    return out


def check_models_match_labels(manifest: dict, file_paths: dict) -> None:
    """At sign time: each declared class output (role probs/logits) of a model that loads here
    has one value per label. The manifest's own declarations are checked by
    ``edge.bundle.check_labels``; this opens the models themselves, so a manifest whose
    labels and declared shapes agree but whose model disagrees is not signed either.
    A model no installed backend can load is left to the device's smoke check."""
    from edge.backends import load
    from edge.errors import EdgelearnError

    eb.check_labels(manifest)
    n = len(manifest["labels"])
    for p in manifest["partitions"]:
        declared = {t.get("name") for t in p.get("outputs", []) if t.get("role") in eb.CLASS_ROLES}
        if not declared or p["format"] not in ("tflite", "onnx"):
            continue
        try:
            model = load(Path(file_paths[p["file"]]), num_threads=1)
        except EdgelearnError:
            continue
        for t in model.outputs:
            k = t.shape[-1] if t.shape else 1
            if t.name in declared and k > 0 and k != n:
                raise BundleError(f"{p['file']}: manifest.json has {n} labels, but the model's class output "
                                  f"{t.name!r} has {k} classes",
                                  fix="list one label per class, in the model's output order, then sign again")


def build_bundle(out_dir, files: dict, manifest: dict, private_key_path) -> Path:
    """Copy files in, fill format/created/files, write manifest.json + manifest.sig; replace out_dir atomically."""
    out = Path(out_dir)
    files = _check_inputs(files)
    m = {**_DEFAULTS, **dict(manifest)}
    m.update(format=eb.FORMAT, format_version=eb.FORMAT_VERSION)
    m.setdefault("created_utc", datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    m["files"] = {name: _file_entry(src) for name, src in files.items()}
    eb.validate_manifest(m)
    check_models_match_labels(m, files)
    _, kid = hk.load_private_key(private_key_path)  # fail before touching the disk
    if out.exists() and not (out / eb.MANIFEST).is_file() and (not out.is_dir() or any(out.iterdir())):
        raise BundleError(f"{out}: exists and is not a bundle", fix="choose an empty or new --out directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = public_dir(Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.building-")))
    try:
        for name, src in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, tmp / name)
            if _file_entry(tmp / name) != m["files"][name]:
                raise BundleError(f"{src}: changed while it was being copied", fix="build the bundle again")
        raw = manifest_bytes(m)
        atomic_write(tmp / eb.MANIFEST, raw, mode=PUBLIC)
        atomic_write(tmp / eb.SIGNATURE, hk.sign_manifest_bytes(raw, private_key_path).encode(), mode=PUBLIC)
        eb.check_contents(tmp)
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def refresh_files(bundle_dir) -> dict:
    """Recompute the file table from the directory (after an intentional edit); rewrites manifest.json."""
    d = Path(bundle_dir)
    try:
        m = eb.parse_manifest(eb._read_small(eb._DirSource(d), eb.MANIFEST))
    except OSError as e:
        raise BundleError(f"{d / eb.MANIFEST}: cannot be read ({e})", fix="rebuild the bundle") from None
    if not isinstance(m, dict):
        raise BundleError(f"{d / eb.MANIFEST}: top level is not a JSON object", fix="rebuild the bundle")
    names = [n for n in eb._DirSource(d).names() if n not in eb.META_FILES]
    _check_inputs({n: d / n for n in names})
    m["files"] = {n: _file_entry(d / n) for n in names}
    eb.validate_manifest(m)
    atomic_write(d / eb.MANIFEST, manifest_bytes(m), mode=PUBLIC)
    # A device MAC authenticated the old manifest bytes; a stale one would only ever fail.
    (d / eb.MAC).unlink(missing_ok=True)
    return m


def sign_bundle(bundle_dir, private_key_path, *, refresh: bool = False) -> str:
    """(Re)write manifest.sig for the manifest as it is; returns the key id. Checks the files first."""
    d = Path(bundle_dir)
    if not d.is_dir():
        raise BundleError(f"{d}: not a bundle directory", fix="unzip it first; only directories are signed")
    hk.load_private_key(private_key_path)
    if refresh:
        refresh_files(d)
    m = eb.check_contents(d)
    check_models_match_labels(m, {n: d / n for n in m["files"]})
    sig = hk.sign_manifest_bytes((d / eb.MANIFEST).read_bytes(), private_key_path)
    atomic_write(d / eb.SIGNATURE, sig.encode(), mode=PUBLIC)
    return sig.split()[1]


def add_device_mac(bundle_dir, device_key) -> str:
    """Write manifest.mac (HMAC-SHA256 of manifest.json with the device key); returns the device key id."""
    d = Path(bundle_dir)
    key = eb.load_hmac_key(device_key)
    m = eb.check_contents(d)
    check_models_match_labels(m, {n: d / n for n in m["files"]})
    text = eb.mac_text((d / eb.MANIFEST).read_bytes(), key)
    atomic_write(d / eb.MAC, text.encode(), mode=PUBLIC)  # an authenticator, not a secret
    return text.split()[1]


def zip_bundle(bundle_dir, out_zip) -> Path:
    """A deterministic .zip of a verified bundle directory (files at the root, fixed timestamps)."""
    d, out = Path(bundle_dir), Path(out_zip)
    m = eb.check_contents(d)
    names = sorted(m["files"]) + [n for n in eb.META_FILES if (d / n).is_file()]
    with atomic_file(out, mode=PUBLIC) as f, zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as zf:
        for n in names:
            info = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            with open(d / n, "rb") as src, zf.open(info, "w") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    return out


def summary(path, pubkey=None) -> dict:
    """What `inspect` prints: verified contents, and the signer. With ``pubkey`` the signature must verify
    with exactly those keys (a BundleError if not); without, it is checked against the keys ``bundle verify``
    trusts by default (``edge.kws.default_trusted_keys``: the shipped release keys, $EDGELEARN_KEYS or
    /etc/edgelearn/keys), and a signature they do not verify is reported, not raised: ``inspect`` shows
    any bundle whose contents match its manifest, and says whether its signer is trusted."""
    if pubkey:
        b = eb.load_bundle(path, trusted_keys=pubkey)
        m, signer = b.manifest, {"key_id": b.key_id, "verified": True, "keys": "given"}
    else:
        from edge.errors import EdgelearnError
        from edge.kws import default_trusted_keys

        m = eb.check_contents(path)
        signer = {"key_id": _sig_key_id(Path(path)), "verified": False, "keys": "default"}
        try:
            signer.update(key_id=eb.load_bundle(path, trusted_keys=default_trusted_keys()).key_id, verified=True)
        except EdgelearnError as e:
            signer["why"] = e.problem
    parts = [{k: p.get(k) for k in ("name", "file", "format", "placement", "precision")}
             | {"bytes": m["files"][p["file"]]["bytes"]} for p in m["partitions"]]
    return {"model_id": m["model_id"], "version": m["version"], "created_utc": m.get("created_utc"),
            "labels": m["labels"], "target": m.get("target"), "signature": signer, "partitions": parts,
            "files": len(m["files"]), "total_bytes": sum(f["bytes"] for f in m["files"].values()),
            "manifest": m}


def _sig_key_id(path: Path):
    try:
        if path.is_dir():
            return (path / eb.SIGNATURE).read_text().split()[1]
        with zipfile.ZipFile(path) as zf:
            src = eb._ZipSource(zf, path)
            with src.open(eb.SIGNATURE) as f:
                return f.read(4096).decode().split()[1]
    except (OSError, KeyError, IndexError, UnicodeDecodeError):
        return None
