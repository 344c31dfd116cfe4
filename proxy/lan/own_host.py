"""The names and addresses of this computer, for the Host guard (SPEC §14): with external
access on, a ``Host`` that is one of our own IP addresses or ``<host name>.local`` passes
like ``localhost``. The rule is :func:`protocol.rebinding.own_host`; this is its cache.

The guard asks only for a Host that did not pass already (the common requests never get
here). The interface listing (:mod:`proxy.lan.interfaces`, imported on the first ask) is
read again at most every :data:`REFRESH` seconds, or when LAN discovery lists the
interfaces anyway (:meth:`OwnHost.update`).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable
from typing import TYPE_CHECKING

import trio

from protocol.rebinding import normal_address, own_host

if TYPE_CHECKING:
    from proxy.lan.interfaces import Interface

__all__ = ["REFRESH", "OwnHost", "short_hostname"]

log = logging.getLogger("sluice.auth")

REFRESH = 5.0  # seconds a listing of our addresses is trusted


def short_hostname() -> str:
    """The computer's name without a domain (``studio`` of ``studio.example.org``)."""
    return socket.gethostname().split(".", 1)[0]


class OwnHost:
    """Our addresses and host name, refreshed when older than :data:`REFRESH`."""

    __slots__ = ("_addresses", "_fresh_until", "_hostname", "lists")

    def __init__(self) -> None:
        self._addresses: frozenset[str] = frozenset()
        self._hostname = ""
        self._fresh_until = -float("inf")
        self.lists = 0  # how often the interfaces were read here (for tests)

    def __repr__(self) -> str:
        return f"OwnHost({self._hostname!r}, {sorted(self._addresses)})"

    def update(self, interfaces: Iterable[Interface]) -> None:
        """A fresh listing (read here, or by discovery): trusted for :data:`REFRESH`."""
        self._addresses = frozenset(a for i in interfaces
                                    if (a := normal_address(i.address)) is not None)
        self._hostname = short_hostname()
        self._fresh_until = trio.current_time() + REFRESH

    def allows(self, host: bytes) -> bool:
        """``host`` (a Host header's value) names this computer."""
        if trio.current_time() >= self._fresh_until:
            from proxy.lan.interfaces import list_interfaces

            self.lists += 1
            try:
                self.update(list_interfaces())
            except OSError as exc:  # keep the last listing; try again next time
                log.warning("cannot list this computer's addresses: %s", exc)
        return own_host(host, self._addresses, self._hostname)
