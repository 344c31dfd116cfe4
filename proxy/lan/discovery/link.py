"""The mDNS socket (RFC 6762): one UDP socket on 0.0.0.0:5353, shared with any other
responder on the computer (avahi, mDNSResponder) through ``SO_REUSEADDR`` and, where it
exists, ``SO_REUSEPORT``. It joins 224.0.0.251 on each interface it is told of (by the
interface's address) and sends on one interface at a time (``IP_MULTICAST_IF``), with
TTL 255 (RFC 6762 §11: receivers may check it).

:class:`Link` is what the announcer and the browser need of it; :class:`MdnsLink` is the
real one, and unit tests give a fake (sends recorded, packets fed through a channel), so
no test outside a network namespace of its own sends anything to a LAN.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from typing import Protocol

import trio

from protocol.lan.dnssd import MDNS_GROUP, MDNS_PORT
from proxy.lan.interfaces import Interface, list_interfaces

__all__ = ["MAX_PACKET", "NO_MDNS", "Link", "MdnsLink", "Source"]

log = logging.getLogger("sluice.discovery")

NO_MDNS = "SLUICE_NO_MDNS"  # set (non-empty): the mDNS socket is never opened
MAX_PACKET = 9000  # bytes read per datagram (RFC 6762 §17: at most 9000 on the wire)
RECEIVE_RETRY = 0.1  # seconds before reading again after a receive error
Source = tuple[str, int]  # (address, port) a packet came from or goes to
GROUP: Source = (MDNS_GROUP, MDNS_PORT)


class Link(Protocol):
    """The packet side of discovery."""

    def interfaces(self) -> list[Interface]:
        """Every address of every interface now (mDNS runs on the ``mdns_interfaces``)."""

    def join(self, interface: Interface) -> None:
        """Receive the group's packets on ``interface`` from now on."""

    def leave(self, interface: Interface) -> None:
        """Stop that (the interface went away or changed)."""

    async def send(self, data: bytes, interface: Interface, to: Source = GROUP) -> None:
        """Send one packet out of ``interface``: to the group unless told."""

    async def receive(self) -> tuple[bytes, Source]:
        """The next packet and where it came from."""

    def close(self) -> None:
        """Done with it."""


class MdnsLink:
    """The real :class:`Link` (see the module docstring). Make it with :meth:`open`."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.sock = sock
        self._sending = trio.Lock()  # IP_MULTICAST_IF then sendto, one packet at a time

    def __repr__(self) -> str:
        return f"MdnsLink({self.sock!r})"

    @classmethod
    async def open(cls) -> MdnsLink:
        if os.environ.get(NO_MDNS):  # the test suite sets it: no multicast outside the
            raise OSError(f"{NO_MDNS} is set")  # network namespaces a test made
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "SO_REUSEPORT"):
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                except OSError:  # pragma: no cover - defined but refused by this kernel
                    pass
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 255)
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 255)
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
            await sock.bind(("0.0.0.0", MDNS_PORT))
        except BaseException:
            sock.close()
            raise
        return cls(sock)

    def close(self) -> None:
        self.sock.close()

    def interfaces(self) -> list[Interface]:
        return list_interfaces()

    def _membership(self, option: int, interface: Interface) -> None:
        request = socket.inet_aton(MDNS_GROUP) + socket.inet_aton(interface.address)
        self.sock.setsockopt(socket.IPPROTO_IP, option, request)

    def join(self, interface: Interface) -> None:
        try:
            self._membership(socket.IP_ADD_MEMBERSHIP, interface)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:  # already a member: fine
                raise

    def leave(self, interface: Interface) -> None:
        try:
            self._membership(socket.IP_DROP_MEMBERSHIP, interface)
        except OSError:  # the interface is gone, and its membership with it
            pass

    async def send(self, data: bytes, interface: Interface, to: Source = GROUP) -> None:
        async with self._sending:
            try:
                self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF,
                                     socket.inet_aton(interface.address))
                await self.sock.sendto(data, to)
            except OSError as exc:  # the interface went down meanwhile: the next look sees
                log.debug("mDNS send on %s (%s) failed: %s", interface.name,
                          interface.address, exc)

    async def receive(self) -> tuple[bytes, Source]:
        while True:
            try:
                data, source = await self.sock.recvfrom(MAX_PACKET)
            except OSError as exc:  # e.g. an ICMP error reported on the socket
                log.debug("mDNS receive failed: %s", exc)
                await trio.sleep(RECEIVE_RETRY)
                continue
            return data, (source[0], source[1])
