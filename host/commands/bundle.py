"""``edgelearn bundle``: make keys, sign, verify, inspect and zip model bundles.

    $ edgelearn bundle keygen --out keys
    $ edgelearn bundle verify out/kws --pubkey keys/edgelearn.pub
    $ edgelearn bundle inspect out/kws --json

The work is ``host.bundle`` (build, sign, package) and ``edge.bundle`` (verify, load).
"""

from __future__ import annotations

import json
from pathlib import Path

from edge import bundle as eb
from edge.errors import BundleError
from host import keys as hk
from host.bundle import add_device_mac, bundle_arg, sign_bundle, summary, zip_bundle


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = sub.add_parser("keygen", help="write a new Ed25519 key pair (or --device: an HMAC device key)")
    p.add_argument("--out", required=True, help="directory for NAME.key (mode 0600) and NAME.pub")
    p.add_argument("--name", default=None, help="file stem (default: edgelearn, or device with --device)")
    p.add_argument("--device", action="store_true", help="make a provisioned MCU device key NAME.hmac instead")
    p = sub.add_parser("sign", help="sign a bundle directory's manifest")
    p.add_argument("bundle")
    p.add_argument("--key", help="Ed25519 private key file")
    p.add_argument("--device-key", help="also (or only) write manifest.mac with this HMAC device key")
    p.add_argument("--refresh", action="store_true", help="recompute the file table from the directory first")
    p = sub.add_parser("verify", help="verify signature, digests, sizes and names")
    p.add_argument("bundle")
    p.add_argument("--pubkey", action="append", default=None,
                   help="trusted public key file or directory of .pub files, repeatable (default: $EDGELEARN_KEYS, "
                        "else /etc/edgelearn/keys); the shipped release keys are always added, as spot and device "
                        "trust (set EDGELEARN_NO_SHIPPED_KEYS=1 to leave them out)")
    p.add_argument("--device-key", help="authenticate with manifest.mac and this device key instead")
    p.add_argument("--allow-unsigned", action="store_true", help="accept an unsigned bundle (with a warning)")
    p = sub.add_parser("inspect", help="print the manifest summary")
    p.add_argument("bundle")
    p.add_argument("--pubkey", action="append", default=None,
                   help="verify the signature with only these keys (repeatable; default: the keys `verify` "
                        "trusts: the shipped release keys, $EDGELEARN_KEYS or /etc/edgelearn/keys)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = sub.add_parser("zip", help="package a verified bundle directory as one .zip")
    p.add_argument("bundle")
    p.add_argument("--out", required=True, help="the .zip to write")


def run(args) -> int:
    if getattr(args, "bundle", None) is not None and args.action in ("verify", "inspect", "zip"):
        args.bundle = str(bundle_arg(args.bundle))  # a shipped bundle's name works too
    if args.action == "keygen":
        if args.device:
            print(f"wrote {hk.generate_device_key(args.out, name=args.name or 'device')} (mode 0600)")
        else:
            priv, pub = hk.generate_keypair(args.out, name=args.name or "edgelearn")
            print(f"wrote {priv} (private, mode 0600: keep it off devices and out of git)\nwrote {pub} (give this to devices)")
    elif args.action == "sign":
        if not args.key and not args.device_key:
            raise BundleError("nothing to sign with", fix="pass --key PRIVATE_KEY and/or --device-key DEVICE_KEY")
        if args.key:
            print(f"signed {args.bundle} with key {sign_bundle(args.bundle, args.key, refresh=args.refresh)}")
        if args.device_key:
            print(f"wrote {eb.MAC} for device key {add_device_mac(args.bundle, args.device_key)}")
    elif args.action == "verify":
        if args.pubkey or not (args.device_key or args.allow_unsigned):
            from edge.kws import resolve_trusted_keys  # the keys spot and device trust
            args.pubkey = resolve_trusted_keys(args.pubkey)
        key = Path(args.device_key) if args.device_key else None
        b = eb.load_bundle(args.bundle, trusted_keys=args.pubkey, device_key=key, allow_unsigned=args.allow_unsigned)
        print(f"OK {b.model_id} v{b.version}: {len(b.manifest['files'])} files verified, "
              f"{b.authenticated_by} key {b.key_id}")
    elif args.action == "inspect":
        s = summary(args.bundle, args.pubkey)
        if args.json:
            print(json.dumps(s, indent=2, sort_keys=True))
        else:
            _print_summary(s)
    elif args.action == "zip":
        print(f"wrote {zip_bundle(args.bundle, args.out)}")
    return 0


def _print_summary(s: dict) -> None:
    sig = s["signature"]
    if sig["verified"]:
        state = "verified" + (" with the default trusted keys (shipped release keys, $EDGELEARN_KEYS)"
                              if sig.get("keys") == "default" else " with the given keys")
    else:
        state = f"NOT verified ({sig.get('why') or 'no trusted key'}; pass --pubkey with the signer's key)"
    print(f"model    {s['model_id']}  version {s['version']}  created {s['created_utc']}")
    print(f"labels   {', '.join(s['labels'])}")
    print(f"target   {s['target'] if not isinstance(s['target'], dict) else s['target'].get('name', s['target'])}")
    print(f"signed   key {sig['key_id'] or '(unsigned)'}  {state if sig['key_id'] else ''}")
    print(f"{'partition':<16}{'file':<28}{'format':<10}{'placement':<11}{'precision':<11}{'bytes':>10}")
    for p in s["partitions"]:
        print(f"{p['name']:<16}{p['file']:<28}{p['format']:<10}{p['placement']:<11}{str(p['precision'] or '-'):<11}{p['bytes']:>10}")
    print(f"total    {s['files']} files, {s['total_bytes']} bytes")
