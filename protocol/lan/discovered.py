"""The computers LAN discovery has seen (SPEC §14), pure: sightings in, the list of
``GET /api/v1/nodes/discovered`` out. Time is an argument (``now``, seconds on any
monotonic clock), so the rules are tested without a clock.

- One entry per fingerprint: the last sighting wins (name, address, port, version).
- This gateway itself is never listed (its own fingerprint is ignored).
- A goodbye (TTL 0, RFC 6762 §10.1) removes the entry at once (one without a fingerprint:
  the entry of that instance name at that address).
- An entry not seen for :data:`FORGET_AFTER` seconds is forgotten, whatever TTL it came
  with: the browser asks often enough that a live computer answers well within that.
- A sighting with no valid fingerprint is ignored; one without a usable address or port
  only tells that a computer already listed is still there.

The base URL is ``http://<address>:<port>``: the address the packet came from (on the
LAN, a responder answers for itself), unless the packet lists addresses of the computer
and that source is not among them (an answer relayed by somebody else): then the first
IPv4 address it lists.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Container
from typing import Any, Final

import attrs

from protocol.lan.dnssd import Sighting
from protocol.names import is_fingerprint, is_label

__all__ = ["FORGET_AFTER", "KNOWN_FOR", "Computer", "Discovered"]

FORGET_AFTER: Final = 120.0  # seconds unseen before a computer is forgotten (SPEC §14)
KNOWN_FOR: Final = 20.0  # seconds after a sighting its answer is sent back as known


@attrs.frozen
class Computer:
    fingerprint: str
    name: str
    base_url: str
    version: str
    instance: str  # the DNS-SD instance name it announced
    ttl: int  # the TTL its records came with
    seen: float  # when it was last seen (``now`` of that sighting)

    def entry(self, configured: Container[str]) -> dict[str, Any]:
        """Its entry in the GET list; ``added``: its fingerprint is in the config's nodes."""
        return {"fingerprint": self.fingerprint, "name": self.name, "baseUrl": self.base_url,
                "version": self.version, "added": self.fingerprint in configured}


def _ipv4(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv4Address)
    except ValueError:
        return False


def base_url(sighting: Sighting, source: str) -> str | None:
    """Where the computer's API is (see the module docstring); None when nowhere usable."""
    address = source
    if sighting.addresses and source not in sighting.addresses:
        address = next((a for a in sighting.addresses if _ipv4(a)), "")
    if not _ipv4(address) or not 0 < sighting.port < 65536:
        return None
    return f"http://{address}:{sighting.port}"


class Discovered:
    """The registry (see the module docstring)."""

    __slots__ = ("_computers", "own")

    def __init__(self, own: str) -> None:
        self.own = own  # this gateway's fingerprint
        self._computers: dict[str, Computer] = {}

    def __repr__(self) -> str:
        return f"Discovered({sorted(self._computers)})"

    def __len__(self) -> int:
        return len(self._computers)

    def seen(self, sighting: Sighting, source: str, now: float) -> bool:
        """Take in one sighting from a packet that came from ``source``; True when the
        list changed (a computer came, went or changed what the list shows)."""
        fp = sighting.fingerprint
        if sighting.ttl <= 0:
            return self._goodbye(sighting, source)
        if fp == self.own or not is_fingerprint(fp):
            return False
        url = base_url(sighting, source)
        old = self._computers.get(fp)
        if url is None:
            if old is not None:
                self._computers[fp] = attrs.evolve(old, seen=now)
            return False
        name = sighting.instance if is_label(sighting.instance) and sighting.instance else fp
        version = sighting.version if is_label(sighting.version) else ""
        self._computers[fp] = Computer(fp, name, url, version, sighting.instance,
                                       sighting.ttl, now)
        return old is None or (old.name, old.base_url, old.version) != (name, url, version)

    def _goodbye(self, sighting: Sighting, source: str) -> bool:
        if sighting.fingerprint:
            return self._computers.pop(sighting.fingerprint, None) is not None
        folded = sighting.instance.lower()
        gone = [fp for fp, c in self._computers.items()
                if c.instance.lower() == folded and c.base_url.startswith(f"http://{source}:")]
        for fp in gone:
            del self._computers[fp]
        return bool(gone)

    def expire(self, now: float) -> bool:
        """Forget the computers unseen for :data:`FORGET_AFTER`; True when any went."""
        gone = [fp for fp, c in self._computers.items() if now - c.seen >= FORGET_AFTER]
        for fp in gone:
            del self._computers[fp]
        return bool(gone)

    def next_expiry(self) -> float | None:
        """When the next computer is forgotten unless seen again; None: nothing listed."""
        if not self._computers:
            return None
        return min(c.seen for c in self._computers.values()) + FORGET_AFTER

    def clear(self) -> bool:
        had = bool(self._computers)
        self._computers.clear()
        return had

    def entries(self, configured: Container[str]) -> list[dict[str, Any]]:
        """The GET list, by name then fingerprint."""
        ordered = sorted(self._computers.values(), key=lambda c: (c.name.lower(), c.fingerprint))
        return [c.entry(configured) for c in ordered]

    def known_answers(self, now: float) -> list[tuple[str, int]]:
        """(instance, TTL left) of the computers seen in the last :data:`KNOWN_FOR` seconds
        whose TTL is more than half left (RFC 6762 §7.1): they need not answer a query
        again. Older ones are left out, so every computer answers at least every
        :data:`KNOWN_FOR` plus a query interval, well within :data:`FORGET_AFTER`."""
        out = []
        for c in self._computers.values():
            age = now - c.seen
            left = int(c.ttl - age)
            if age < KNOWN_FOR and left > c.ttl / 2:
                out.append((c.instance, left))
        return out
