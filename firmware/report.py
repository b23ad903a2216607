"""Report phase of the firmware: encode the bias-only update, number updates, chunk them.

Imported for ``update`` and unloaded after it (firmware/app.py ``unload``): the
wire encoder, HMAC and chunking are needed once per round. Check-ins are
firmware/checkin.py (a phase of their own: every name a phase module holds is
interned on the board for good, so the update does not carry the check-in's).

``update ROUND [SEQ]`` encodes ``proto/bias`` as an INT8 ``SUBSET|DELTA``
frame (docs/wire-format.md) signed with the device key. Without ``SEQ`` the
board numbers it itself, one more than the last it sent, and keeps that number
in ``state/seq.bin`` before answering (the aggregator refuses a sequence number
that is not newer, and the board is the only party that survives a host
restart). The same ``ROUND SEQ`` again gives the same bytes (the rounding
seed comes from the header), so a gateway can ask for a lost chunk again.

    from firmware import report
    report.update(app, ["3"])          # "ok update 131 bytes seq=8"
"""

import struct

from edge.portable.compat import const
from firmware.app import MAX_KEYWORDS, AppError
from firmware.board import read_file

_UPDATE_BYTES = const(1024)   # one bias-only update (<= MAX_KEYWORDS values) fits with room to spare
_CHUNK_BYTES = const(256)


def last_seq(app):
    raw = read_file(app.board.path("state/seq.bin"))
    return struct.unpack("<I", raw)[0] if raw is not None and len(raw) == 4 else 0


def update(app, args):
    app.need_key()
    try:
        round_id = int(args[0])
        seq = int(args[1]) if len(args) > 1 else None
    except (IndexError, ValueError):
        raise AppError("update needs ROUND [SEQ]", "send: update 3, or update 3 17 to repeat seq 17")
    if not app.head.count or not app.replay_count:
        raise AppError("nothing learned yet: no custom keyword", "enrol a keyword (enrol NAME, 5 x shot, enrolled) first")
    from edge.portable.wire_encode import FLAG_DELTA, FLAG_SUBSET, INT8, Header, encode_update_into
    last = last_seq(app)
    if seq is None:
        seq = last + 1
    hdr = Header(app.device_id, round_id, app.version, seq, num_examples=app.replay_count,
                 flags=FLAG_SUBSET | FLAG_DELTA)
    # the frame goes into the replay store, the boot-time 4 KB buffer learning reads flash into:
    # no 1 KB block to find late in a fragmented heap (learning re-reads it before use)
    buf = memoryview(app.replay_store)[:_UPDATE_BYTES]
    n = encode_update_into(buf, hdr, [("proto/bias", (MAX_KEYWORDS,), app.head.bias)], app.key, codec=INT8)
    if seq > last:
        app.save("seq.bin", struct.pack("<I", seq))   # before the frame leaves: a number is never reused
    app.update_buf, app.update_len = buf, n
    return "ok update %d bytes seq=%d" % (n, seq)


def chunks(app):
    """The last update as (UPDATE, chunk) link frames; resends are byte-identical, so they merge."""
    from edge.portable.chunks import iter_chunks
    from edge.portable.link import UPDATE
    frame = memoryview(app.update_buf)[:app.update_len]
    out = [(UPDATE, bytes(c)) for c in iter_chunks(frame, _CHUNK_BYTES)]
    app.update_buf = None
    return out
