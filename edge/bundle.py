"""Load and verify a signed model bundle (a directory, or a .zip of one).

A bundle is ``manifest.json`` plus the files it lists by SHA-256 and size,
authenticated by ``manifest.sig`` (Ed25519, Linux devices) or ``manifest.mac``
(HMAC-SHA256 with a provisioned device key, MCUs). The format, key files and
the verification order are specified in docs/bundle-format.md; this module is
the one implementation of the checks, used by devices, the host CLI and the
serving shim alike. The manifest's schema (its names, limits and ``validate_manifest``)
is ``edge/bundle_schema.py``.

    >>> from edge.bundle import load_bundle
    >>> b = load_bundle("models/kws-dscnn-s", trusted_keys="keys/edgelearn.pub")
    >>> b.model_id, b.version, b.labels
    >>> model = b.path(b.partition("encoder")["file"])
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import shutil
import stat
import tempfile
import warnings
import weakref
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from edge.errors import BundleError
# the manifest's schema checks have a module of their own; every name stays importable here
from edge.bundle_schema import MAC, MANIFEST, META_FILES, SIGNATURE, check_name, validate_manifest
from edge.bundle_schema import CLASS_ROLES, FORMAT, FORMAT_VERSION, check_labels  # noqa: F401 (re-exported)
from edge.bundle_schema import _MODEL_ID, PARTITION_FORMATS, PLACEMENTS  # noqa: F401 (re-exported)
from edge.keys import (HMAC_KEY_TAG, MAC_TAG, PRIVATE_TAG, PUBLIC_TAG, _parse_key_line,  # noqa: F401 (re-exported)
                       hmac_key_id, key_id, load_hmac_key, load_public_keys, mac_text)

SIG_TAG = "edgelearn-ed25519-signature"
# The signed message binds the key id and a domain label, so a signature made
# for some other purpose with the same key can never pass as a bundle signature.
SIG_DOMAIN = b"edgelearn-bundle-manifest-v1\n"
MAX_MANIFEST_BYTES = 1 << 20
MAX_JSON_DEPTH = 64             # a manifest nests about 6 deep; deeper is refused before parsing
_REBUILD = "re-download the bundle or rebuild it with `edgelearn bundle sign`"


@dataclass
class Bundle:
    """A verified bundle. ``root`` holds the files (a temp copy for a .zip)."""

    root: Path
    manifest: dict
    source: Path
    key_id: str | None = None
    authenticated_by: str = "ed25519"
    _cleanup: object = field(default=None, repr=False)

    model_id = property(lambda self: self.manifest["model_id"])
    version = property(lambda self: self.manifest["version"])
    labels = property(lambda self: list(self.manifest["labels"]))
    partitions = property(lambda self: list(self.manifest["partitions"]))
    frontend = property(lambda self: self.manifest.get("frontend", {}))

    def path(self, name: str) -> Path:
        if name not in self.manifest["files"]:
            raise BundleError(f"{name}: not a file of bundle {self.model_id} v{self.version}",
                              fix=f"use one of {sorted(self.manifest['files'])}")
        return self.root / name

    def partition(self, name: str) -> dict:
        for part in self.manifest["partitions"]:
            if part["name"] == name:
                return dict(part)
        raise BundleError(f"bundle {self.model_id} v{self.version} has no partition {name!r}",
                          fix=f"use one of {[p['name'] for p in self.manifest['partitions']]}")


def unreadable(path, e: OSError) -> BundleError:
    """A bundle file or directory this user cannot read, said as that (not as "no manifest.json",
    which is what a listing that silently skips an unreadable directory would lead to)."""
    why = "permission denied" if isinstance(e, PermissionError) else (e.strerror or str(e))
    fix = ("make the bundle readable by this user (bundles are public: chmod -R a+rX on it), or run as its owner"
           if isinstance(e, PermissionError) else "check the disk, or re-download the bundle")
    return BundleError(f"cannot read {e.filename or path}: {why}", fix=fix)


def _raise(e: OSError):
    raise e


class _DirSource:
    def __init__(self, root: Path):
        self.root = root

    def names(self) -> list:
        out = []
        try:  # os.walk with onerror: an unreadable directory is an error here, never an empty listing
            for top, dirs, files in os.walk(self.root, onerror=_raise):
                for n in sorted(dirs + files):
                    p = Path(top) / n
                    rel = p.relative_to(self.root).as_posix()
                    if p.is_symlink():
                        raise BundleError(f"{rel}: is a symbolic link",
                                          fix="bundles hold regular files only; rebuild it")
                    if n in files:
                        if not p.is_file():
                            raise BundleError(f"{rel}: is not a regular file", fix="remove it or rebuild the bundle")
                        out.append(rel)
        except OSError as e:
            raise unreadable(self.root, e) from None
        return sorted(out, key=lambda rel: rel.split("/"))  # as Path objects sort: by component

    def size(self, name):
        try:
            return (self.root / name).stat().st_size
        except PermissionError as e:
            raise unreadable(self.root / name, e) from None

    def open(self, name):
        try:
            return open(self.root / name, "rb")
        except PermissionError as e:
            raise unreadable(self.root / name, e) from None


class _ZipSource:
    def __init__(self, zf: zipfile.ZipFile, zpath: Path):
        self.zf, self.infos, prefix = zf, {}, ""
        entries = [i for i in zf.infolist() if not i.is_dir()]
        for info in entries:
            check_name(info.filename, f"{zpath.name}")
            if stat.S_ISLNK(info.external_attr >> 16):
                raise BundleError(f"{zpath.name}: {info.filename} is a symbolic link", fix="rebuild the zip with `edgelearn bundle zip`")
        names = [i.filename for i in entries]
        if MANIFEST not in names:
            # Accept `zip -r b.zip b/`: everything under one top-level directory.
            tops = {n.split("/", 1)[0] for n in names}
            if len(tops) == 1 and f"{next(iter(tops))}/{MANIFEST}" in names:
                prefix = next(iter(tops)) + "/"
        for info in entries:
            rel = info.filename[len(prefix):]
            if rel in self.infos:
                raise BundleError(f"{zpath.name}: {rel} appears twice", fix="rebuild the zip with `edgelearn bundle zip`")
            self.infos[rel] = info

    def names(self):
        return sorted(self.infos)

    def size(self, name):
        return self.infos[name].file_size

    def open(self, name):
        return self.zf.open(self.infos[name])


def _read_small(src, name: str) -> bytes:
    """The bytes of a manifest-sized file, never more than MAX_MANIFEST_BYTES read."""
    if src.size(name) > MAX_MANIFEST_BYTES:
        raise BundleError(f"{name}: larger than {MAX_MANIFEST_BYTES} bytes", fix=_REBUILD)
    with src.open(name) as f:
        raw = f.read(MAX_MANIFEST_BYTES + 1)
    if len(raw) > MAX_MANIFEST_BYTES:  # grew since it was measured
        raise BundleError(f"{name}: larger than {MAX_MANIFEST_BYTES} bytes", fix=_REBUILD)
    return raw


_JSON_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"?|[\[\]{}]')  # an unclosed string runs to the end: linear


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def parse_manifest(raw: bytes, where: str = MANIFEST):
    """Bytes -> the parsed JSON value; anything else (bad UTF-8 or JSON, NaN, nesting deeper
    than MAX_JSON_DEPTH, too large) is one BundleError. Call it only on authenticated bytes
    (or, on the host, on bytes that are about to be signed)."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise BundleError(f"{where}: larger than {MAX_MANIFEST_BYTES} bytes", fix=_REBUILD)
    depth = 0
    for m in _JSON_TOKENS.finditer(raw):  # strings skipped; brackets counted, before any recursion
        c = m.group()
        if c in (b"[", b"{"):
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise BundleError(f"{where}: not valid JSON (nested more than {MAX_JSON_DEPTH} levels deep)",
                                  fix=_REBUILD)
        elif c in (b"]", b"}"):
            depth -= 1
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else e
        raise BundleError(f"{where}: not valid JSON ({why})", fix=_REBUILD) from None


def _authenticate(src, names, raw: bytes, trusted, device_key, allow_unsigned):
    """Returns (key_id, how). Checks the signature over the exact manifest bytes."""
    if device_key is not None:
        key = load_hmac_key(device_key)
        if MAC not in names:
            raise BundleError(f"{MAC}: missing, so this device cannot authenticate the manifest",
                              fix="add one with `edgelearn bundle sign --device-key KEY`")
        fields = _read_small(src, MAC).decode("ascii", "replace").split()
        want = mac_text(raw, key).split()
        if len(fields) != 3 or fields[0] != MAC_TAG:
            raise BundleError(f"{MAC}: not `{MAC_TAG} <key id> <hex>`", fix=_REBUILD)
        if fields[1] != want[1]:
            raise BundleError(f"{MAC}: made for device key {fields[1]}, this device's key is {want[1]}",
                              fix="re-authenticate the bundle with this device's key")
        if not hmac.compare_digest(fields[2].encode(), want[2].encode()):  # bytes: str needs ASCII
            raise BundleError(f"{MAC}: HMAC does not match manifest.json (manifest changed after authentication)", fix=_REBUILD)
        return want[1], "hmac-sha256"
    if SIGNATURE not in names:
        if allow_unsigned:
            warnings.warn("loading an UNSIGNED bundle (allow_unsigned=True): its origin is not verified", stacklevel=3)
            return None, "unsigned"
        raise BundleError(f"{SIGNATURE}: missing, the bundle is unsigned",
                          fix="sign it with `edgelearn bundle sign DIR --key KEY` (or pass allow_unsigned=True for local experiments)")
    keys = load_public_keys(trusted)
    if not keys and allow_unsigned:
        warnings.warn("bundle signature NOT checked (no trusted keys, allow_unsigned=True)", stacklevel=3)
        return None, "unsigned"
    if not keys:
        raise BundleError("no trusted public keys given, so the signature cannot be checked",
                          fix="pass trusted_keys= (or --pubkey) with the signer's .pub file")
    fields = _read_small(src, SIGNATURE).decode("ascii", "replace").split()
    if len(fields) != 3 or fields[0] != SIG_TAG:
        raise BundleError(f"{SIGNATURE}: not `{SIG_TAG} <key id> <base64>`", fix=_REBUILD)
    kid = fields[1]
    if kid not in keys:
        raise BundleError(f"{SIGNATURE}: signed by key {kid}, which is not among the trusted keys "
                          f"{', '.join(sorted(keys))} (read from {_key_sources(trusted)})",
                          fix="add the signer's .pub file (--pubkey, repeatable, or $EDGELEARN_KEYS), "
                              "or re-sign the bundle with a trusted key")
    from cryptography.exceptions import InvalidSignature
    try:
        keys[kid].verify(base64.b64decode(fields[2], validate=True), SIG_DOMAIN + kid.encode() + b"\n" + raw)
    except (InvalidSignature, ValueError):
        raise BundleError(f"{SIGNATURE}: signature does not match manifest.json (manifest changed after signing)",
                          fix=_REBUILD) from None
    return kid, "ed25519"


def _key_sources(trusted) -> str:
    """Where trusted keys came from, for an error: the files and directories given (key objects and
    key lines passed in code: 'given key objects')."""
    items = trusted if isinstance(trusted, (list, tuple, set)) else [trusted]
    out = []
    for item in items:
        if isinstance(item, (str, Path)) and not str(item).startswith("edgelearn-"):
            out.append(str(item))
        elif "given key objects" not in out:
            out.append("given key objects")
    return ", ".join(out) or "nothing"


def _hash_stream(f, out=None, limit=None) -> tuple:
    h, n = hashlib.sha256(), 0
    while chunk := f.read(1 << 20):
        n += len(chunk)
        if limit is not None and n > limit:
            break  # a zip entry larger than the manifest claims: stop before filling the disk
        h.update(chunk)
        if out is not None:
            out.write(chunk)
    return h.hexdigest(), n


def _verify(src, label: str, trusted, device_key, allow_unsigned, extract_to: Path | None,
            authenticate: bool = True):
    names = src.names()
    if MANIFEST not in names:
        raise BundleError(f"{label}: no {MANIFEST}", fix="point at a bundle directory or .zip built by `edgelearn bundle`")
    raw = _read_small(src, MANIFEST)
    # Authenticate the exact bytes first: nothing an attacker wrote is parsed before it verifies.
    kid, how = (_authenticate(src, names, raw, trusted, device_key, allow_unsigned) if authenticate
                else (None, "not checked"))
    manifest = validate_manifest(parse_manifest(raw))
    listed = manifest["files"]
    for name in sorted(listed):
        if name not in names:
            raise BundleError(f"{name}: listed in {MANIFEST} but missing from the bundle", fix=_REBUILD)
    for name in names:
        if name not in listed and name not in META_FILES:
            raise BundleError(f"{name}: in the bundle but not listed in {MANIFEST} (added after signing)",
                              fix="remove the file or rebuild the bundle")
    for name in sorted(listed):
        want = listed[name]
        if src.size(name) != want["bytes"]:
            raise BundleError(f"{name}: {src.size(name)} bytes, manifest says {want['bytes']} (truncated or changed)", fix=_REBUILD)
        out = None
        if extract_to is not None:
            (extract_to / name).parent.mkdir(parents=True, exist_ok=True)
            out = open(extract_to / name, "wb")
        try:
            with src.open(name) as f:
                digest, n = _hash_stream(f, out, limit=want["bytes"])
        finally:
            if out is not None:
                out.close()
        if n != want["bytes"] or digest != want["sha256"]:
            raise BundleError(f"{name}: SHA-256 mismatch (bundle changed after signing)", fix=_REBUILD)
    if extract_to is not None:
        for meta in META_FILES:
            if meta in names:
                (extract_to / meta).write_bytes(_read_small(src, meta))
    return manifest, kid, how


def _check_reachable(path: Path) -> None:
    """``Path.is_dir``/``is_file`` say False for a path in a directory this user may not enter:
    say "permission denied" rather than "no such bundle"."""
    try:
        path.stat()
    except PermissionError as e:
        raise unreadable(path, e) from None
    except OSError:
        pass


def check_contents(path) -> dict:
    """Every check except who signed it (for signing and inspecting on the host); returns the manifest."""
    path = Path(path)
    _check_reachable(path)
    if path.is_dir():
        return _verify(_DirSource(path), path.name, None, None, False, None, authenticate=False)[0]
    try:
        with zipfile.ZipFile(path) as zf:
            return _verify(_ZipSource(zf, path), path.name, None, None, False, None, authenticate=False)[0]
    except PermissionError as e:
        raise unreadable(path, e) from None
    except (zipfile.BadZipFile, OSError) as e:
        raise BundleError(f"{path}: not a bundle directory or readable zip ({e})", fix="check the path") from None


def load_bundle(path, trusted_keys=None, *, allow_unsigned: bool = False, device_key=None,
                extract_to=None) -> Bundle:
    """Verify a bundle directory or .zip and return it; any failure is one BundleError.

    ``trusted_keys``: Ed25519 public keys (key line, .pub file, directory, or a list).
    ``device_key``: authenticate with ``manifest.mac`` (the MCU scheme) instead.
    A .zip is verified while it is extracted into ``extract_to`` (a new directory)
    or, by default, a temp directory removed when the Bundle is garbage-collected.
    """
    path = Path(path)
    _check_reachable(path)
    if path.is_dir():
        manifest, kid, how = _verify(_DirSource(path), path.name, trusted_keys, device_key, allow_unsigned, None)
        return Bundle(path, manifest, path, kid, how)
    if not path.is_file():
        raise BundleError(f"{path}: no such bundle", fix="give a bundle directory or .zip")
    try:
        zf = zipfile.ZipFile(path)
    except PermissionError as e:
        raise unreadable(path, e) from None
    except (zipfile.BadZipFile, OSError) as e:
        raise BundleError(f"{path.name}: not a readable zip ({e})", fix="re-download the bundle") from None
    own_tmp = extract_to is None
    if not own_tmp and Path(extract_to).exists():
        zf.close()
        raise BundleError(f"{extract_to}: already exists", fix="extract_to must name a new directory")
    dest = Path(tempfile.mkdtemp(prefix="edgelearn-bundle-")) if own_tmp else Path(extract_to)
    if not own_tmp:
        dest.mkdir(parents=True)
    try:
        with zf:
            manifest, kid, how = _verify(_ZipSource(zf, path), path.name, trusted_keys, device_key,
                                         allow_unsigned, dest)
    except zipfile.BadZipFile as e:
        shutil.rmtree(dest, ignore_errors=True)
        raise BundleError(f"{path.name}: damaged zip ({e})", fix="re-download the bundle") from None
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    bundle = Bundle(dest, manifest, path, kid, how)
    if own_tmp:
        bundle._cleanup = weakref.finalize(bundle, shutil.rmtree, str(dest), True)
    return bundle
