"""Code that runs unchanged on CPython and on MicroPython boards.

Modules here import only ``struct``, ``array``, ``math``, ``hashlib``, ``gc``,
``sys`` and ``edge.portable.compat``; ``firmware/`` deploys them to an ESP32.

- ``wire`` (+ ``wire_decode``, ``wire_topk``, ``wire_errors``): the update frame.
- ``chunks``: splitting frames into resendable chunks and reassembling them.
- ``link``: the serial link's frames between a board and ``host/gateway.py`` (CRC32, resend-safe).
- ``hmac256``: HMAC-SHA256 on ``hashlib.sha256`` (MicroPython has no ``hmac``).
- ``quant``: int8 scales, (stochastic) rounding, TFLite fixed-point helpers.

    from edge.portable.wire import Header, encode_update, decode_update
"""
