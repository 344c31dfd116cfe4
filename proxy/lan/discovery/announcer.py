"""The announcer (SPEC §14, RFC 6762 §8.3, §6, §10.1): while it runs, this gateway is
``<computer name>._sluice._tcp.local.`` on every mDNS interface.

- On each interface (at start, and each one that appears later) it sends
  :data:`ANNOUNCE_COUNT` unsolicited announcements :data:`ANNOUNCE_GAP` seconds apart,
  then rests: afterwards it only answers.
- A query about us is answered on the interface it came in on (the announcement made for
  that interface: its own address), after a random :data:`ANSWER_DELAY` (RFC 6762 §6:
  our records are shared ones), at most one answer waiting per interface. A query from a
  port other than 5353 (a "legacy" one-shot resolver, §6.7) gets its answer sent back to
  that port directly.
- When it stops (switched off, external access off, the gateway draining, or cancelled
  for any reason) it sends a goodbye (TTL 0) on every interface, shielded and bounded by
  :data:`GOODBYE_TIMEOUT`, so browsers drop us at once instead of after minutes.

Which interfaces exist is the service's business (:mod:`proxy.lan.discovery.service`): it
calls :meth:`Announcer.added` and :meth:`Announcer.removed`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

import trio

from protocol.lan.dnssd import MDNS_PORT, Announcement, announce_packet, answer
from proxy.lan.discovery.link import Link, Source
from proxy.lan.interfaces import Interface
from proxy.tasks import TaskHolder

__all__ = ["ANNOUNCE_COUNT", "ANNOUNCE_GAP", "ANSWER_DELAY", "GOODBYE_TIMEOUT", "Announcer"]

log = logging.getLogger("sluice.discovery")

ANNOUNCE_COUNT = 3  # unsolicited announcements per interface (RFC 6762 §8.3: at least 2)
ANNOUNCE_GAP = 1.0  # seconds between them
ANSWER_DELAY = (0.02, 0.12)  # seconds: the random wait before an answer (RFC 6762 §6)
GOODBYE_TIMEOUT = 1.0  # seconds the goodbyes may take when it stops

Identity = Callable[[Interface], Announcement]
"""What we announce on an interface (its address in the records)."""


class Announcer:
    def __init__(self, link: Link, identity: Identity, interfaces: dict[str, Interface], *,
                 rng: random.Random | None = None) -> None:
        self.link = link
        self.identity = identity
        self.interfaces = interfaces  # key -> interface: the service's, kept current by it
        self.rng = rng or random.Random()
        self.answered = 0  # queries answered (for tests and the log)
        self._answering: set[str] = set()  # interfaces with an answer waiting
        self._tasks = TaskHolder()  # announcements and answers, while run() runs
        self._said_goodbye = False

    def __repr__(self) -> str:
        return f"Announcer({sorted(self.interfaces)}, answered={self.answered})"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Announce on every interface, then answer, until cancelled; goodbyes at the end."""
        try:
            await self._tasks.run(task_status=task_status, first=self._announce_everywhere)
        finally:
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + GOODBYE_TIMEOUT
                await self.goodbye()

    def _announce_everywhere(self, nursery: trio.Nursery) -> None:
        for key, interface in self.interfaces.items():
            nursery.start_soon(self._announce, key, interface)

    def added(self, key: str, interface: Interface) -> None:
        """A new interface (already in :attr:`interfaces`): announce on it."""
        nursery = self._tasks.nursery
        if nursery is not None:
            nursery.start_soon(self._announce, key, interface)

    def removed(self, key: str) -> None:
        """An interface went away: nothing can be sent there any more."""
        self._answering.discard(key)

    async def goodbye(self) -> None:
        """TTL 0 for our records on every interface, once."""
        if self._said_goodbye:
            return
        self._said_goodbye = True
        for interface in list(self.interfaces.values()):
            await self.link.send(announce_packet(self.identity(interface), goodbye=True),
                                 interface)
        log.info("withdrew the announcement on %d interface(s)",
                 len(self.interfaces))

    async def _announce(self, key: str, interface: Interface) -> None:
        packet = announce_packet(self.identity(interface))
        for i in range(ANNOUNCE_COUNT):
            if i:
                await trio.sleep(ANNOUNCE_GAP)
            if self.interfaces.get(key) != interface:  # gone or changed meanwhile
                return
            await self.link.send(packet, interface)

    def on_packet(self, data: bytes, source: Source, key: str) -> None:
        """A packet that came in on interface ``key``: if it asks about us, answer it."""
        interface = self.interfaces.get(key)
        nursery = self._tasks.nursery
        if interface is None or nursery is None:
            return
        legacy = source[1] != MDNS_PORT
        if not legacy and key in self._answering:
            return  # an answer is already on its way there
        legacy_id = int.from_bytes(data[:2], "big") if legacy and len(data) >= 2 else None
        reply = answer(data, self.identity(interface), legacy_id=legacy_id)
        if reply is None:
            return
        if not legacy:
            self._answering.add(key)
        nursery.start_soon(self._answer, reply, interface, key, source if legacy else None)

    async def _answer(self, reply: bytes, interface: Interface, key: str,
                      to: Source | None) -> None:
        try:
            if to is not None:  # a legacy resolver waits for its answer on its own port
                await self.link.send(reply, interface, to)
            else:
                await trio.sleep(self.rng.uniform(*ANSWER_DELAY))
                if self.interfaces.get(key) == interface:
                    await self.link.send(reply, interface)
            self.answered += 1
        finally:
            if to is None:
                self._answering.discard(key)
