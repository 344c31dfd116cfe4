"""The browser (SPEC §14, RFC 6762 §5.2, §7.1): it asks for ``_sluice._tcp.local.`` on
every mDNS interface and lists who answers (or announces, or says goodbye).

- Queries: one at start, then after :data:`FIRST_INTERVAL` seconds, the interval doubling
  up to :data:`MAX_INTERVAL` (1, 2, 4 ... 60 s); a new interface starts the schedule over.
  Each query carries the answers already known and fresh (:meth:`Discovered.known_answers`),
  which their owners need not send again.
- Every packet's sightings go into the registry (:class:`protocol.lan.discovered.Discovered`:
  itself never listed, a goodbye removes at once, 2 minutes unseen forgets).
- On each change of the list, ``publish`` gets it (the service makes the ``discovered``
  event of it). Nothing here contacts any computer: it only listens and asks the group.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import trio

from protocol.lan.discovered import Discovered
from protocol.lan.dnssd import MDNS_PORT, instance_name, query_packet, sightings
from proxy.lan.discovery.link import Link, Source
from proxy.lan.interfaces import Interface

__all__ = ["FIRST_INTERVAL", "MAX_INTERVAL", "Browser"]

FIRST_INTERVAL = 1.0  # seconds between the first query and the second
MAX_INTERVAL = 60.0  # the interval doubles up to this (a live computer re-seen in time)


class Browser:
    def __init__(self, link: Link, registry: Discovered, interfaces: dict[str, Interface],
                 changed: Callable[[], None]) -> None:
        self.link = link
        self.registry = registry
        self.interfaces = interfaces  # key -> interface: the service's, kept current by it
        self.changed = changed  # the list changed: publish it
        self.queries = 0  # rounds of queries sent (for tests and the log)
        self._restart = trio.Event()  # a new interface: query now, the schedule anew
        self._seen = trio.Event()  # a sighting: the next forgetting may be later

    def __repr__(self) -> str:
        return f"Browser({self.registry!r}, queries={self.queries})"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Query and forget, until cancelled; the list is emptied at the end."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._forget)
                task_status.started()
                await self._query()
        finally:
            if self.registry.clear():
                self.changed()

    def added(self, key: str, interface: Interface) -> None:
        self._restart.set()

    def removed(self, key: str) -> None:
        """Computers seen there stay until they are forgotten (or seen elsewhere)."""

    def on_packet(self, data: bytes, source: Source) -> None:
        """Take in every sighting of a packet (responses come from port 5353 only:
        RFC 6762 §11)."""
        if source[1] != MDNS_PORT:
            return
        found = sightings(data)
        if not found:
            return
        now = trio.current_time()
        changed = False
        for sighting in found:
            changed |= self.registry.seen(sighting, source[0], now)
        self._seen.set()
        if changed:
            self.changed()

    async def _query(self) -> None:
        interval = 0.0
        while True:
            if interval:
                with trio.move_on_after(interval):
                    await self._restart.wait()
            if self._restart.is_set():
                self._restart = trio.Event()
                interval = 0.0
            known = [(instance_name(i), ttl)
                     for i, ttl in self.registry.known_answers(trio.current_time())]
            packet = query_packet(known)
            for interface in list(self.interfaces.values()):
                await self.link.send(packet, interface)
            self.queries += 1
            interval = min(MAX_INTERVAL, interval * 2 if interval else FIRST_INTERVAL)

    async def _forget(self) -> None:
        while True:
            self._seen = trio.Event()
            due = self.registry.next_expiry()
            with trio.move_on_at(math.inf if due is None else due):
                await self._seen.wait()
            if self.registry.expire(trio.current_time()):
                self.changed()
