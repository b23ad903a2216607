"""Key files and MACs for bundles: Ed25519 public keys (Linux devices) and HMAC device keys (MCUs).

Key files are one line: ``edgelearn-ed25519-public <base64> [comment]`` (or
``-private``, ``edgelearn-hmac-key <hex>``); docs/bundle-format.md has the
format. ``edge.bundle`` re-exports these names.

    >>> keys = load_public_keys("models/keys")      # {key_id: Ed25519PublicKey}
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from pathlib import Path

from edge.errors import BundleError

PUBLIC_TAG, PRIVATE_TAG = "edgelearn-ed25519-public", "edgelearn-ed25519-private"
MAC_TAG, HMAC_KEY_TAG = "edgelearn-hmac-sha256", "edgelearn-hmac-key"


def key_id(raw_public: bytes) -> str:
    """First 16 hex chars of SHA-256 over the raw 32-byte public key."""
    return hashlib.sha256(raw_public).hexdigest()[:16]


def _parse_key_line(text: str, tag: str, where: str) -> bytes:
    fields = text.strip().split(None, 2)
    if len(fields) < 2 or fields[0] != tag:
        raise BundleError(f"{where}: not an edgelearn key (expected a line `{tag} <base64> [comment]`)",
                          fix="create keys with `edgelearn bundle keygen --out DIR`")
    try:
        raw = base64.b64decode(fields[1], validate=True)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise BundleError(f"{where}: key is not 32 bytes of base64", fix="the key file is damaged; copy it again")
    return raw


def load_public_keys(spec) -> dict:
    """Trusted keys as {key_id: Ed25519PublicKey} from a key, a .pub file, a directory of them or a list
    (a list of paths may also be one string joined with ``os.pathsep``, like $PATH)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if spec is None:
        return {}
    items = spec if isinstance(spec, (list, tuple, set)) else [spec]
    keys: dict = {}
    for item in items:
        if isinstance(item, Ed25519PublicKey):
            from cryptography.hazmat.primitives import serialization as ser
            raw = item.public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
            keys[key_id(raw)] = item
            continue
        if isinstance(item, str) and item.startswith(PUBLIC_TAG + " "):
            raw = _parse_key_line(item, PUBLIC_TAG, "public key")
        else:
            p = Path(item)
            if not p.exists() and os.pathsep in str(item):  # a PATH-style list, as str() of resolved keys gives
                keys.update(load_public_keys([q for q in str(item).split(os.pathsep) if q]))
                continue
            if p.is_dir():
                keys.update(load_public_keys(sorted(p.glob("*.pub"))))
                continue
            if not p.is_file():
                raise BundleError(f"{p}: trusted key file not found", fix="pass --pubkey with a .pub file or a directory of them")
            text = p.read_text(errors="replace")
            if text.startswith(PRIVATE_TAG):
                raise BundleError(f"{p}: is a private key", fix="give devices only the .pub file")
            raw = _parse_key_line(text, PUBLIC_TAG, str(p))
        keys[key_id(raw)] = Ed25519PublicKey.from_public_bytes(raw)
    return keys


def load_hmac_key(spec) -> bytes:
    """A provisioned device key: raw bytes, or a file holding `edgelearn-hmac-key <hex> [comment]`."""
    if isinstance(spec, (bytes, bytearray)):
        key = bytes(spec)
    else:
        p = Path(spec)
        if not p.is_file():
            raise BundleError(f"{p}: device key file not found", fix="provision the device key first")
        fields = p.read_text(errors="replace").split(None, 2)
        if len(fields) < 2 or fields[0] != HMAC_KEY_TAG:
            raise BundleError(f"{p}: not a device key (expected `{HMAC_KEY_TAG} <hex> [comment]`)",
                              fix="create one with `edgelearn bundle keygen --device --out DIR`")
        try:
            key = bytes.fromhex(fields[1])
        except ValueError:
            key = b""
    if len(key) < 16:
        raise BundleError("device key is shorter than 16 bytes", fix="provision a 32-byte random key")
    return key


def hmac_key_id(key: bytes) -> str:
    # Domain-separated so the id never equals a prefix of an HMAC the key made.
    return hashlib.sha256(b"edgelearn-hmac-key-id\n" + key).hexdigest()[:16]


def mac_text(manifest_bytes: bytes, key: bytes) -> str:
    """The one-line manifest.mac body: HMAC-SHA256 over the exact manifest.json bytes."""
    mac = hmac.new(key, manifest_bytes, hashlib.sha256).hexdigest()
    return f"{MAC_TAG} {hmac_key_id(key)} {mac}\n"
