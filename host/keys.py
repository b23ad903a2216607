"""Signing keys for bundles: Ed25519 key pairs and provisioned HMAC device keys.

Key files are one text line each (docs/bundle-format.md, "Keys"):

    edgelearn-ed25519-public  <base64 32-byte raw public key>  <comment>
    edgelearn-ed25519-private <base64 32-byte raw seed>        <comment>
    edgelearn-hmac-key        <hex 32-byte secret>             <comment>

Private and device keys are created with mode 0600 and never overwritten.

    >>> from host.keys import generate_keypair, sign_manifest_bytes
    >>> priv, pub = generate_keypair("keys", name="release")
    >>> sig_line = sign_manifest_bytes(Path("b/manifest.json").read_bytes(), priv)
"""

from __future__ import annotations

import base64
import secrets
from pathlib import Path

from edge.bundle import (HMAC_KEY_TAG, PRIVATE_TAG, PUBLIC_TAG, SIG_DOMAIN, SIG_TAG, _parse_key_line,
                         key_id)
from edge.atomic import write_new
from edge.errors import BundleError


def _write_new(path: Path, text: str, mode: int) -> None:
    """Create a file that must not exist yet, with its final mode from the first byte."""
    try:
        write_new(path, text.encode(), mode)
    except FileExistsError:
        raise BundleError(f"{path}: already exists", fix="choose another --out or --name; keys are never overwritten") from None


def _raw_public(private) -> bytes:
    from cryptography.hazmat.primitives import serialization as ser
    return private.public_key().public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)


def generate_keypair(out_dir, name: str = "edgelearn", comment: str | None = None) -> tuple[Path, Path]:
    """Write ``NAME.key`` (0600) and ``NAME.pub`` in out_dir; return their paths."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    priv_path, pub_path = out / f"{name}.key", out / f"{name}.pub"
    for p in (priv_path, pub_path):
        if p.exists():
            raise BundleError(f"{p}: already exists", fix="choose another --out or --name; keys are never overwritten")
    private = Ed25519PrivateKey.generate()
    seed = private.private_bytes(ser.Encoding.Raw, ser.PrivateFormat.Raw, ser.NoEncryption())
    raw_pub = _raw_public(private)
    comment = comment or f"{name} {key_id(raw_pub)}"
    _write_new(priv_path, f"{PRIVATE_TAG} {base64.b64encode(seed).decode()} {comment}\n", 0o600)
    _write_new(pub_path, f"{PUBLIC_TAG} {base64.b64encode(raw_pub).decode()} {comment}\n", 0o644)
    return priv_path, pub_path


def generate_device_key(out_dir, name: str = "device", comment: str | None = None) -> Path:
    """Write a 32-byte HMAC device key ``NAME.hmac`` (0600), the MCU's provisioned secret."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.hmac"
    _write_new(path, f"{HMAC_KEY_TAG} {secrets.token_hex(32)} {comment or name}\n", 0o600)
    return path


def load_private_key(path):
    """(Ed25519PrivateKey, key id) from a private key file."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    p = Path(path)
    if not p.is_file():
        raise BundleError(f"{p}: private key file not found", fix="create one with `edgelearn bundle keygen --out DIR`")
    text = p.read_text(errors="replace")
    if text.startswith(PUBLIC_TAG):
        raise BundleError(f"{p}: is a public key, signing needs the private one", fix="pass the .key file to --key")
    private = Ed25519PrivateKey.from_private_bytes(_parse_key_line(text, PRIVATE_TAG, str(p)))
    return private, key_id(_raw_public(private))


def is_private_key_file(path) -> bool:
    """True if the file starts like an edgelearn private or device key (never ship those)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return False
    return head.startswith(PRIVATE_TAG.encode()) or head.startswith(HMAC_KEY_TAG.encode())


def sign_manifest_bytes(manifest_bytes: bytes, private_key_path) -> str:
    """The one-line manifest.sig body for these exact manifest bytes."""
    private, kid = load_private_key(private_key_path)
    sig = private.sign(SIG_DOMAIN + kid.encode() + b"\n" + manifest_bytes)
    return f"{SIG_TAG} {kid} {base64.b64encode(sig).decode()}\n"
