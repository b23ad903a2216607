"""Signed JSON bodies and the check-in schema: every field's type and range, checked before anything changes.

A check-in is one flat JSON object (docs/protocol.md):

    device_id      the sender's id (a string; another device's id is 403)
    tier           1-16 characters of A-Z a-z 0-9 . _ -     (``linux``, ``mcu``)
    battery        a number from 0 to 1
    charging       true or false
    network        1-32 characters of A-Z a-z 0-9 . _ -     (``wifi``, ``ethernet``, ``cellular``...)
    temperature    a number from -100 to 200 (degrees C)
    model_version  an integer from 0 to 2^31 - 1
    time           Unix seconds, a number from 0 to 2^32, strictly increasing per device

Every field is optional and ``null`` means "not reported" (a board without a clock or a charge pin).
Anything else is one 400 naming the field: a wrong type, a value out of range, NaN or
±Infinity (or a number that overflows a double, such as 1e400), nesting, an unknown field. A
signed body nested deeper than ``MAX_DEPTH`` is refused before it is parsed, so no parser
recursion can be exhausted.

    obj = load_object(body, "check-in")       # dict, or Reject(400)
    state = validate_checkin("pi-001", obj)   # the fields given, None dropped; or Reject(400/403)
"""

from __future__ import annotations

import json
import math
import re

from host.aggregator.errors import Reject

MAX_DEPTH = 32          # of any signed JSON body (secure-aggregation messages need 3)
MAX_TIME = 2.0 ** 32    # Unix seconds (year 2106): a larger time would lock the device out for good


class NonFinite:
    """A JSON number that is NaN, ±Infinity or too large for a double: kept so the schema can name its field."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _float(s: str):
    f = float(s)
    return f if math.isfinite(f) else NonFinite(s)


# strings (so brackets inside them do not count) and brackets
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.S)


def _too_deep(body: bytes, limit: int):
    """None, or (the top-level key whose value nests deeper than ``limit`` or None for the body itself)."""
    depth, key = 0, None
    for m in _TOKENS.finditer(body):
        t = m.group()
        if t[:1] == b'"':
            if depth == 1:
                key = t
            continue
        if t in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return (key,)
        else:
            depth -= 1
    return None


def _key_text(raw: bytes) -> str:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace").strip('"')


def _show(v) -> str:
    s = v.text if isinstance(v, NonFinite) else json.dumps(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _name(k: str) -> str:
    r = repr(k)
    return r if len(r) <= 40 else r[:37] + "..."


def load_object(body: bytes, what: str, max_depth: int = MAX_DEPTH) -> dict:
    """The JSON object in ``body`` (non-finite numbers as ``NonFinite``); Reject(400) for anything else."""
    deep = _too_deep(body, max_depth)
    if deep is not None:
        where = f"field {_name(_key_text(deep[0]))}" if deep[0] is not None else "body"
        raise Reject(400, "BadRequest", f"{what} {where} is nested more than {max_depth} levels deep",
                     f"send the flat JSON object docs/protocol.md describes for a {what}")
    try:
        obj = json.loads(body, parse_float=_float, parse_constant=NonFinite)
    except (ValueError, RecursionError) as e:
        raise Reject(400, "BadRequest", f"{what} body is not JSON ({str(e)[:80]})", "send a JSON object") from None
    if not isinstance(obj, dict):
        raise Reject(400, "BadRequest", f"{what} body is a JSON {type(obj).__name__}, not an object",
                     "send a JSON object")
    return obj


def find_non_finite(obj, path: str = ""):
    """The path of the first NaN/±Infinity/overflowing number in a parsed body, or None."""
    if isinstance(obj, NonFinite):
        return path or "body"
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        p = find_non_finite(v, f"{path}.{k}" if path else str(k))
        if p is not None:
            return p
    return None


def _number(lo, hi):
    def ok(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi
    return ok


def _integer(lo, hi):
    def ok(v):
        return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi
    return ok


def _word(n):
    pat = re.compile(r"[A-Za-z0-9._-]{1,%d}" % n)

    def ok(v):
        return isinstance(v, str) and pat.fullmatch(v) is not None
    return ok


# field -> (check, what a valid value is); docs/protocol.md lists the same
FIELDS = {
    "device_id": (lambda v: isinstance(v, str), "the device's own id as a string"),
    "tier": (_word(16), "1-16 characters of A-Z a-z 0-9 . _ - (linux or mcu)"),
    "battery": (_number(0, 1), "a number from 0 to 1"),
    "charging": (lambda v: isinstance(v, bool), "true or false"),
    "network": (_word(32), "1-32 characters of A-Z a-z 0-9 . _ - (wifi, ethernet, cellular...)"),
    "temperature": (_number(-100, 200), "a number of degrees C from -100 to 200"),
    "model_version": (_integer(0, 2**31 - 1), "an integer from 0 to 2147483647"),
    "time": (_number(0, MAX_TIME), "Unix seconds, a number from 0 to 4294967296"),
}


def validate_checkin(device_id: str, state: dict) -> dict:
    """The check-in's fields with ``null`` ones dropped; Reject(400) naming the first bad field,
    Reject(403) when it reports another device's state. Nothing is stored before this passes."""
    if not isinstance(state, dict):
        raise Reject(400, "BadRequest", f"check-in is a {type(state).__name__}, not a JSON object",
                     "send a JSON object")
    unknown = sorted((k for k in state if k not in FIELDS), key=str)
    if unknown:
        raise Reject(400, "BadRequest", f"check-in field {_name(str(unknown[0]))} is not one of "
                     f"{', '.join(FIELDS)}", "leave it out (docs/protocol.md lists the check-in fields)")
    out = {}
    for k, (ok, want) in FIELDS.items():
        v = state.get(k)
        if v is None and not (k == "device_id" and k in state):
            continue
        if not ok(v):
            raise Reject(400, "BadRequest", f"check-in field {k!r} is {_show(v)}, not {want}",
                         f"send {k} as {want}, or leave it out")
        out[k] = v
    if out.get("device_id", device_id) != device_id:
        raise Reject(403, "DeviceMismatch", f"device {device_id!r} checked in as {_show(out['device_id'])}",
                     "a device may only report its own state")
    return out
