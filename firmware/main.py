"""The board's main loop: read link frames from the serial port, answer them, stream audio.

On an ESP32 ``boot.py`` (or the REPL) calls ``run()``; the HIL rig calls it
over the raw REPL. Each frame in (firmware/link.py) gets its replies out;
``quit`` returns to the REPL. A bundle or state problem at boot is reported
as an EVENT frame and the loop still serves ``status`` so the host can see it.

    import main; main.run()                  # on the board
"""

import gc

from firmware import link as L
from firmware.board import make_board


def _send(out, buf, kind, seq, payload):
    n = L.encode_into(buf, kind, seq, payload)
    out.write(memoryview(buf)[:n])


def run(board=None, app_factory=None, max_frames=-1):
    """Serve link frames until ``quit`` (or ``max_frames`` frames). Returns the App."""
    board = board or make_board()
    from firmware.app import App, AppError
    buf = bytearray(L.HEADER_LEN + L.MAX_PAYLOAD + 4)
    inp, out = board.stdin, board.stdout
    out_seq = 0
    app, boot_error = None, ""
    try:
        app = (app_factory or App)(board)
        boot = "boot ok model=%s v=%d" % (app.model_id, app.version)
    except (AppError, ValueError, OSError, MemoryError) as e:
        boot = boot_error = "boot failed: %s" % getattr(e, "problem", e)
    _send(out, buf, L.EVENT, out_seq, boot.encode())
    dec = L.Decoder()
    served = 0
    while served != max_frames:
        space = dec.space()
        n = inp.readinto(space[:dec.need()])
        if not n:
            break  # the link is closed
        dec.filled(n)
        while True:
            try:
                frame = dec.next()
            except L.LinkError as e:
                out_seq += 1
                _send(out, buf, L.NAK, out_seq, b"\xff\xff" + e.problem.encode())
                continue
            if frame is None:
                break
            kind, seq, payload = frame
            served += 1
            if kind == L.CMD and payload == b"quit":
                _send(out, buf, L.ACK, seq, bytes((seq & 0xFF, seq >> 8)) + b"bye")
                return app
            if app is None:
                _send(out, buf, L.NAK, seq, bytes((seq & 0xFF, seq >> 8)) + boot_error.encode())
                continue
            for k, p in app.handle(kind, seq, payload):
                _send(out, buf, k, seq, p)
            gc.collect()
    return app
