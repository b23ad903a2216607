"""Hardware in the loop over a real serial path: flash, on-board checks, enrol from WAVs, detect, update.

Runs on the pty rig by default (the unix port behind a pseudo-terminal) and
on a real board with ``--port``. Every byte goes through mpremote's serial
transport (raw REPL, raw paste) and then through the firmware's framed link.
"""

from __future__ import annotations

import numpy as np
import pytest

from edge.audio import read_wav, write_wav
from edge.portable.wire import AuthError, decode_update
from host.board.fs import DEFAULT_BUNDLE, phrase_clips
from host.board.rigs import open_rig

pytestmark = pytest.mark.skipif(not (DEFAULT_BUNDLE / "manifest.json").exists(), reason="MCU bundle not built")
KEY = bytes(range(7, 39))

ON_BOARD_CHECKS = """
from edge.portable.wire import Header, encode_update, decode_update, AuthError, INT8
from edge.portable import kernels
import array, gc
v = array.array('f', [0.5, -0.25, 0.125])
f = encode_update(Header('hil', 1, 1, 2), [('b', (3,), v)], b'k' * 32, codec=INT8)
u = decode_update(f, b'k' * 32)
bad = bytearray(f); bad[-1] ^= 1
try:
    decode_update(bytes(bad), b'k' * 32)
    print('TAMPER-NOT-DETECTED')
except AuthError:
    print('TAMPER-OK')
print('WIRE-OK', [round(x, 2) for x in u.tensors[0].values])
print('PAD', kernels.same_padding(23, 5, 2))
gc.collect(); print('FREE', gc.mem_free())
"""


@pytest.fixture()
def board(rig_name, tmp_path):
    from host.flash import flash
    rig = open_rig(rig_name)
    t = rig.transport()
    lines = flash(t, DEFAULT_BUNDLE, "esp32-hil", KEY)
    assert any(line.startswith("MODEL") for line in lines), lines
    yield rig, t
    t.close()
    rig.close()


def wavs(tmp_path):
    clips, _ = phrase_clips(6)
    out = {}
    for name, pcms in clips.items():
        out[name] = []
        for i, pcm in enumerate(pcms):
            p = tmp_path / f"{name}-{i}.wav"
            write_wav(p, pcm)
            out[name].append(p)
    return out


def test_on_board_checks(board):
    _, t = board
    out = t.exec(ON_BOARD_CHECKS)
    assert "TAMPER-OK" in out and "WIRE-OK [0.5, -0.25, 0.13]" in out and "PAD (12, 2)" in out


def test_enrol_detect_update_over_serial(board, tmp_path):
    rig, t = board
    files = wavs(tmp_path)
    (a, fa), (b, fb) = list(files.items())
    link = t.start_firmware()
    assert any(e.startswith("boot ok") for e in link.events), link.events
    assert link.command("enrol kw").startswith("ok")
    for p in fa[:5]:
        link.command("clip")
        assert link.send_audio(read_wav(p)) == 49
        assert link.command("shot").startswith("ok shot")
    assert "keyword kw id=0" in link.command("enrolled")
    cos = {}
    for name, p in ((a, fa[5]), (b, fb[0])):
        link.command("clip")
        link.send_audio(read_wav(p))
        cos[name] = float(link.command("detect").split("cos=")[1].split()[0])
    assert cos[a] > cos[b]
    assert "adapted" in link.command("feedback 0")

    # a frame damaged on the wire is NAKed by the board and resent by the host
    def damage(wire, attempt):
        return wire if attempt else wire[:-1] + bytes([wire[-1] ^ 0xFF])
    assert link.command("status", corrupt=damage).startswith("ok model=")
    assert link.link_errors >= 1

    frame = link.collect_update(round_id=2, seq=5)
    upd = decode_update(frame, KEY, round_id=2)
    assert upd.header.device_id == "esp32-hil" and upd.tensors[0].name == "proto/bias"
    assert upd.tensors[0].values[0] != 0.0          # the adapted bias travelled
    bad = bytearray(frame)
    bad[len(bad) // 2] ^= 1
    with pytest.raises(AuthError):
        decode_update(bytes(bad), KEY)
    assert link.collect_update(round_id=2, seq=5) == frame   # a resend is byte-identical
    assert t.stop_firmware(link) == "bye"


def test_reset_mid_transfer_keeps_the_running_bundle(board, tmp_path):
    rig, t = board
    if rig.kind != "pty":
        pytest.skip("a hard reset mid-transfer needs the pty rig (it kills the process)")
    from host.board.fs import board_files
    files = board_files(tmp_path / "w", DEFAULT_BUNDLE, "esp32-hil", KEY)
    blob = [f for f in files if f[1] == "bundle.new/weights.elb"][0]
    raw = blob[0].read_bytes()
    half = tmp_path / "half.elb"
    half.write_bytes(raw[: len(raw) // 2])
    t.put(half, "bundle.new/weights.elb")             # the transfer is cut here ...
    t.put([f for f in files if f[1] == "bundle.new/bundle.json"][0][0], "bundle.new/bundle.json")
    t.close()
    rig.reset()                                        # ... and the board resets
    t2 = rig.transport()
    link = t2.start_firmware()
    assert link.command("status").startswith("ok model=")   # the old bundle still runs
    assert any("bundle rejected" in e and "digest" in e for e in link.events), link.events
    t2.stop_firmware(link)
    t2.close()


def test_pty_board_runs_the_firmware_from_flash(board):
    """The pty board holds the code in its ROMFS image (the ESP32's flash); flash() copied none of it."""
    rig, t = board
    if rig.kind != "pty":
        pytest.skip("a real board's code location depends on its build")
    out = t.exec("import os, firmware.app\nprint(firmware.app.__file__)\nprint(sorted(os.listdir()))").split("\n")
    assert out[0].strip() == "/rom/firmware/app.mpy", out
    assert "firmware" not in out[1] and "edge" not in out[1] and "bundle" in out[1], out
