"""The state shared by every connection, passed explicitly (no module-level singletons)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from protocol.config import Config
from proxy.notifications import Notifications
from proxy.pool.backends import BackendRegistry
from proxy.pool.nodes import NodeIndex
from proxy.routing.router import Router
from proxy.upstream import UpstreamPool

if TYPE_CHECKING:
    from proxy.models.supervisor import Supervisor
    from proxy.settings import Settings


class GatewayContext:
    def __init__(self, settings: Settings, pool: UpstreamPool, backends: BackendRegistry) -> None:
        self.settings = settings
        self.pool = pool
        self.backends = backends
        self.nodes = NodeIndex()  # network nodes and their models (SPEC §7.2)
        self.router = Router(settings, self.nodes)  # breakers, counters, failover (§7.4)
        self.draining = False
        self.idle_scopes: set[trio.CancelScope] = set()  # connections waiting for a request
        self.connection_count = 0
        self.socket_path: str | None = None
        self.local_tcp_port: int | None = None  # the local listener when no socket folder works
        self.tcp_port: int | None = None
        self.supervisor: Supervisor | None = None
        self.notifications = Notifications()

    def __repr__(self) -> str:
        return (f"GatewayContext(connections={self.connection_count}, "
                f"draining={self.draining}, {self.pool!r})")

    @property
    def config(self) -> Config:
        return self.settings.config

    def begin_drain(self) -> None:
        """Stop taking requests: idle connections close now, busy ones after their answer."""
        self.draining = True
        for scope in self.idle_scopes:
            scope.cancel()
