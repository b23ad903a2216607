"""How ``DeviceState.save`` merges ``keywords.json`` with what another command saved meanwhile
(``edge.keywords``; the state lock is held around it, ``edge.atomic.state_lock``)."""

from __future__ import annotations

import json


def merge(keywords: list[dict], theirs_list: list[dict], base: dict, prefer: str) -> list[dict]:
    """Three-way merge of the enrolled keywords: ``keywords`` (this process's), ``theirs_list`` (the file
    as it is now), ``base`` (``snapshot`` of what this process read). Keywords only one side changed are
    that side's; one enrolment both changed field by field (a sensitivity and a calibration both kept);
    anything else both changed is ``prefer``'s ("ours", "theirs") or a StateError ("raise")."""
    ours, theirs = {k["name"]: k for k in keywords}, {k["name"]: k for k in theirs_list}
    out = []
    for name in list(ours) + [n for n in theirs if n not in ours]:
        o, t, b = ours.get(name), theirs.get(name), base.get(name)
        oj, tj = canon(o), canon(t)
        if None not in (o, t, b) and len({oj, tj, b}) == 3 and _same_head(o, t, json.loads(b)):
            bd = json.loads(b)  # both changed one enrolment (a sensitivity, a calibration): field by field
            pick = {}
            for k in list(o) + [k for k in t if k not in o]:
                src = _choose(*(canon(d[k]) if k in d else None for d in (o, t, bd)), prefer, name, False)
                pick.update({k: (o, t)[src][k]} if k in (o, t)[src] else {})
        else:
            pick = (o, t)[_choose(oj, tj, b, prefer, name, b is None)]
        if pick is not None:
            out.append(pick)
    return out


def canon(entry) -> str | None:
    return None if entry is None else json.dumps(entry, sort_keys=True)


def snapshot(keywords) -> dict:
    return {k["name"]: canon(k) for k in keywords}


def _same_head(*entries) -> bool:
    """Do these versions of one entry hold the same enrolment (neither side enrolled it again)?"""
    return len({canon({k: e.get(k) for k in ("w", "b", "prototype", "verify")}) for e in entries}) == 1


def _choose(o, t, b, prefer: str, name: str, enrolled: bool) -> int:
    """Three-way merge of one keyword (or one of its fields) as JSON, None where absent: 0 for this
    process's version (``o``), 1 for the file's (``t``); ``b``: what this process read."""
    from edge.keywords import StateError  # (edge.keywords imports this module)

    if o == b or o == t:
        return 1  # left as it was read (or made what the file holds): the file's
    if t == b or prefer == "ours":
        return 0  # only this process changed it
    if prefer == "theirs":
        return 1
    if enrolled:
        raise StateError(f"keyword {name!r} was enrolled by another command while this one ran",
                         fix="enrol it again with --replace to replace it, or pick another name")
    raise StateError(f"keyword {name!r} was changed by another command while this one ran",
                     fix="run the command again")
