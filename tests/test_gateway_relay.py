"""The serial gateway end to end: a MicroPython board on the pty rig, a live aggregator on loopback.

The board (the unix port behind a pseudo-terminal, flashed like a real one)
enrols a keyword from 5 clips streamed over serial, adapts on feedback,
and the gateway relays its signed check-in and its update to a real
aggregator (uvicorn on 127.0.0.1), which accepts it. A resend is a duplicate;
a tampered frame, a second update in the same round, an unprovisioned
board and a revoked one are refused with the aggregator's reason, and the
board keeps its state.
"""

from __future__ import annotations

import json

import pytest

from host.board.fs import DEFAULT_BUNDLE, phrase_clips
from hil.live_aggregator import LiveAggregator, mcu_aggregator_state
from host.board.rigs import micropython_exe, open_rig

pytestmark = [pytest.mark.skipif(not (DEFAULT_BUNDLE / "manifest.json").exists(), reason="MCU bundle not built"),
              pytest.mark.skipif(micropython_exe() is None, reason="MicroPython unix port not installed")]
KEY = bytes(range(40, 72))
DEVICE = "esp32-gw"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from host.flash import flash
    tmp = tmp_path_factory.mktemp("gw")
    state = mcu_aggregator_state(tmp, {DEVICE: KEY})
    agg = LiveAggregator(state)
    agg.state_dir = state  # (test_a_revoked_board_...: `aggregator revoke` on it)
    rig = open_rig("pty")
    t = rig.transport()
    lines = flash(t, DEFAULT_BUNDLE, DEVICE, KEY)
    assert any(line.startswith("MODEL") for line in lines), lines
    link = t.start_firmware()
    yield agg, link
    t.stop_firmware(link)
    t.close()
    rig.close()
    agg.close()


def test_board_update_relayed_and_accepted_bad_frames_refused(setup):
    from edge.portable.wire import AuthError, decode_update
    from host.gateway import Gateway, LinkFailed, RelayRefused
    agg, link = setup
    gw = Gateway(link, agg.url)
    with pytest.raises(LinkFailed, match="nothing learned"):     # the board has nothing to report yet
        gw.relay()

    clips = list(phrase_clips(6)[0].values())[0]
    link.command("enrol kw")
    for pcm in clips[:5]:
        link.command("clip")
        link.send_audio(pcm)
        link.command("shot")
    assert "keyword kw id=0" in link.command("enrolled")
    link.command("clip")
    link.send_audio(clips[5])
    link.command("detect")
    assert "adapted" in link.command("feedback 0")
    before = link.command("status")

    ans = gw.relay()
    assert ans["status"] == "accepted", ans
    (dev, seq, rnd), = agg.updates()
    assert dev == DEVICE and seq == 1
    assert gw.relay(round_id=rnd, seq=seq)["status"] == "duplicate"     # a resend, same bytes

    frame = link.collect_update(rnd)                                       # the board numbers it: seq 2
    assert decode_update(frame, KEY).header.seq == 2
    bad = bytearray(frame)
    bad[len(bad) // 2] ^= 1
    with pytest.raises(AuthError):
        decode_update(bytes(bad), KEY)
    hdr = {"X-Edgelearn-Device": DEVICE}
    with pytest.raises(RelayRefused) as e:
        gw._post("/v1/updates", bytes(bad), hdr)
    assert e.value.status == 401
    with pytest.raises(RelayRefused) as e:                                 # honest, but one per round
        gw._post("/v1/updates", frame, hdr)
    assert e.value.status == 409 and e.value.error == "AlreadyContributed"
    assert len(agg.updates()) == 1
    assert link.command("status").split("heap_free")[0] == before.split("heap_free")[0]


def test_unprovisioned_board_is_refused_at_checkin(setup, tmp_path):
    from host.gateway import Gateway, RelayRefused
    agg, link = setup

    class OtherBoard:  # the same link, but the check-in claims a device the aggregator does not know
        def command(self, text):
            reply = link.command(text)
            return reply.replace(DEVICE, "esp32-stranger") if text == "checkin" else reply

    with pytest.raises(RelayRefused) as e:
        Gateway(OtherBoard(), agg.url).relay()
    assert e.value.status == 401
    assert json.loads(link.command("checkin").split(" body=", 1)[1])["device_id"] == DEVICE


def test_a_revoked_board_is_refused_with_the_reason_and_keeps_its_state(setup):
    """`edgelearn aggregator revoke` on the board's id (a stolen board): its check-in and an update it
    signs are refused 403 DeviceRevoked through the gateway, with the fix (provision again, flash the
    new key), nothing of it is stored (its update in the open round is taken back), and the board
    keeps its state. Last in this file: the revocation
    holds for the module's aggregator."""
    from host.aggregator.setup import revoke
    from host.gateway import Gateway, RelayRefused
    agg, link = setup
    before, stored = link.command("status"), agg.updates()
    rnd = stored[0][2] if stored else 1
    assert not revoke(agg.state_dir, DEVICE)["already"]
    stored = agg.updates()  # its update in the open round taken back (host.aggregator.setup.revoke)
    assert not any(dev == DEVICE for dev, _, _ in stored)
    gw = Gateway(link, agg.url)
    frame = link.collect_update(rnd + 1)
    for call in (gw.relay, lambda: gw._post("/v1/updates", frame, {"X-Edgelearn-Device": DEVICE})):
        with pytest.raises(RelayRefused) as e:
            call()
        assert e.value.status == 403 and e.value.error == "DeviceRevoked", e.value
        assert f"aggregator provision --device {DEVICE}" in e.value.fix and "\n" not in str(e.value)
    assert agg.updates() == stored
    assert link.command("status").split("heap_free")[0] == before.split("heap_free")[0]
