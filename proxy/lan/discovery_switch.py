"""LAN discovery's switch (SPEC §14): it follows the live config and runs
:mod:`proxy.lan.discovery` while announcing or browsing takes effect
(:func:`protocol.config.discovery_effect`), and not otherwise.

With both off nothing of discovery is loaded: the package is imported the first time one
of them takes effect, at start or later (tests/test_lazy_imports.py). Turning both off
cancels the service (the announcer's goodbyes go out as it ends); a draining gateway
withdraws the announcement before its listeners close (:meth:`DiscoverySwitch.withdraw`).
A socket that cannot be opened (port 5353 held without sharing) is a notification, and
the next settings change tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from protocol.config import discovery_effect
from proxy.lan.own_host import OwnHost, short_hostname
from proxy.observe.hub import Hub

if TYPE_CHECKING:
    from protocol.config import Config
    from proxy.lan.discovery.link import Link
    from proxy.lan.discovery.service import Discovery
    from proxy.notifications import Notifications
    from proxy.settings.store import Settings

__all__ = ["UNAVAILABLE", "DiscoverySwitch"]

log = logging.getLogger("sluice.discovery")

UNAVAILABLE = "discovery_unavailable"  # the notification's code


class DiscoverySwitch:
    def __init__(self, settings: Settings, hub: Hub, notifications: Notifications,
                 own_host: OwnHost, *, external: bool, version: str, identity: str = "",
                 node_port: Callable[[], int | None] = lambda: None) -> None:
        self.settings = settings
        self.hub = hub
        self.notifications = notifications
        self.own_host = own_host
        self.external = external  # the API listener binds every address (fixed at start)
        self.version = version
        # How the mDNS link is opened; tests give a fake one (None: the real socket).
        self.open_link: Callable[[], Awaitable[Link]] | None = None
        self.service: Discovery | None = None
        self.port: int | None = None  # the API port, once listening
        self.identity = identity  # SPEC §16: our certificate's pin, announced as TXT id=
        self.node_port = node_port  # SPEC §16: the node listener's once bound, as TXT tls=
        self._scope: trio.CancelScope | None = None
        self._wake = trio.Event()
        self._withdrawn = False

    def __repr__(self) -> str:
        return f"DiscoverySwitch({self.service!r})"

    def modes(self, cfg: Config) -> tuple[bool, bool]:
        """(announce, browse) as they take effect now."""
        announce, browse = discovery_effect(cfg, self.external and self.port is not None)
        return announce and not self._withdrawn, browse

    def computers(self) -> list[dict[str, Any]]:
        return [] if self.service is None else self.service.computers()

    def _changed(self, _config: Config) -> None:
        self._wake.set()

    async def run(self, port: int | None, *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow the config until cancelled (``port``: the API's, None when off)."""
        self.port = port
        unsubscribe = self.settings.subscribe(self._changed)
        try:
            async with trio.open_nursery() as nursery:
                task_status.started()
                while True:
                    self._apply(nursery)
                    self._wake = trio.Event()
                    await self._wake.wait()
        finally:
            unsubscribe()

    def _apply(self, nursery: trio.Nursery) -> None:
        announce, browse = self.modes(self.settings.config)
        if not (announce or browse):
            if self._scope is not None:
                self._scope.cancel()
                self._scope = None
            return
        if self._scope is None:
            self._scope = trio.CancelScope()
            nursery.start_soon(self._run_service, self._scope)
        elif self.service is not None:
            self.service.set_modes(announce, browse)

    async def _run_service(self, scope: trio.CancelScope) -> None:
        # Imported here, when first turned on: a gateway that never is does not load it.
        from proxy.lan.discovery.link import MdnsLink
        from proxy.lan.discovery.service import Discovery, Me

        with scope:
            try:
                link = await (self.open_link or MdnsLink.open)()
            except OSError as exc:
                log.warning("discovery cannot start: %s", exc)
                self.notifications.raise_(UNAVAILABLE, (
                    f"LAN discovery is off: the mDNS socket (UDP 5353) cannot be opened: {exc}"))
                if self._scope is scope:
                    self._scope = None
                return
            self.notifications.clear(UNAVAILABLE)
            me = Me(short_hostname(), self.settings.node_id, self.version, self.port or 0,
                    self.identity, self.node_port() or 0)
            service = Discovery(link, me, publish=self._publish, configured=self._configured,
                                own_host=self.own_host)
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(service.run)
                    self.service = service
                    service.set_modes(*self.modes(self.settings.config))
            finally:
                self.service = None
                link.close()
                if self._scope is scope:
                    self._scope = None
                    self._wake.set()  # ended by itself: look at the config again

    def _configured(self) -> set[str]:
        return {n.fingerprint for n in self.settings.config.nodes}

    def _publish(self, computers: list[dict[str, Any]]) -> None:
        self.hub.publish("discovered", {"computers": computers})

    async def withdraw(self) -> None:
        """The gateway drains: goodbyes now (bounded), before the listeners close; no
        announcement after this."""
        self._withdrawn = True
        if self.service is not None:
            await self.service.withdraw()
