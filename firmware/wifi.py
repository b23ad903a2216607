"""Wi-Fi phase of the firmware: check in with the aggregator and upload the update over HTTP.

The board's own path to ``host/aggregator`` when ``config.json`` names one
(``"aggregator": "http://host:port"``, ``"wifi": {"ssid": ..., "password": ...}``):
``POST /v1/checkin`` with the signed state (firmware/checkin.py), and when the
answer is a task, ``POST /v1/updates`` with the encoded frame
(docs/protocol.md). A refusal (4xx) is final for that frame and reported as
an event; a network fault or 5xx keeps (round, seq) so the next attempt sends
the *same* bytes, which the aggregator answers as a duplicate if the first
one did arrive. Imported by the main loop and unloaded after each report.

    from firmware import wifi
    wifi.report(app, "http://10.0.0.2:8470")     # "accepted round 3 seq 8" / "wait: ..." / "refused 409 ..."
"""

import json

from firmware.app import AppError, unload
from firmware.net import NetError, post


def report(app, url):
    """One check-in and, when given a task, one update; returns what happened in a few words."""
    from firmware import checkin
    body, mac = checkin.checkin_parts(app, "wifi")
    del checkin
    unload()          # the check-in's code goes before the encoder's comes
    hdrs = {"X-Edgelearn-Device": app.device_id, "X-Edgelearn-Mac": mac}
    # replies land behind the update frame in the replay store (firmware/report.py): no 3 KB block
    into = memoryview(app.replay_store)[1024:]
    try:
        status, reply = post(url + "/v1/checkin", body.encode(), hdrs, into=into)
        if status != 200:
            return "checkin refused %d %s" % (status, _problem(reply))
        ans = json.loads(reply)
        if ans.get("action") != "train":
            return "wait: %s" % ans.get("reason", "?")
        rnd = ans["task"]["round_id"]
        pend = app.pending_update
        args = [str(rnd)] if pend is None or pend[0] != rnd else [str(rnd), str(pend[1])]
        from firmware import report as R
        try:
            R.update(app, args)
        except AppError as e:
            return "no update: %s" % e.problem
        seq = int(args[1]) if len(args) > 1 else R.last_seq(app)
        app.pending_update = (rnd, seq)
        frame = memoryview(app.update_buf)[:app.update_len]
        status, reply = post(url + "/v1/updates", frame, {"X-Edgelearn-Device": app.device_id},
                             "application/octet-stream", into=into)
        app.update_buf = None
    except (NetError, ValueError, KeyError) as e:
        return "report failed (%s); the update is kept and sent again" % e
    if status >= 500:
        return "report failed (HTTP %d); the update is kept and sent again" % status
    app.pending_update = None       # accepted, duplicate, or refused for good
    if status == 200:
        return "%s round %d seq %d" % (json.loads(reply).get("status", "?"), rnd, seq)
    return "refused %d %s" % (status, _problem(reply))


def _problem(reply):
    try:
        return json.loads(reply).get("problem", "")
    except ValueError:
        return bytes(reply[:80]).decode()
