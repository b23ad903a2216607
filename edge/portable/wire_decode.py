"""Decoding and checking update frames (the receiver side of ``edge.portable.wire``).

Checks run in a fixed order and the first failure raises its own class:
size (``OversizedFrame``/``TruncatedFrame``), magic and fields
(``MalformedFrame``), version (``UnsupportedVersion``), key and HMAC
(``UnknownDevice``/``AuthError``), then freshness (``ReplayError``,
``StaleRound``, ``StaleModel``), then the authenticated body
(``MalformedFrame``). Nothing is trusted before the HMAC except what is needed
to find the key, and nothing is allocated from a length before it is bounded.
The building blocks are public so ``host/wire_numpy.py`` reuses every check and
only vectorises the payloads.

    from edge.portable.wire import decode_update
    upd = decode_update(frame, keys.get, last_seq=seen.get, round_id=12, model_version=3)
"""

import array
import struct

from edge.portable.hmac256 import HmacSha256, compare_digest
from edge.portable.quant import FLT_MAX
from edge.portable.wire import (_ID_CHARS, CODEC_NAMES, DENSE_F32, HEADER_FMT, HEADER_LEN, INT8,
                                KNOWN_FLAGS, MAGIC, MAX_DEVICE_ID_LEN, MAX_ELEMENTS, MAX_FRAME_LEN,
                                MAX_META, MAX_META_KEY_LEN, MAX_NAME_LEN, MAX_NDIM, MAX_TENSORS,
                                META_FLOAT, META_INT, META_STR, MIN_FRAME_LEN, TAG_LEN,
                                VERSION, Header, Tensor, Update, _valid_id, topk_index_width)
from edge.portable.wire_errors import (AuthError, MalformedFrame, OversizedFrame, ReplayError,
                                       StaleModel, StaleRound, TruncatedFrame, UnknownDevice,
                                       UnsupportedVersion)

_RESEND = "ask the device to resend the whole frame"


def parse_header(frame, max_len=MAX_FRAME_LEN):
    """Check size, magic, version and header fields; returns ``(Header, offset after device id)``.

    The header's ``meta`` is still empty here: metadata is read only after the HMAC.
    """
    n = len(frame)
    if n > max_len:
        raise OversizedFrame("frame is %d bytes, above the %d-byte limit" % (n, max_len),
                             fix="send a smaller update (INT8, TOPK_INT8 or a subset)")
    if n < MIN_FRAME_LEN:
        raise TruncatedFrame("frame is %d bytes, shorter than the %d-byte minimum" % (n, MIN_FRAME_LEN),
                             fix=_RESEND)
    (magic, version, flags, n_tensors, frame_len, round_id, model_version, seq, num_examples,
     id_len, n_meta, reserved) = struct.unpack_from(HEADER_FMT, frame, 0)
    if magic != MAGIC:
        raise MalformedFrame("frame starts with %r, not the update magic %r" % (bytes(magic), MAGIC),
                             fix="this is not an edgelearn update frame")
    if version != VERSION:
        raise UnsupportedVersion("frame has format version %d; this decoder reads version %d"
                                 % (version, VERSION), fix="update the older side (aggregator or firmware)")
    if frame_len > max_len:
        raise OversizedFrame("frame header claims %d bytes, above the %d-byte limit" % (frame_len, max_len),
                             fix="send a smaller update (INT8, TOPK_INT8 or a subset)")
    if n < frame_len:
        raise TruncatedFrame("frame is %d bytes but its header says %d: cut in transit" % (n, frame_len),
                             fix=_RESEND)
    if n > frame_len:
        raise MalformedFrame("frame is %d bytes but its header says %d: %d trailing bytes"
                             % (n, frame_len, n - frame_len), fix="send exactly one frame per message")
    if flags & ~KNOWN_FLAGS or reserved != 0:
        raise MalformedFrame("header flags 0x%02x / reserved 0x%04x use bits format %d does not define"
                             % (flags, reserved, VERSION))
    if n_tensors > MAX_TENSORS or n_meta > MAX_META:
        raise MalformedFrame("header declares %d tensors and %d metadata entries (limits %d and %d)"
                             % (n_tensors, n_meta, MAX_TENSORS, MAX_META))
    end = HEADER_LEN + id_len
    if end > frame_len - TAG_LEN:
        raise MalformedFrame("device id of %d bytes runs past the end of the frame" % id_len)
    idb = bytes(frame[HEADER_LEN:end])
    if not _valid_id(idb, _ID_CHARS, MAX_DEVICE_ID_LEN):
        raise MalformedFrame("device id %r is not 1-%d characters of A-Z a-z 0-9 . _ : -"
                             % (idb, MAX_DEVICE_ID_LEN))
    hdr = Header(idb.decode(), round_id, model_version, seq, num_examples, None, flags)
    hdr.n_tensors = n_tensors
    hdr.n_meta = n_meta
    hdr.frame_len = frame_len
    return hdr, end


def verify_tag(frame, key, device_id):
    """Raise ``UnknownDevice``/``AuthError`` unless the trailer is HMAC-SHA256(key, frame minus tag)."""
    if not isinstance(key, (bytes, bytearray)):
        key = key(device_id)
        if key is None:
            raise UnknownDevice("no key is provisioned for device %r" % device_id,
                                fix="provision the device (its key) before accepting its updates")
    n = len(frame)
    h = HmacSha256(key)
    h.update(memoryview(frame)[:n - TAG_LEN])
    if not compare_digest(h.digest(), frame[n - TAG_LEN:]):
        raise AuthError("HMAC-SHA256 of the frame from %r does not match its trailer" % device_id,
                        fix="the frame was changed in transit or signed with another key; drop it")


def check_fresh(hdr, last_seq=None, round_id=None, model_version=None):
    """Raise ``ReplayError``/``StaleRound``/``StaleModel``; ``last_seq`` may be a callable(device_id)."""
    if last_seq is not None and not isinstance(last_seq, int):
        last_seq = last_seq(hdr.device_id)
    if last_seq is not None and hdr.seq <= last_seq:
        raise ReplayError("frame seq %d from %r is not newer than the last accepted seq %d"
                          % (hdr.seq, hdr.device_id, last_seq),
                          fix="drop it: a replay or a duplicate (devices must increase seq every frame)")
    if round_id is not None and hdr.round_id != round_id:
        raise StaleRound("frame from %r is for round %d but the current round is %d"
                         % (hdr.device_id, hdr.round_id, round_id),
                         fix="drop it; the device should fetch the current round")
    if model_version is not None and hdr.model_version != model_version:
        raise StaleModel("frame from %r was trained from model version %d but the current one is %d"
                         % (hdr.device_id, hdr.model_version, model_version),
                         fix="drop it; the device must install the current bundle first")


def _need(off, size, end, what):
    if off + size > end:
        raise MalformedFrame("frame ends inside %s (needs %d bytes at offset %d, body ends at %d)"
                             % (what, size, off, end))


def parse_meta(frame, off, n_meta, end):
    """Read the metadata block; returns ``(dict, new offset)``. Keys must be strictly ascending."""
    meta = {}
    prev = b""
    for _ in range(n_meta):
        _need(off, 1, end, "a metadata key length")
        klen = frame[off]
        _need(off + 1, klen + 1, end, "a metadata key")
        kb = bytes(frame[off + 1:off + 1 + klen])
        if not _valid_id(kb, _ID_CHARS, MAX_META_KEY_LEN) or kb <= prev:
            raise MalformedFrame("metadata key %r is invalid or not in ascending order" % kb)
        prev = kb
        off += 1 + klen
        kind = frame[off]
        off += 1
        if kind == META_INT or kind == META_FLOAT:
            _need(off, 8, end, "metadata value %r" % kb)
            v = struct.unpack_from("<q" if kind == META_INT else "<d", frame, off)[0]
            if kind == META_FLOAT and not -1.8e308 < v < 1.8e308:
                raise MalformedFrame("metadata %r is %r, not a finite float" % (kb, v))
            off += 8
        elif kind == META_STR:
            _need(off, 1, end, "metadata value %r" % kb)
            vlen = frame[off]
            _need(off + 1, vlen, end, "metadata value %r" % kb)
            try:
                v = bytes(frame[off + 1:off + 1 + vlen]).decode()
            except UnicodeError:
                raise MalformedFrame("metadata %r is not valid UTF-8" % kb)
            off += 1 + vlen
        else:
            raise MalformedFrame("metadata %r has unknown value type %d" % (kb, kind))
        meta[kb.decode()] = v
    return meta, off


def parse_records(frame, off, n_tensors, end):
    """Structure of every tensor record: a list of ``(name, shape, codec, n, payload_offset, payload_len)``."""
    records = []
    names = set()
    total = 0
    for t in range(n_tensors):
        _need(off, 1, end, "tensor %d's name length" % t)
        nlen = frame[off]
        _need(off + 1, nlen + 2, end, "tensor %d's name" % t)
        nb = bytes(frame[off + 1:off + 1 + nlen])
        if not _valid_id(nb, None, MAX_NAME_LEN):
            raise MalformedFrame("tensor %d's name %r is not 1-%d printable ASCII characters"
                                 % (t, nb, MAX_NAME_LEN))
        name = nb.decode()
        if name in names:
            raise MalformedFrame("tensor %r appears twice" % name)
        names.add(name)
        off += 1 + nlen
        codec, ndim = frame[off], frame[off + 1]
        off += 2
        if codec not in CODEC_NAMES:
            raise MalformedFrame("tensor %r has unknown codec id %d" % (name, codec))
        if ndim > MAX_NDIM:
            raise MalformedFrame("tensor %r has %d dimensions, at most %d" % (name, ndim, MAX_NDIM))
        _need(off, 4 * ndim + 4, end, "tensor %r's shape" % name)
        shape = struct.unpack_from("<%dI" % ndim, frame, off)
        off += 4 * ndim
        plen = struct.unpack_from("<I", frame, off)[0]
        off += 4
        n = 1
        for d in shape:
            n *= d
            if n > MAX_ELEMENTS:
                break
        total += n
        if total > MAX_ELEMENTS:
            raise MalformedFrame("tensor %r takes the frame past %d elements" % (name, MAX_ELEMENTS))
        _need(off, plen, end, "tensor %r's payload" % name)
        if codec == DENSE_F32:
            want = 4 * n
        elif codec == INT8:
            want = 4 + n
        else:
            _need(off, 8, off + plen, "tensor %r's top-k count" % name)
            k = struct.unpack_from("<I", frame, off)[0]
            if k > n:
                raise MalformedFrame("tensor %r sends top-%d of only %d elements" % (name, k, n))
            want = 8 + k * (topk_index_width(n) + 1)
        if plen != want:
            raise MalformedFrame("tensor %r (%s, shape %r) has a %d-byte payload, expected %d"
                                 % (name, CODEC_NAMES[codec], shape, plen, want))
        records.append((name, tuple(shape), codec, n, off, plen))
        off += plen
    if off != end:
        raise MalformedFrame("%d unexpected bytes after the last tensor" % (end - off))
    return records


def check_scale(name, scale):
    if not 0.0 <= scale <= FLT_MAX:
        raise MalformedFrame("tensor %r has scale %r; scales are finite and >= 0" % (name, scale))


def _int8_into(frame, off, k, scale, out, idx, name):
    for j in range(k):
        q = frame[off + j]
        if q == 0x80:
            raise MalformedFrame("tensor %r holds int8 -128; the codec's range is [-127, 127]" % name)
        out[j if idx is None else idx[j]] = (q - 256 if q > 127 else q) * scale


def decode_payload(frame, record):
    """One tensor's values as a flat ``array('f')``; raises ``MalformedFrame`` on bad content."""
    name, shape, codec, n, off, plen = record
    if codec == DENSE_F32:
        out = array.array("f", bytes(frame[off:off + plen]))
        for v in out:
            if not -FLT_MAX <= v <= FLT_MAX:
                raise MalformedFrame("tensor %r holds %r; values must be finite" % (name, v))
        return out
    out = array.array("f", bytes(4 * n))
    if codec == INT8:
        scale = struct.unpack_from("<f", frame, off)[0]
        check_scale(name, scale)
        _int8_into(frame, off + 4, n, scale, out, None, name)
        return out
    k, scale = struct.unpack_from("<If", frame, off)
    check_scale(name, scale)
    width = topk_index_width(n)
    idx = array.array("H" if width == 2 else "I", bytes(frame[off + 8:off + 8 + k * width]))
    prev = -1
    for i in idx:
        if i <= prev or i >= n:
            raise MalformedFrame("tensor %r: top-k index %d is out of order or >= %d" % (name, i, n))
        prev = i
    _int8_into(frame, off + 8 + k * width, k, scale, out, idx, name)
    return out


def decode_update(frame, key, last_seq=None, round_id=None, model_version=None,
                  max_len=MAX_FRAME_LEN):
    """Check and decode one frame; returns an ``Update`` or raises a ``WireError`` subclass.

    ``key``: the device key (bytes) or a callable ``device_id -> bytes | None``.
    ``last_seq``: the last accepted seq (or a callable ``device_id -> int | None``);
    ``seq`` must be greater. ``round_id``/``model_version``: the current ones,
    or None to skip that check. Pure: the caller records ``seq`` once it accepts.
    """
    return decode_frame(frame, key, last_seq, round_id, model_version, max_len, decode_payload)


def decode_frame(frame, key, last_seq, round_id, model_version, max_len, payload):
    """Every check in order, then ``payload(frame, record)`` for each tensor's values."""
    hdr, off = parse_header(frame, max_len)
    verify_tag(frame, key, hdr.device_id)
    check_fresh(hdr, last_seq, round_id, model_version)
    end = hdr.frame_len - TAG_LEN
    hdr.meta, off = parse_meta(frame, off, hdr.n_meta, end)
    records = parse_records(frame, off, hdr.n_tensors, end)
    return Update(hdr, [Tensor(r[0], r[1], r[2], payload(frame, r)) for r in records])
