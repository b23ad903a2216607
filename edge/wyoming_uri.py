"""Where a Wyoming server listens: ``--uri`` parsed (``parse_uri``), and one sentence for an address it
cannot listen at (``_listen_error``). Apart from ``edge.wyoming`` (which re-exports both) to keep that
module about serving clients.
"""

from __future__ import annotations

from urllib.parse import urlparse

from edge.errors import EdgelearnError


def parse_uri(uri: str):
    """("tcp", host, port) or ("unix", path, None) from ``tcp://HOST:PORT`` / ``unix://PATH``."""
    u = urlparse(uri)
    if u.scheme == "tcp":
        try:
            port = u.port
        except ValueError:
            port = None
        if not u.hostname or port is None:
            raise EdgelearnError(f"--uri {uri!r} needs a host and a port", fix="pass e.g. tcp://0.0.0.0:10400")
        return "tcp", u.hostname, port
    if u.scheme == "unix" and (u.path or u.netloc):
        return "unix", u.netloc + u.path, None
    raise EdgelearnError(f"--uri {uri!r} is not tcp://HOST:PORT or unix://PATH",
                         fix="pass e.g. tcp://0.0.0.0:10400 (the port Home Assistant's Wyoming integration is told)")


def _listen_error(uri: str, e: OSError) -> EdgelearnError:
    """One sentence for a server that cannot listen at ``uri`` (port taken, no such host or address,
    a unix socket's directory missing or not writable)."""
    import errno
    import socket

    if isinstance(e, socket.gaierror):
        return EdgelearnError(f"cannot listen at {uri}: its host name does not resolve ({e.strerror or e})",
                              fix="give this machine's address or name, or tcp://0.0.0.0:PORT for every interface")
    if e.errno == errno.EADDRINUSE:
        return EdgelearnError(f"cannot listen at {uri}: the address is already in use",
                              fix="stop the other server on it (another `edgelearn wyoming`?) or pick another port")
    if e.errno == errno.EADDRNOTAVAIL:
        return EdgelearnError(f"cannot listen at {uri}: the address is not one of this machine's",
                              fix="give one of its addresses (`ip addr`), or tcp://0.0.0.0:PORT for every interface")
    if e.errno in (errno.EACCES, errno.EPERM):
        return EdgelearnError(f"cannot listen at {uri}: permission denied",
                              fix="use a port above 1023, or a unix socket path in a directory you can write")
    return EdgelearnError(f"cannot listen at {uri}: {e.strerror or e}",
                          fix="check the address, or that the unix socket's directory exists and is writable")
