"""Discovery while it is on (SPEC §14): one mDNS link for the announcer and the browser,
the interfaces followed, every packet handed to whichever of the two runs.

- Interfaces are listed at start and every :data:`RELIST` seconds (one ``getifaddrs``):
  the group is joined on each new mDNS interface and left on each that went; the
  announcer announces on a new one, the browser asks there at once. Each listing also
  refreshes the Host guard's addresses (:class:`proxy.lan.own_host.OwnHost`).
- A packet is taken only from an address on the subnet of one of those interfaces (that
  is the interface it came in on): mDNS is link-local (RFC 6762 §11).
- :meth:`Discovery.set_modes` starts and stops the announcer and the browser as the
  settings change; the switch (:mod:`proxy.lan.discovery_switch`) cancels the whole service
  when both are off. The announcer says goodbye whenever it stops.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Container
from typing import Any

import attrs
import trio

from protocol.lan.discovered import Discovered
from protocol.lan.dnssd import Announcement
from proxy.lan.discovery.announcer import GOODBYE_TIMEOUT, Announcer
from proxy.lan.discovery.browser import Browser
from proxy.lan.discovery.link import Link
from proxy.lan.interfaces import Interface, mdns_interfaces
from proxy.lan.own_host import OwnHost

__all__ = ["RELIST", "Discovery", "Me"]

log = logging.getLogger("sluice.discovery")

RELIST = 5.0  # seconds between two listings of the interfaces


@attrs.frozen
class Me:
    """What this gateway announces: its name, fingerprint, version, API port and (SPEC §16)
    its identity and node port."""

    hostname: str  # the computer's short name: the instance, and <hostname>.local.
    fingerprint: str
    version: str
    port: int
    identity: str = ""  # SPEC §16: the certificate's pin (TXT id=)
    node_port: int = 0  # SPEC §16: the node listener's port (TXT tls=), 0 = none

    def on(self, interface: Interface) -> Announcement:
        return Announcement(instance=self.hostname, host=f"{self.hostname}.local.",
                            port=self.port, fingerprint=self.fingerprint,
                            version=self.version, addresses=(interface.address,),
                            identity=self.identity, node_port=self.node_port)


def _key(interface: Interface) -> str:
    return f"{interface.name}/{interface.index}/{interface.address}"


class Discovery:
    def __init__(self, link: Link, me: Me, *, publish: Callable[[list[dict[str, Any]]], None],
                 configured: Callable[[], Container[str]], own_host: OwnHost | None = None,
                 rng: random.Random | None = None) -> None:
        self.link = link
        self.me = me
        self.publish = publish  # the list changed: publish it (the `discovered` event)
        self.configured = configured  # the fingerprints of the config's nodes, now
        self.own_host = own_host
        self.rng = rng or random.Random()
        self.interfaces: dict[str, Interface] = {}
        self.registry = Discovered(me.fingerprint)
        self.announcer: Announcer | None = None
        self.browser: Browser | None = None
        self._want = (False, False)  # (announce, browse)
        self._want_changed = trio.Event()
        self._scopes: dict[str, trio.CancelScope] = {}
        self._published: list[dict[str, Any]] = []

    def __repr__(self) -> str:
        return (f"Discovery({self.me.hostname!r}, announce={self.announcer is not None}, "
                f"browse={self.browser is not None}, {len(self.interfaces)} interface(s))")

    def set_modes(self, announce: bool, browse: bool) -> None:
        """Announce and browse, or not (applied by :meth:`run` at once); the list is
        published again if the config changed what it shows (``added``)."""
        if self._want != (announce, browse):
            self._want = (announce, browse)
            self._want_changed.set()
        self.list_changed()

    def computers(self) -> list[dict[str, Any]]:
        """The ``GET /api/v1/nodes/discovered`` list (empty while not browsing)."""
        if self.browser is None:
            return []
        return self.registry.entries(self.configured())

    def list_changed(self) -> None:
        computers = self.computers()
        if computers != self._published:
            self._published = computers
            self.publish(computers)

    async def withdraw(self) -> None:
        """Stop announcing now, goodbyes sent (bounded): the gateway is draining."""
        self._want = (False, self._want[1])
        announcer = self.announcer
        if announcer is not None:
            with trio.move_on_after(GOODBYE_TIMEOUT):
                await announcer.goodbye()
            self._scopes["announce"].cancel()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        async with trio.open_nursery() as nursery:
            self._relist()
            nursery.start_soon(self._receive)
            nursery.start_soon(self._follow_interfaces)
            task_status.started()
            while True:
                await self._apply(nursery)
                self._want_changed = trio.Event()
                await self._want_changed.wait()

    async def _apply(self, nursery: trio.Nursery) -> None:
        announce, browse = self._want
        if announce and self.announcer is None:
            self.announcer = Announcer(self.link, self.me.on, self.interfaces, rng=self.rng)
            await nursery.start(self._part, "announce", self.announcer.run)
            log.info("announcing %s on port %d", self.me.hostname, self.me.port)
        elif not announce and self.announcer is not None:
            self._scopes["announce"].cancel()  # its goodbyes go out as it ends
        if browse and self.browser is None:
            self.browser = Browser(self.link, self.registry, self.interfaces,
                                   self.list_changed)
            await nursery.start(self._part, "browse", self.browser.run)
            log.info("looking for other computers")
        elif not browse and self.browser is not None:
            self._scopes["browse"].cancel()

    async def _part(self, name: str, run: Callable[..., Any], *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the announcer or the browser in a cancel scope of its own."""
        with trio.CancelScope() as scope:
            self._scopes[name] = scope
            try:
                await run(task_status=task_status)
            finally:
                if name == "announce":
                    self.announcer = None
                else:
                    self.browser = None
                    self.list_changed()
                self._want_changed.set()  # switched back on meanwhile: start it again

    def _relist(self) -> None:
        """List the interfaces: join the new ones, leave the gone ones, tell the parts."""
        try:
            everything = self.link.interfaces()
        except OSError as exc:
            log.warning("cannot list the interfaces: %s", exc)
            return
        if self.own_host is not None:
            self.own_host.update(everything)
        now = {_key(i): i for i in mdns_interfaces(everything)}
        for key in [k for k in self.interfaces if k not in now]:
            gone = self.interfaces.pop(key)
            self.link.leave(gone)
            for part in (self.announcer, self.browser):
                if part is not None:
                    part.removed(key)
            log.info("mDNS interface %s (%s) gone", gone.name, gone.address)
        for key, interface in now.items():
            if key in self.interfaces:
                continue
            try:
                self.link.join(interface)
            except OSError as exc:
                log.warning("cannot join the mDNS group on %s (%s): %s",
                            interface.name, interface.address, exc)
                continue
            self.interfaces[key] = interface
            for part in (self.announcer, self.browser):
                if part is not None:
                    part.added(key, interface)
            log.info("mDNS on interface %s (%s)", interface.name, interface.address)

    async def _follow_interfaces(self) -> None:
        while True:
            await trio.sleep(RELIST)
            self._relist()

    async def _receive(self) -> None:
        while True:
            data, source = await self.link.receive()
            key = next((k for k, i in self.interfaces.items() if i.contains(source[0])),
                       None)
            if key is None:  # not from a link we are on
                continue
            if self.announcer is not None:
                self.announcer.on_packet(data, source, key)
            if self.browser is not None:
                self.browser.on_packet(data, source)
