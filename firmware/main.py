"""The board's main loops: serve the serial link (gateway mode) or listen on the microphone (standalone).

``run()`` reads link frames from the serial port and answers them until
``quit``; the HIL rig and ``edgelearn flash`` drive the board this way, and the
host streams audio. ``listen()`` runs without a host: it reads the microphone
(``board.read_audio``: I2S on an ESP32, a WAV on the unix port's FakeBoard)
one 20 ms hop at a time into a preallocated buffer, detects every 0.5 s, sends
detections as EVENT frames on the serial port (for whoever listens), and
when ``config.json`` names an aggregator and Wi-Fi, checks in and reports an
update over HTTP every ``report_every_s`` seconds of audio (firmware/wifi.py).
A bundle or state problem at boot is reported as an EVENT frame; ``run``
still serves ``status`` so the host can see it.

    import main; main.run()                  # on the board, from boot.py: gateway mode
    import main; main.listen()               # standalone: microphone + Wi-Fi
"""

import gc
import json

from edge.portable import link as L
from firmware.board import make_board, read_file

HOP_BYTES = 640          # 320 samples: one MFCC hop, so detection latency is one hop


def _send(out, buf, kind, seq, payload):
    n = L.encode_into(buf, kind, seq, payload)
    out.write(memoryview(buf)[:n])


def _boot(board, app_factory, out, buf):
    from firmware.app import App, AppError
    try:
        app = (app_factory or App)(board)
        boot, err = "boot ok model=%s v=%d" % (app.model_id, app.version), ""
    except (AppError, ValueError, OSError, MemoryError) as e:
        app, boot = None, "boot failed: %s" % getattr(e, "problem", e)
        err = boot
    _send(out, buf, L.EVENT, 0, boot.encode())
    return app, err


def run(board=None, app_factory=None, max_frames=-1):
    """Serve link frames until ``quit`` (or ``max_frames`` frames). Returns the App."""
    board = board or make_board()
    buf = bytearray(L.HEADER_LEN + L.MAX_PAYLOAD + 4)
    inp, out = board.stdin, board.stdout
    out_seq = 0
    app, boot_error = _boot(board, app_factory, out, buf)
    dec = L.Decoder(L.HEADER_LEN + L.MAX_PAYLOAD + 4)   # reads stop at a frame's end: one frame is enough
    served = 0
    while served != max_frames:
        space = dec.space()
        n = inp.readinto(space[:dec.need()])
        if not n:
            break  # the link is closed
        dec.filled(n)
        while True:
            try:
                frame = dec.next(copy=False)
            except L.LinkError as e:
                out_seq += 1
                _send(out, buf, L.NAK, out_seq, b"\xff\xff" + e.problem.encode())
                continue
            if frame is None:
                break
            kind, seq, payload = frame
            served += 1
            if kind == L.CMD and len(payload) == 4 and bytes(payload) == b"quit":
                _send(out, buf, L.ACK, seq, bytes((seq & 0xFF, seq >> 8)) + b"bye")
                return app
            if app is None:
                _send(out, buf, L.NAK, seq, bytes((seq & 0xFF, seq >> 8)) + boot_error.encode())
                continue
            for k, p in app.handle(kind, seq, payload):
                _send(out, buf, k, seq, p)
            gc.collect()
    return app


def wifi_config(board):
    """(aggregator URL, report period in s of audio) when config.json asks for Wi-Fi and it connects."""
    cfg = json.loads(read_file(board.path("config.json")) or b"{}")
    url, wifi = cfg.get("aggregator"), cfg.get("wifi")
    if not url or not wifi:
        return None, 0
    if not board.connect_wifi(wifi.get("ssid", ""), wifi.get("password", "")):
        return None, 0
    return url.rstrip("/"), int(cfg.get("report_every_s", 3600))


def listen(board=None, app_factory=None, max_s=-1):
    """Microphone in, detections out (EVENT frames), updates over Wi-Fi; until the audio ends or ``max_s``."""
    board = board or make_board()
    buf = bytearray(L.HEADER_LEN + 256 + 4)        # events are short
    out = board.stdout
    app, _ = _boot(board, app_factory, out, buf)
    if app is None:
        return None
    url, every = wifi_config(board)
    if url is None:
        app.events.append("no Wi-Fi aggregator configured: detecting only")
    else:
        app.events.append("wifi ok, reporting to %s every %d s" % (url, every))
    app.live = True
    pcm, view = app.pcm, memoryview(app.pcm_bytes)[:HOP_BYTES]
    hops = since = 0
    per_s = 16000 * 2 // HOP_BYTES
    while max_s < 0 or hops < max_s * per_s:
        n = board.read_audio(view)
        if not n:
            break  # the audio source ended (a WAV on the unix port)
        app.push_audio(pcm, n // 2)
        hops += 1
        since += 1
        if url is not None and since >= every * per_s:
            since = 0
            from firmware import wifi
            from firmware.app import unload
            app.events.append("report: " + wifi.report(app, url))
            del wifi
            unload()
        while app.events:
            _send(out, buf, L.EVENT, hops & 0xFFFF, app.events.pop(0).encode()[:256])
    return app
