"""This computer's network interfaces and their addresses, from ``getifaddrs(3)`` through
ctypes (no extra package): each address with its interface's name and index, its netmask
as a prefix length and the flags that matter here (up, loopback, multicast).

Used by the Host guard (:mod:`proxy.lan.own_host`: "is this Host one of our own addresses?")
and by LAN discovery (:mod:`proxy.lan.discovery`: the interfaces mDNS runs on). Imported only
by them, when first needed: ctypes is not loaded by a gateway that never asks.

``struct ifaddrs`` is the same on Linux and macOS; the socket addresses differ in their
first bytes: Linux starts with a 16-bit family, BSD and macOS with a length byte and then
a family byte. The IPv4 and IPv6 address bytes are at the same offsets on both (4 and 8).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import ipaddress
import socket
import sys
from typing import Final

import attrs

__all__ = ["Interface", "list_interfaces", "mdns_interfaces"]

_BSD: Final = sys.platform == "darwin" or "bsd" in sys.platform
IFF_UP: Final = 0x1
IFF_LOOPBACK: Final = 0x8
IFF_MULTICAST: Final = 0x8000 if _BSD else 0x1000


@attrs.frozen
class Interface:
    """One address of one interface."""

    name: str
    index: int  # if_nametoindex (0 when the interface went away meanwhile)
    family: int  # socket.AF_INET or socket.AF_INET6
    address: str  # "10.0.0.2", "fe80::1" (no zone: the index says which link)
    prefix: int  # netmask length
    up: bool
    loopback: bool
    multicast: bool

    def contains(self, address: str) -> bool:
        """``address`` is on this interface's subnet."""
        try:
            network = ipaddress.ip_network(f"{self.address}/{self.prefix}", strict=False)
            return ipaddress.ip_address(address) in network
        except ValueError:
            return False


class _Sockaddr(ctypes.Structure):
    _fields_ = [("head", ctypes.c_uint16)]  # family (Linux) or length + family (BSD)


class _Ifaddrs(ctypes.Structure):
    pass


_Ifaddrs._fields_ = [
    ("ifa_next", ctypes.POINTER(_Ifaddrs)),
    ("ifa_name", ctypes.c_char_p),
    ("ifa_flags", ctypes.c_uint),
    ("ifa_addr", ctypes.POINTER(_Sockaddr)),
    ("ifa_netmask", ctypes.POINTER(_Sockaddr)),
    ("ifa_dstaddr", ctypes.POINTER(_Sockaddr)),  # or broadaddr: a union of two pointers
    ("ifa_data", ctypes.c_void_p),
]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    libc.getifaddrs.argtypes = [ctypes.POINTER(ctypes.POINTER(_Ifaddrs))]
    libc.getifaddrs.restype = ctypes.c_int
    libc.freeifaddrs.argtypes = [ctypes.POINTER(_Ifaddrs)]
    libc.freeifaddrs.restype = None
    return libc


_LIBC: ctypes.CDLL | None = None


def _family(pointer: ctypes._Pointer[_Sockaddr]) -> int:
    raw = ctypes.string_at(pointer, 2)
    return raw[1] if _BSD else int.from_bytes(raw, sys.byteorder)


def _address(pointer: ctypes._Pointer[_Sockaddr], family: int) -> bytes:
    """The address bytes of a sockaddr_in (4 at offset 4) or sockaddr_in6 (16 at 8)."""
    if family == socket.AF_INET:
        return ctypes.string_at(ctypes.addressof(pointer.contents) + 4, 4)
    return ctypes.string_at(ctypes.addressof(pointer.contents) + 8, 16)


def _prefix(mask: bytes) -> int:
    return bin(int.from_bytes(mask, "big")).count("1")


def list_interfaces() -> list[Interface]:
    """Every IPv4 and IPv6 address of every interface, in the system's order. Raises
    ``OSError`` when the system cannot list them."""
    global _LIBC  # the library handle, loaded once (not state: the same for everyone)
    if _LIBC is None:
        _LIBC = _libc()
    libc = _LIBC
    head = ctypes.POINTER(_Ifaddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"getifaddrs: {errno}")
    out: list[Interface] = []
    indexes: dict[str, int] = {}
    try:
        entry = head
        while entry:
            ifa = entry.contents
            entry = ifa.ifa_next
            if not ifa.ifa_addr:
                continue
            family = _family(ifa.ifa_addr)
            if family not in (socket.AF_INET, socket.AF_INET6):
                continue
            name = (ifa.ifa_name or b"").decode("utf-8", "replace")
            raw = _address(ifa.ifa_addr, family)
            mask = _address(ifa.ifa_netmask, family) if ifa.ifa_netmask else b""
            if name not in indexes:
                try:
                    indexes[name] = socket.if_nametoindex(name)
                except OSError:
                    indexes[name] = 0
            flags = ifa.ifa_flags
            out.append(Interface(
                name=name, index=indexes[name], family=family,
                address=socket.inet_ntop(family, raw),
                prefix=_prefix(mask) if mask else (32 if family == socket.AF_INET else 128),
                up=bool(flags & IFF_UP), loopback=bool(flags & IFF_LOOPBACK),
                multicast=bool(flags & IFF_MULTICAST)))
    finally:
        libc.freeifaddrs(head)
    return out


def mdns_interfaces(interfaces: list[Interface]) -> list[Interface]:
    """The addresses mDNS runs on: IPv4, up, multicast-capable and not loopback."""
    return [i for i in interfaces
            if i.family == socket.AF_INET and i.up and i.multicast and not i.loopback]
