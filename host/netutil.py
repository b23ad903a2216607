"""A free TCP port on loopback, for a server a process starts for itself (a local Ray head, the
benchmarks' and tests' throwaway servers). The port is free when this returns; a server that
binds it a moment later can still lose a race, which is why callers that can retry do."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing is bound to now (the OS's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
