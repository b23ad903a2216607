"""The few things CPython and MicroPython spell differently, in one place.

Every other module in ``edge.portable`` imports only ``struct``, ``array``,
``math``, ``hashlib``, ``gc``, ``sys`` and this module, so the same file runs
on a Raspberry Pi and on an ESP32.

    from edge.portable.compat import IS_MICROPYTHON, const, ticks_ms, crc32, zeros
    _MAX = const(64)
    buf = zeros("f", 490)          # array('f') of 490 zeros, no temporary copy on the heap
"""

import sys

IS_MICROPYTHON = sys.implementation.name == "micropython"

try:
    from micropython import const  # noqa: F401  (folds constants at compile time on boards)
except ImportError:
    def const(x):
        return x

try:
    from time import ticks_ms, ticks_diff  # noqa: F401
except ImportError:
    import time as _time

    def ticks_ms():
        return int(_time.monotonic() * 1000)

    def ticks_diff(a, b):
        return a - b



def zeros(code, n, fill=True):
    """A zero-filled ``array(code)`` of ``n`` items, allocated without a temporary of its size.

    ``array(code, bytes(k))`` needs the bytes first: twice the block, and a
    hole of its size left below the array, which on a 100 KB heap is where the
    next large buffer would have gone. MicroPython sizes ``array(code,
    range(n))`` from ``len`` and allocates once; the values are then zeroed
    (``fill=False`` skips that for a buffer that is overwritten whole next).
    """
    if not IS_MICROPYTHON:
        import array
        return array.array(code, bytes(n * array.array(code).itemsize))
    import array
    a = array.array(code, range(n))
    if fill:
        for i in range(n):
            a[i] = 0
    return a


try:
    from binascii import crc32 as _crc32
except ImportError:  # a board built without binascii: the table below gives the same numbers
    _crc32 = None


def _crc32_table():
    import array
    t = array.array("I", bytes(1024))
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        t[i] = c
    return t


_TABLE = None


def crc32(data, crc=0):
    """CRC-32 (IEEE 802.3, as zlib and binascii) of a bytes-like object, chainable."""
    if _crc32 is not None:
        return _crc32(data, crc) & 0xFFFFFFFF
    return crc32_portable(data, crc)


def crc32_portable(data, crc=0):
    """The table-driven fallback, exposed so tests can check it against binascii."""
    global _TABLE
    if _TABLE is None:
        _TABLE = _crc32_table()
    t = _TABLE
    c = crc ^ 0xFFFFFFFF
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF
