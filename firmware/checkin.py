"""Check-in phase of the firmware: the board's state, signed with its device key.

Imported for ``checkin`` (and by firmware/wifi.py) and unloaded after it
(firmware/app.py ``unload``). ``checkin [NETWORK]`` answers
``ok mac=HEX body=JSON``: the check-in state (docs/protocol.md) and its
HMAC-SHA256 under the device key, for the gateway to POST as is (it never
holds the key).

    from firmware import checkin
    checkin.checkin(app, ["serial"])     # "ok mac=3fa1... body={...}"
"""

import json


def checkin_parts(app, network="serial"):
    """(JSON body, hex HMAC-SHA256 of it under the device key): a check-in anyone may carry."""
    app.need_key()
    from edge.portable.hmac256 import hmac_sha256
    b = app.board
    state = {"device_id": app.device_id, "tier": "mcu", "battery": b.battery_pct() / 100,
             "charging": b.charging(), "temperature": b.temp_c(), "network": network,
             "model_version": app.version}
    body = json.dumps(state)
    return body, "".join("%02x" % x for x in hmac_sha256(app.key, body.encode()))


def checkin(app, args):
    body, mac = checkin_parts(app, args[0] if args else "serial")
    return "ok mac=%s body=%s" % (mac, body)
