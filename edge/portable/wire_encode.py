"""The update frame's encoder: what a client needs to send one (the board loads only this).

Everything of docs/wire-format.md a sender needs: ``Header``, the checks,
``plan_update``/``write_update`` and ``encode_update[_into]``. The public
API is ``edge.portable.wire``, which re-exports all of this beside the
decoder, ``Tensor``/``Update`` and the format's named constants.

This module is kept small in *names* as well as code because a board interns
every name a module mentions (qstrs, never freed; on the 64-bit unix port a
growth of the name table past 620 entries is a 7 KB block): the format's
constants are private ``const()`` here, folded into the bytecode, and
``edge.portable.wire`` defines the public ones (tests/test_firmware.py checks that
both agree). Only the three a board passes in are public here.

    from edge.portable.wire_encode import FLAG_DELTA, FLAG_SUBSET, INT8, Header, encode_update_into
    hdr = Header("esp32-07", 12, 3, 41, num_examples=25, flags=FLAG_SUBSET | FLAG_DELTA)
    n = encode_update_into(buf, hdr, [("proto/bias", (4,), bias)], key, codec=INT8)
"""

import array
import struct
import sys

from edge.portable.compat import IS_MICROPYTHON, const, crc32
from edge.portable.hmac256 import HmacSha256
from edge.portable.quant import FLT_MAX, Lfib24, quantize_into, symmetric_scale
from edge.portable.wire_errors import EncodeError

if sys.byteorder != "little":  # every supported board (Xtensa, RISC-V, ARM, x86) is little-endian
    raise ImportError("edge.portable.wire needs a little-endian CPU")

# the format's constants (docs/wire-format.md); edge.portable.wire has them under public names
_VERSION = const(1)
_HEADER_LEN = const(32)
_TAG_LEN = const(32)
_MAX_FRAME_LEN = const(262144)   # 256 KiB: a dense float32 DS-CNN-S (~24k params) fits 2.5 times
_MAX_ELEMENTS = const(1048576)   # decoded floats per frame (4 MiB), bounds top-k's dense output
_MAX_TENSORS = const(256)
_MAX_NDIM = const(6)
_MAX_NAME_LEN = const(64)
_MAX_DEVICE_ID_LEN = const(32)
_MAX_META = const(16)
_MAX_META_KEY_LEN = const(32)
_MAX_META_STR_LEN = const(255)

_DENSE_F32 = const(1)
INT8 = const(2)
_TOPK_INT8 = const(3)

FLAG_SUBSET = const(1)   # tensors not in the frame are unchanged (bias/adapter-only updates)
FLAG_DELTA = const(2)    # values are deltas from the base model, not absolute weights
_KNOWN_FLAGS = const(3)

_META_INT = const(1)
_META_FLOAT = const(2)
_META_STR = const(3)

_ID_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-"


class Header:
    """Who sent an update, for which round and base model, and how many examples it saw."""

    def __init__(self, device_id, round_id, model_version, seq, num_examples=0, meta=None,
                 flags=FLAG_DELTA):
        self.device_id = device_id
        self.round_id = round_id
        self.model_version = model_version
        self.seq = seq
        self.num_examples = num_examples
        self.meta = meta if meta is not None else {}
        self.flags = flags

    @property
    def subset(self):
        return bool(self.flags & FLAG_SUBSET)

    def __repr__(self):
        return "Header(%r, round_id=%d, model_version=%d, seq=%d, num_examples=%d, flags=%d)" % (
            self.device_id, self.round_id, self.model_version, self.seq, self.num_examples,
            self.flags)


def default_seed(header):
    """Rounding seed derived from (device id, round, seq), so every frame gets fresh noise."""
    return crc32(struct.pack("<II", header.round_id & 0xFFFFFFFF, header.seq & 0xFFFFFFFF),
                 crc32(header.device_id.encode()))


# --- validation shared by encoder and decoder ------------------------------

def _valid_id(b, allowed, max_len):
    if not 1 <= len(b) <= max_len:
        return False
    for c in b:
        if allowed is None:
            if c < 0x21 or c > 0x7E:
                return False
        elif c not in allowed:
            return False
    return True


def _u32(x):
    return isinstance(x, int) and 0 <= x <= 0xFFFFFFFF


def _num_elements(shape):
    n = 1
    for d in shape:
        n *= d
        if n > _MAX_ELEMENTS:
            return -1
    return n


def check_header(h):
    """Raise ``EncodeError`` unless every field of ``h`` fits the wire format."""
    if not isinstance(h.device_id, str) or not _valid_id(h.device_id.encode(), _ID_CHARS,
                                                         _MAX_DEVICE_ID_LEN):
        raise EncodeError("device id %r is not 1-%d characters of A-Z a-z 0-9 . _ : -"
                          % (h.device_id, _MAX_DEVICE_ID_LEN), fix="provision a shorter plain id")
    for field in ("round_id", "model_version", "seq", "num_examples"):
        if not _u32(getattr(h, field)):
            raise EncodeError("%s=%r is not an integer in [0, 2**32)" % (field, getattr(h, field)))
    if not isinstance(h.flags, int) or h.flags & ~_KNOWN_FLAGS:
        raise EncodeError("flags=%r has bits outside 0x%02x" % (h.flags, _KNOWN_FLAGS))


def encode_meta(meta):
    """The metadata block's bytes (count is in the header); raises ``EncodeError``."""
    if len(meta) > _MAX_META:
        raise EncodeError("%d metadata entries, at most %d fit" % (len(meta), _MAX_META))
    out = bytearray()
    for key in sorted(meta):  # sorted: same bytes whatever the dict's iteration order
        value = meta[key]
        kb = key.encode() if isinstance(key, str) else b""
        if not _valid_id(kb, _ID_CHARS, _MAX_META_KEY_LEN):
            raise EncodeError("metadata key %r is not 1-%d characters of A-Z a-z 0-9 . _ : -"
                              % (key, _MAX_META_KEY_LEN))
        out.append(len(kb))
        out.extend(kb)
        if isinstance(value, bool) or isinstance(value, int):
            if not -(1 << 63) <= value < (1 << 63):
                raise EncodeError("metadata %r=%r does not fit a signed 64-bit int" % (key, value))
            out.append(_META_INT)
            out.extend(struct.pack("<q", int(value)))
        elif isinstance(value, float):
            out.append(_META_FLOAT)
            out.extend(struct.pack("<d", value))
        elif isinstance(value, str):
            vb = value.encode()
            if len(vb) > _MAX_META_STR_LEN:
                raise EncodeError("metadata %r is %d bytes of UTF-8, at most %d fit"
                                  % (key, len(vb), _MAX_META_STR_LEN))
            out.append(_META_STR)
            out.append(len(vb))
            out.extend(vb)
        else:
            raise EncodeError("metadata %r has type %s; use int, float or str"
                              % (key, type(value).__name__))
    return out


# --- encoding --------------------------------------------------------------

def _codec_for(codec, name):
    c = codec.get(name, INT8) if isinstance(codec, dict) else codec
    if c not in (_DENSE_F32, INT8, _TOPK_INT8):
        raise EncodeError("tensor %r: unknown codec %r" % (name, c),
                          fix="use DENSE_F32, INT8 or TOPK_INT8")
    return c


def _max_abs(name, values):
    m = 0.0
    for v in values:
        a = v if v >= 0 else -v
        if not a <= FLT_MAX:  # also catches NaN, for which every comparison is False
            raise EncodeError("tensor %r holds %r, not a finite float32" % (name, v),
                              fix="clip or drop the update; a diverged step must not reach the aggregator")
        if a > m:
            m = a
    return m


def check_tensor(name, shape, names, total):
    """Check one tensor's name (unique in ``names``, which it joins) and shape; ``(name bytes, shape, n, total)``."""
    nb = name.encode() if isinstance(name, str) else b""
    if not _valid_id(nb, None, _MAX_NAME_LEN):
        raise EncodeError("tensor name %r is not 1-%d printable ASCII characters without spaces"
                          % (name, _MAX_NAME_LEN))
    if name in names:
        raise EncodeError("tensor %r appears twice" % name)
    names.add(name)
    shape = tuple(shape)
    if len(shape) > _MAX_NDIM or not all(_u32(d) for d in shape):
        raise EncodeError("tensor %r: shape %r is not up to %d non-negative u32 dims"
                          % (name, shape, _MAX_NDIM))
    n = _num_elements(shape)
    total += n
    if n < 0 or total > _MAX_ELEMENTS:
        raise EncodeError("tensor %r pushes the frame past %d elements" % (name, _MAX_ELEMENTS),
                          fix="send a subset (only=) or split the update")
    return nb, shape, n, total


def _is_f32_array(values):
    # MicroPython arrays have no .typecode: a 4-byte item that reads back as a float is 'f'.
    return isinstance(values, array.array) and len(values) > 0 and isinstance(values[0], float) \
        and len(bytes(memoryview(values)[0:1])) == 4


def topk_index_width(n):
    """Bytes per top-k index: 2 when every index fits a u16, else 4."""
    return 2 if n <= 65536 else 4


def plan_update(header, tensors, codec=INT8, topk=None, only=None, max_len=_MAX_FRAME_LEN):
    """Validate everything and size the frame, changing no state; returns a plan for ``write_update``."""
    check_header(header)
    idb = header.device_id.encode()
    meta = encode_meta(header.meta)
    flags = header.flags
    if only is not None:
        flags |= FLAG_SUBSET
        keep = only if callable(only) else (lambda n, s=set(only): n in s)
        tensors = [t for t in tensors if keep(t[0])]
    if len(tensors) > _MAX_TENSORS:
        raise EncodeError("%d tensors, at most %d fit one frame" % (len(tensors), _MAX_TENSORS))
    size = _HEADER_LEN + len(idb) + len(meta)
    total = 0
    names = set()
    entries = []
    for name, shape, values in tensors:
        nb, shape, n, total = check_tensor(name, shape, names, total)
        if len(values) != n:
            raise EncodeError("tensor %r has %d values but shape %r needs %d"
                              % (name, len(values), shape, n))
        if not _is_f32_array(values):
            values = array.array("f", values)  # the wire's inputs are float32 by definition
        c = _codec_for(codec, name)
        m = _max_abs(name, values)
        if c == _DENSE_F32:
            plen, extra = 4 * n, None
        elif c == INT8:
            plen, extra = 4 + n, symmetric_scale(m)
        else:
            if topk is None:
                raise EncodeError("tensor %r uses TOPK_INT8 but no TopKEncoder was given" % name,
                                  fix="pass topk=TopKEncoder(fraction=...) and keep it across rounds")
            extra = (topk, topk.select(name, values))
            plen = 8 + len(extra[1][1]) * (topk_index_width(n) + 1)
        size += 1 + len(nb) + 2 + 4 * len(shape) + 4 + plen
        entries.append((nb, shape, c, values, plen, extra))
    size += _TAG_LEN
    if size > max_len:
        raise EncodeError("the frame would be %d bytes, above the %d-byte limit" % (size, max_len),
                          fix="use INT8 or TOPK_INT8, or send a subset (only=)")
    return (header, idb, meta, flags, entries, size)


def write_update(plan, buf, key, seed=None):
    """Write a planned frame into ``buf`` (at least ``plan[5]`` bytes); returns its length."""
    header, idb, meta, flags, entries, size = plan
    h = HmacSha256(key)  # a bad key fails here, before any residual changes
    if len(buf) < size:
        raise EncodeError("buffer of %d bytes is too small for a %d-byte frame" % (len(buf), size))
    rng = Lfib24(default_seed(header) if seed is None else seed)
    # edge.portable.wire.HEADER_FMT and MAGIC, written out: a global would be one more name
    struct.pack_into("<4sBBHIIIIIBBH", buf, 0, b"ELUP", _VERSION, flags, len(entries), size,
                     header.round_id, header.model_version, header.seq, header.num_examples,
                     len(idb), len(header.meta), 0)
    off = _HEADER_LEN
    buf[off:off + len(idb)] = idb
    off += len(idb)
    buf[off:off + len(meta)] = meta
    off += len(meta)
    for nb, shape, c, values, plen, extra in entries:
        buf[off] = len(nb)
        buf[off + 1:off + 1 + len(nb)] = nb
        off += 1 + len(nb)
        buf[off] = c
        buf[off + 1] = len(shape)
        off += 2
        for d in shape:
            struct.pack_into("<I", buf, off, d)
            off += 4
        struct.pack_into("<I", buf, off, plen)
        off += 4
        if c == _DENSE_F32:
            for v in values:
                struct.pack_into("<f", buf, off, v)
                off += 4
        elif c == INT8:
            struct.pack_into("<f", buf, off, extra)
            off = quantize_into(values, extra, buf, off + 4, rng)
        else:
            off = extra[0].write(values, extra[1], buf, off, rng, topk_index_width(len(values)))
    mv = memoryview(buf)
    h.update(mv[:size - _TAG_LEN])
    buf[size - _TAG_LEN:size] = h.digest()
    return size


def encode_update_into(buf, header, tensors, key, codec=INT8, topk=None, only=None, seed=None,
                       max_len=_MAX_FRAME_LEN):
    """The MCU path: encode into a caller-owned ``bytearray`` reused every round; returns the length."""
    plan = plan_update(header, tensors, codec, topk, only, min(max_len, len(buf)))
    return write_update(plan, buf, key, seed)


def encode_update(header, tensors, key, codec=INT8, topk=None, only=None, seed=None,
                  max_len=_MAX_FRAME_LEN):
    """Encode ``tensors`` (a list of ``(name, shape, flat_values)``) into one authenticated frame.

    ``codec`` is one codec id or ``{name: codec}`` (INT8 for names not in it);
    ``topk`` is the ``TopKEncoder`` that keeps each tensor's error-feedback
    residual; ``only`` (names or a predicate) sends a subset and sets
    ``FLAG_SUBSET``; ``seed`` fixes the rounding noise (default: from the
    header). Returns ``bytes`` on CPython and the ``bytearray`` itself on
    MicroPython, where a copy would double the peak heap.
    """
    plan = plan_update(header, tensors, codec, topk, only, max_len)
    buf = bytearray(plan[5])
    write_update(plan, buf, key, seed)
    return buf if IS_MICROPYTHON else bytes(buf)
