"""The receiver's wire-format errors (decoder, chunk reassembly, aggregator).

Also reachable as ``edge.portable.wire_errors.<Name>`` (that module loads this
one on first use); a board that only sends never imports it.

    from edge.portable.wire_errors import AuthError    # or from edge.portable.wire_errors_rx
"""

from edge.portable.wire_errors import WireError


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
