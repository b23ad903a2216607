"""The federated-update frame: encode on any client, decode on the aggregator.

One implementation for CPython and MicroPython (docs/wire-format.md is the
byte-level spec; ``host/wire_numpy.py`` is a vectorised twin for the host).
A frame is a 32-byte header, the device id, a small key/value metadata block,
a list of tensors each with its own codec (``DENSE_F32``, ``INT8`` with
seeded stochastic rounding, ``TOPK_INT8`` with error feedback kept by a
``TopKEncoder``), and an HMAC-SHA256 trailer with the device's key.
Decoding is pure: it returns an ``Update`` or raises one ``WireError``
subclass naming the check that failed, and changes no state.

The encoder itself is ``edge.portable.wire_encode`` (re-exported here), the
decoder ``edge.portable.wire_decode``: a board that only sends loads the
encoder alone, not this module's names.

    from edge.portable.wire import Header, encode_update, decode_update, INT8
    hdr = Header("esp32-07", round_id=12, model_version=3, seq=41, num_examples=25)
    frame = encode_update(hdr, [("head/bias", (12,), bias_values)], key, codec=INT8)
    upd = decode_update(frame, key, last_seq=40, round_id=12, model_version=3)
    upd.tensors[0].values      # array('f'), dequantised
"""

from edge.portable.compat import const
# the error classes are re-exported so ``from edge.portable.wire import AuthError`` works
from edge.portable.wire_errors import (AuthError, EncodeError, MalformedFrame,  # noqa: F401
                                       OversizedFrame, ReplayError, StaleModel, StaleRound,
                                       TruncatedFrame, UnknownDevice, UnsupportedVersion)
from edge.portable.wire_encode import (_ID_CHARS, FLAG_DELTA, FLAG_SUBSET, INT8,  # noqa: F401
                                       Header, _codec_for, _is_f32_array, _max_abs, _num_elements,
                                       _u32, _valid_id, check_header, check_tensor, default_seed,
                                       encode_meta, encode_update, encode_update_into, plan_update,
                                       topk_index_width, write_update)


def __getattr__(name):
    # ``TopKEncoder`` is part of this module's API, imported on first use: a board that
    # sends only INT8 updates does not hold its code
    if name == "TopKEncoder":
        from edge.portable.wire_topk import TopKEncoder
        return TopKEncoder
    raise AttributeError(name)


# the format's constants (docs/wire-format.md); edge.portable.wire_encode has the same values
# as private constants (a board interns no names for them); tests/test_firmware_manifest.py checks both agree
MAGIC = b"ELUP"
VERSION = const(1)
HEADER_FMT = "<4sBBHIIIIIBBH"
HEADER_LEN = const(32)
TAG_LEN = const(32)
MAX_FRAME_LEN = const(262144)   # 256 KiB: a dense float32 DS-CNN-S (~24k params) fits 2.5 times
MAX_ELEMENTS = const(1048576)   # decoded floats per frame (4 MiB), bounds top-k's dense output
MAX_TENSORS = const(256)
MAX_NDIM = const(6)
MAX_NAME_LEN = const(64)
MAX_DEVICE_ID_LEN = const(32)
MAX_META = const(16)
MAX_META_KEY_LEN = const(32)
MAX_META_STR_LEN = const(255)
MIN_FRAME_LEN = const(65)       # header + 1-byte device id + tag

DENSE_F32 = const(1)
TOPK_INT8 = const(3)
CODEC_NAMES = {DENSE_F32: "dense_f32", INT8: "int8", TOPK_INT8: "topk_int8"}

KNOWN_FLAGS = const(3)

META_INT = const(1)
META_FLOAT = const(2)
META_STR = const(3)


class Tensor:
    """A decoded tensor: ``values`` is flat float32 (``array('f')`` here, ndarray on the host)."""

    def __init__(self, name, shape, codec, values):
        self.name = name
        self.shape = shape
        self.codec = codec
        self.values = values


class Update:
    """A decoded, authenticated frame: ``header`` plus ``tensors`` in frame order."""

    def __init__(self, header, tensors):
        self.header = header
        self.tensors = tensors

    def tensor(self, name):
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)


def decode_update(frame, key, last_seq=None, round_id=None, model_version=None,
                  max_len=MAX_FRAME_LEN):
    """Check and decode one frame (see ``edge.portable.wire_decode.decode_update``).

    Imported on first use so a board that only encodes never loads the decoder's bytecode.
    """
    from edge.portable.wire_decode import decode_update as _decode
    return _decode(frame, key, last_seq, round_id, model_version, max_len)
