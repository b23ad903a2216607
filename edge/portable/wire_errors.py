"""The exceptions of the update wire format, one class per check that can fail.

Self-contained (no ``edge.errors``) so it runs on MicroPython. Each carries
``problem`` and ``fix`` like ``edge.errors.EdgelearnError``, and ``str(e)`` is
one sentence. Catch ``WireError`` for all of them.

    try:
        update = decode_update(frame, key)
    except ReplayError as e:
        log(e.problem)
"""


class WireError(Exception):
    """Base of every wire-format error: ``problem`` says what was wrong, ``fix`` what to do."""

    def __init__(self, problem, fix=None):
        self.problem = problem
        self.fix = fix
        super().__init__("%s; %s" % (problem, fix) if fix else problem)


class EncodeError(WireError):
    """The encoder was given something it cannot put on the wire (NaN, bad name, too large...)."""


class MalformedFrame(WireError):
    """The bytes do not follow docs/wire-format.md (bad magic, bad field, bad lengths, trailing bytes)."""


class TruncatedFrame(MalformedFrame):
    """The frame is shorter than its own header says: it was cut in transit."""


class OversizedFrame(WireError):
    """The frame (or the length its header claims) is above the receiver's limit."""


class UnsupportedVersion(WireError):
    """The frame's format version is not one this decoder implements."""


class AuthError(WireError):
    """The HMAC-SHA256 trailer does not match: wrong key, or a byte changed."""


class UnknownDevice(AuthError):
    """No key is provisioned for the frame's device id."""


class ReplayError(WireError):
    """The sequence number is not newer than the last accepted one from that device."""


class StaleError(WireError):
    """The frame is for another round or base model version than the receiver's current one."""


class StaleRound(StaleError):
    """The frame's round id is not the current round."""


class StaleModel(StaleError):
    """The frame was trained from another base model version than the current one."""


class ChunkError(WireError):
    """A chunk is corrupt (CRC), malformed, or contradicts chunks already received."""
