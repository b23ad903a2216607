"""Ports and listening sockets.

``free_port``: a free TCP port on loopback, for a server a process starts for itself (a local Ray
head, the benchmarks' and tests' throwaway servers). The port is free when this returns; a server
that binds it a moment later can still lose a race, which is why callers that can retry do.
``port_number`` and ``bind``: the ``--port`` type and the listening socket of ``edgelearn serve``
and ``edgelearn aggregator serve`` (a bad host or port is one sentence before anything starts)."""

from __future__ import annotations

import errno
import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing is bound to now (the OS's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_number(text: str) -> int:
    """argparse type: a TCP port, 1-65535 (0: any free port, which the `serving ... on` line names)."""
    import argparse

    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port: give a number from 1 to 65535 "
                                         "(0: any free port)")
    return port


def bind(host: str, port: int):
    """A listening socket on ``host``:``port``, or one EdgelearnError (port in use, unknown host)."""
    from edge.errors import EdgelearnError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise EdgelearnError(f"cannot listen on --host {host}: no such host or address ({e})",
                             fix="give an address of this machine, e.g. 127.0.0.1 or 0.0.0.0") from None
    family, kind, proto, _name, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise EdgelearnError(f"cannot listen on {host}:{port}: the port is already in use",
                                 fix="stop what uses it or pass another --port") from None
        raise EdgelearnError(f"cannot listen on {host}:{port}: {e.strerror or e}",
                             fix="pass another --host or --port (ports below 1024 need root)") from None
    return sock
