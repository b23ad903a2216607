"""A bundle manifest's schema: the format's names and limits, and the checks a parsed manifest
must pass (``validate_manifest``: format, version, ids, partitions, file table; ``check_labels``:
one label per class; ``check_name``: file names that stay inside the bundle).

``edge.bundle`` authenticates a manifest's bytes, parses them and then calls these; ``host.bundle``
calls them before it signs one. Every name stays importable from ``edge.bundle``; the format is
docs/bundle-format.md.

    >>> m = validate_manifest(parse_manifest(raw))      # one BundleError for anything wrong
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import NoReturn

from edge.errors import BundleError

FORMAT = "edgelearn-bundle"
FORMAT_VERSION = 1
MANIFEST, SIGNATURE, MAC = "manifest.json", "manifest.sig", "manifest.mac"
META_FILES = (MANIFEST, SIGNATURE, MAC)
PARTITION_FORMATS = ("tflite", "onnx", "mpy-blob")
PLACEMENTS = ("cpu", "npu", "cloud", "mcu")
CLASS_ROLES = ("probs", "logits")  # a partition output with one value per label
_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_name(name: str, where: str = "manifest.json") -> str:
    """Reject names that could escape the bundle directory (zip-slip, absolute paths, `..`)."""
    bad = (not isinstance(name, str) or not name or name.startswith("/") or "\\" in name or "\x00" in name
           or re.match(r"^[A-Za-z]:", name) is not None or len(name) > 255)
    parts = PurePosixPath(name).parts if not bad else ()
    if bad or any(p in ("", ".", "..") for p in parts) or name != "/".join(parts):
        raise BundleError(f"{where}: unsafe file name {name!r} (absolute, `..`, backslash or empty part)",
                          fix="bundles may only name plain relative paths inside the bundle; rebuild it")
    return name


def validate_manifest(m) -> dict:
    """Schema checks on a parsed manifest (format, version, ids, partitions, file table)."""
    def bad(problem, fix="rebuild the bundle with `edgelearn bundle` tools") -> NoReturn:
        raise BundleError(f"{MANIFEST}: {problem}", fix=fix)

    if not isinstance(m, dict):
        bad("top level is not a JSON object")
    if m.get("format") != FORMAT:
        bad(f"format is {m.get('format')!r}, expected {FORMAT!r}", fix="this is not an edgelearn bundle")
    fv = m.get("format_version")
    if type(fv) is not int:
        bad(f"format_version {fv!r} is not an integer")
    if fv < FORMAT_VERSION:
        bad(f"format version {fv} is older than the supported version {FORMAT_VERSION}",
            fix="rebuild the bundle with the current edgelearn tools")
    if fv > FORMAT_VERSION:
        bad(f"format version {fv} is newer than this runtime supports ({FORMAT_VERSION})", fix="upgrade edgelearn on the device")
    if not isinstance(m.get("model_id"), str) or not _MODEL_ID.match(m["model_id"]):
        bad(f"model_id {m.get('model_id')!r} must be 1-64 letters, digits, '.', '_' or '-'")
    if type(m.get("version")) is not int or m["version"] < 0:
        bad(f"version {m.get('version')!r} must be a non-negative integer")
    if not isinstance(m.get("labels"), list) or not all(isinstance(x, str) for x in m["labels"]):
        bad("labels must be a list of strings")
    files = m.get("files")
    if not isinstance(files, dict):
        bad("files must be an object {name: {sha256, bytes}}")
    for name, info in files.items():
        check_name(name)
        if name in META_FILES:
            bad(f"files lists {name}, which is never part of the file table")
        if (not isinstance(info, dict) or not re.fullmatch(r"[0-9a-f]{64}", str(info.get("sha256")))
                or type(info.get("bytes")) is not int or info["bytes"] < 0):
            bad(f"files[{name!r}] needs a lowercase hex sha256 and an integer bytes")
    parts = m.get("partitions")
    if not isinstance(parts, list):
        bad("partitions must be a list")
    seen = set()
    for p in parts:
        if not isinstance(p, dict) or not isinstance(p.get("name"), str) or p["name"] in seen:
            bad("each partition needs a unique string name")
        seen.add(p["name"])
        if not isinstance(p.get("file"), str) or p["file"] not in files:
            bad(f"partition {p['name']!r} names file {p.get('file')!r}, which is not in files")
        if p.get("format") not in PARTITION_FORMATS:
            bad(f"partition {p['name']!r} format {p.get('format')!r} is not one of {PARTITION_FORMATS}")
        if p.get("placement") not in PLACEMENTS:
            bad(f"partition {p['name']!r} placement {p.get('placement')!r} is not one of {PLACEMENTS}")
        for key in ("role", "precision"):
            if key in p and not isinstance(p[key], str):
                bad(f"partition {p['name']!r} {key} {p[key]!r} is not a string")
        for key in ("inputs", "outputs"):
            tensors = p.get(key, [])
            if not isinstance(tensors, list) or not all(isinstance(t, dict) for t in tensors):
                bad(f"partition {p['name']!r} {key} must be a list of objects")
            for t in tensors:
                if not isinstance(t.get("name", ""), str) or not isinstance(t.get("role", ""), str) or (
                        "role" in t and "name" not in t):
                    bad(f"partition {p['name']!r} {key}: a tensor's name and role must be strings "
                        "(and a tensor with a role needs a name)")
                shape = t.get("shape", [])
                if not isinstance(shape, list) or not all(type(d) is int for d in shape):
                    bad(f"partition {p['name']!r} {key}: shape {shape!r} is not a list of integers")
    check_labels(m)
    if not isinstance(m.get("frontend", {}), dict):
        bad("frontend must be an object")
    for key in ("extra", "trainable", "quantization"):
        if not isinstance(m.get(key, {}), dict):
            bad(f"{key} must be an object")
    labels12 = m.get("extra", {}).get("labels12", [])
    if not isinstance(labels12, list) or not all(isinstance(w, str) for w in labels12):
        bad("extra.labels12 must be a list of strings")
    return m


def check_labels(m: dict) -> None:
    """Every class output the manifest declares (role probs or logits) has one label per class.

    A bundle whose labels do not match its model is refused when it is signed
    (``host.bundle``, which also checks the model files themselves) and when it is loaded,
    so a runtime never indexes past the end of ``labels``.
    """
    n = len(m["labels"])
    for p in m["partitions"]:
        for t in p.get("outputs", []):
            shape = t.get("shape", [])
            if t.get("role") in CLASS_ROLES and shape and shape[-1] > 0 and shape[-1] != n:
                raise BundleError(
                    f"{MANIFEST}: {n} labels, but partition {p['name']!r} output {t.get('name', '?')!r} "
                    f"({t['role']}) has {shape[-1]} classes",
                    fix="list one label per class, in the model's output order, and sign the bundle again")
