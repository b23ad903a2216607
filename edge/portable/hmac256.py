"""HMAC-SHA256 (RFC 2104) on top of ``hashlib.sha256`` alone.

MicroPython ships ``hashlib.sha256`` but no ``hmac`` module, and the update
frames must be authenticated on an ESP32, so the construction is written out
here (it is twelve lines of RFC 2104). On CPython it gives exactly what
``hmac.new(key, msg, hashlib.sha256)`` gives; the tests check that and the
RFC 4231 vectors on both interpreters.

    from edge.portable.hmac256 import hmac_sha256, HmacSha256, compare_digest
    tag = hmac_sha256(b"device key", b"message")
    h = HmacSha256(b"device key"); h.update(b"mess"); h.update(b"age")
    assert compare_digest(h.digest(), tag)
"""

import hashlib

from edge.portable.compat import const

_BLOCK_SIZE = const(64)  # SHA-256 block size in bytes (RFC 2104's B)


class HmacSha256:
    """Incremental HMAC-SHA256: ``update()`` any number of bytes-like pieces, then ``digest()`` once.

    MicroPython hash objects cannot be copied, so a ``digest()`` consumes the
    object; make a new one per message (the key pads are cheap to rebuild).
    """

    def __init__(self, key):
        key = bytes(key)
        if len(key) > _BLOCK_SIZE:
            key = hashlib.sha256(key).digest()
        key = key + bytes(_BLOCK_SIZE - len(key))
        ipad = bytearray(_BLOCK_SIZE)
        self._opad = bytearray(_BLOCK_SIZE)
        for i in range(_BLOCK_SIZE):
            ipad[i] = key[i] ^ 0x36
            self._opad[i] = key[i] ^ 0x5C
        self._inner = hashlib.sha256(ipad)
        self._done = False

    def update(self, data):
        if self._done:
            raise ValueError("HmacSha256.update() after digest(); make a new HmacSha256 per message")
        self._inner.update(data)

    def digest(self):
        if self._done:
            raise ValueError("HmacSha256.digest() called twice; make a new HmacSha256 per message")
        self._done = True
        outer = hashlib.sha256(self._opad)
        outer.update(self._inner.digest())
        return outer.digest()


def hmac_sha256(key, data):
    """The 32-byte HMAC-SHA256 tag of ``data`` (any bytes-like, memoryview slices included)."""
    h = HmacSha256(key)
    h.update(data)
    return h.digest()


def compare_digest(a, b):
    """Constant-time equality for two tags, so timing does not reveal how many leading bytes match."""
    if len(a) != len(b):
        return False
    diff = 0
    for i in range(len(a)):
        diff |= a[i] ^ b[i]
    return diff == 0
