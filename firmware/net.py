"""A minimal HTTP/1.0 POST over ``socket`` for the board's Wi-Fi path (urequests-style, bounded).

MicroPython's ``requests`` is not on every build and buffers whole responses;
this needs only ``socket`` and reads at most ``max_reply`` bytes of the answer,
so a misbehaving server cannot exhaust the heap. Plain HTTP only, as the
aggregator speaks it (docs/protocol.md: TLS belongs in a reverse proxy).
Runs unchanged on the unix port, which is how tests/test_firmware_wifi.py
checks it against a real server on loopback.

    from firmware.net import post
    status, body = post("http://10.0.0.2:8470/v1/updates", frame,
                        {"X-Edgelearn-Device": "esp32-07"}, "application/octet-stream")
"""

import socket


class NetError(OSError):
    """The server could not be reached or answered something that is not HTTP."""


def split_url(url):
    """``http://host[:port]/path`` -> (host, port, path)."""
    if not url.startswith("http://"):
        raise NetError("only http:// URLs are supported, not %r (put TLS in a reverse proxy)" % url)
    rest = url[7:]
    i = rest.find("/")
    hostport, path = (rest, "/") if i < 0 else (rest[:i], rest[i:])
    host, _, port = hostport.partition(":")
    try:
        return host, int(port) if port else 80, path
    except ValueError:
        raise NetError("bad port in %r" % url)


def post(url, body, headers=None, content_type="application/json", timeout=10, max_reply=2048, into=None):
    """POST ``body`` (bytes); returns (status code, reply body bytes). NetError on a network fault.

    ``into``: a preallocated buffer for the reply (a board passes one); otherwise
    ``max_reply`` + 1 KB of headers is allocated.
    """
    host, port, path = split_url(url)
    try:
        addr = socket.getaddrinfo(host, port)[0][-1]
        s = socket.socket()
    except OSError as e:
        raise NetError("cannot resolve %s (%s)" % (host, e))
    try:
        s.settimeout(timeout)
        s.connect(addr)
        head = "POST %s HTTP/1.0\r\nHost: %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n" % (
            path, host, content_type, len(body))
        hdrs = headers or {}
        for k in hdrs:
            head += "%s: %s\r\n" % (k, hdrs[k])
        _send_all(s, (head + "\r\n").encode())
        _send_all(s, body)
        reply = bytearray(max_reply + 1024) if into is None else into   # headers + at most max_reply of body
        n = 0
        while n < len(reply):
            k = s.readinto(memoryview(reply)[n:]) if hasattr(s, "readinto") else _recv_into(s, reply, n)
            if not k:
                break
            n += k
    except OSError as e:
        raise NetError("POST %s failed: %s" % (url, e))
    finally:
        s.close()
    return _parse(reply, n, url)


def _send_all(s, data):
    mv = memoryview(data)
    while len(mv):
        k = s.send(mv)
        mv = mv[k:]


def _recv_into(s, buf, n):  # CPython sockets have recv_into, not readinto
    return s.recv_into(memoryview(buf)[n:])


def _parse(reply, n, url):
    end = bytes(reply[:n]).find(b"\r\n\r\n")
    if end < 0 or bytes(reply[:5]) != b"HTTP/":
        raise NetError("%s answered with something that is not an HTTP reply" % url)
    try:
        status = int(bytes(reply[9:12]))
    except ValueError:
        raise NetError("%s answered with a bad status line" % url)
    return status, bytes(reply[end + 4:n])
