"""Zeroconf (mDNS) announcement of the Wyoming server, so Home Assistant discovers it.

As the Wyoming servers of the Home Assistant ecosystem do, through the ``wyoming`` package's own
``HomeAssistantZeroconf``: the service ``NAME._wyoming._tcp.local.`` with the server's port and
one IPv4 address; NAME defaults to that class's default, the machine's MAC address as 12 hex
digits. The address is the one the URI binds, or, when it binds every interface (``0.0.0.0``),
the one this machine sends multicast from (HomeAssistantZeroconf asks the routing table for
224.0.0.251). Home Assistant then shows "Discovered: Wyoming Protocol" and adds it with one click.
Only a TCP server can be announced; a name mDNS cannot carry, an IPv6-only bind, a machine without
a multicast route, a name another service on the network already holds are each one sentence.

    ann = Announcement("tcp://0.0.0.0:10400", ("tcp", "0.0.0.0", 10400), "kitchen")
    await ann.register(10400)     # ann.service == "kitchen._wyoming._tcp.local."
    await ann.withdraw()          # mDNS goodbye: Home Assistant drops the entry
"""

from __future__ import annotations

import ipaddress
import socket

from edge.errors import EdgelearnError

SERVICE_TYPE = "_wyoming._tcp.local."


def check_name(name: str) -> str:
    """``name`` if it can be an mDNS instance label: 1-63 UTF-8 bytes, no dot, no control character."""
    b = str(name).encode()
    if not 1 <= len(b) <= 63 or "." in name or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise EdgelearnError(f"--zeroconf name {name!r} is not 1-63 bytes without dots or control characters",
                             fix="pass a plain name such as kitchen-edgelearn, or --zeroconf alone for the default")
    return str(name)


def announced_host(host: str) -> str | None:
    """The IPv4 address to announce for a server bound to ``host`` (None: every interface, let
    HomeAssistantZeroconf find the multicast one)."""
    if host in ("0.0.0.0", "", "::"):
        return None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:  # a host name: the address it binds
        try:
            return socket.gethostbyname(host)
        except OSError as e:
            raise EdgelearnError(f"--zeroconf cannot resolve {host!r} to an IPv4 address ({e})",
                                 fix="bind --uri tcp://ADDRESS:PORT with an IPv4 address") from None
    if ip.version != 4:
        raise EdgelearnError(f"--zeroconf announces an IPv4 address (as HomeAssistantZeroconf does); {host} is IPv6",
                             fix="bind --uri tcp://0.0.0.0:PORT or an IPv4 address")
    return host


class Announcement:
    """The mDNS record of one Wyoming server at ``uri`` (``scheme_addr``: ``edge.wyoming.parse_uri``'s)."""

    def __init__(self, uri: str, scheme_addr, name: str | None = None):
        if scheme_addr[0] != "tcp":
            raise EdgelearnError(f"--zeroconf announces a TCP port, and {uri} is a Unix socket",
                                 fix="serve on --uri tcp://HOST:PORT to be discovered, or drop --zeroconf")
        import zeroconf  # noqa: F401  (missing: ModuleNotFoundError naming it; the CLI names the extra)

        self.name = None if name is None else check_name(name)
        self.host = announced_host(scheme_addr[1])
        self.service = None  # NAME._wyoming._tcp.local. while registered
        self._zc = None

    async def register(self, port: int) -> str:
        """Announce ``port``; returns the service name."""
        from wyoming.zeroconf import HomeAssistantZeroconf
        from zeroconf import NonUniqueNameException

        try:
            zc = HomeAssistantZeroconf(port=port, name=self.name, host=self.host)
        except OSError as e:  # no route to 224.0.0.251 while finding the multicast address
            raise EdgelearnError(f"--zeroconf cannot find this machine's address on a multicast network ({e})",
                                 fix="bind --uri tcp://ADDRESS:PORT to the address Home Assistant reaches, "
                                     "on an interface with multicast") from None
        try:
            await zc.register_server()
        except NonUniqueNameException:
            await zc._aiozc.async_close()
            raise EdgelearnError(f"another service on this network already announces {zc.name}.{SERVICE_TYPE}",
                                 fix="pass --zeroconf OTHER-NAME") from None
        except BaseException:
            await zc._aiozc.async_close()
            raise
        self._zc, self.service = zc, f"{zc.name}.{SERVICE_TYPE}"
        return self.service

    async def withdraw(self) -> None:
        """Unregister (mDNS goodbye packets) and close the responder; nothing when not registered.
        HomeAssistantZeroconf (wyoming 1.10) has no method for it: its AsyncZeroconf is ``_aiozc``."""
        zc, self._zc, self.service = self._zc, None, None
        if zc is None:
            return
        try:
            await zc._aiozc.async_unregister_all_services()
        finally:
            await zc._aiozc.async_close()
