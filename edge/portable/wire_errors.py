"""The exceptions of the update wire format, one class per check that can fail.

Self-contained (no ``edge.errors``) so it runs on MicroPython. Each carries
``problem`` and ``fix`` like ``edge.errors.EdgelearnError``, and ``str(e)`` is
one sentence. Catch ``WireError`` for all of them.

A sender's errors (``EncodeError``, ``ChunkError``) are defined here; the
receiver's (``MalformedFrame``, ``AuthError``, ``ReplayError`` ...) in
``edge.portable.wire_errors_rx``, loaded the first time one is asked for from
this module, so a board that only sends never holds their classes or names.

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


class ChunkError(WireError):
    """A chunk is corrupt (CRC), malformed, or contradicts chunks already received."""


def __getattr__(name):
    # the receiver's errors, on first use (see the module docstring)
    from edge.portable import wire_errors_rx
    return getattr(wire_errors_rx, name)
