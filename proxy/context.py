"""What every connection shares, built once when the gateway has bound its listeners and
passed explicitly (no module-level singletons). Each part has its own owner:

- ``settings`` — config.yaml and secrets.yaml (:mod:`proxy.settings`);
- ``connections`` — idle keep-alive connections to model servers (:mod:`proxy.upstream`);
- ``backends`` — local model servers and their models (:mod:`proxy.pool.backends`);
- ``nodes`` — network nodes and their models (:mod:`proxy.pool.nodes`);
- ``router`` — the routing decision, breakers and counters (:mod:`proxy.routing.router`);
- ``clients`` — the client connections: how many, draining or not (:class:`Clients`);
- ``listening`` — where the gateway listens (:class:`Listening`, fixed at start);
- ``hub`` — the one feed of what happens (:mod:`proxy.observe.hub`, SPEC §9),
  ``request_log``, the finished requests it reports (:mod:`proxy.observe.request_log`),
  ``metrics``, what ``/metrics`` shows (:mod:`proxy.observe.metrics`), and ``events``, the
  live events subscribers (:mod:`proxy.observe.feed`), and ``reports``, the report phase
  of each request: its access-log line and its record (:mod:`proxy.observe.reports`);
- ``notifications``, ``supervisor`` (managed model servers, when there are any).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import trio

from protocol.config import Config
from proxy.notifications import Notifications
from proxy.observe.access_log import AccessLog
from proxy.observe.feed import EventFeed
from proxy.observe.hub import Hub
from proxy.observe.metrics import Metrics
from proxy.observe.reports import Reports
from proxy.observe.request_log import RequestLog
from proxy.pool.backends import BackendRegistry
from proxy.pool.nodes import NodeIndex
from proxy.routing.router import Router
from proxy.upstream import ConnectionPool

if TYPE_CHECKING:
    from proxy.models.supervisor import Supervisor
    from proxy.settings import Settings


@attrs.frozen
class Listening:
    """Where this gateway listens: its local socket (or, when no socket folder works, the
    loopback TCP port standing in for it) and the TCP API port (None when off)."""

    socket_path: str | None = None
    local_tcp_port: int | None = None
    tcp_port: int | None = None


class Clients:
    """The client connections of the gateway: the count (for ``api.max_connections``), the
    count per transport (``unix``, ``tcp``: the metrics' gauge) and the drain. Owned by the
    server; a connection registers its idle wait here so that a drain ends it at once."""

    __slots__ = ("by_transport", "count", "draining", "idle_scopes")

    def __init__(self) -> None:
        self.count = 0
        self.by_transport = {"unix": 0, "tcp": 0}
        self.draining = False
        self.idle_scopes: set[trio.CancelScope] = set()

    def __repr__(self) -> str:
        return f"Clients(count={self.count}, draining={self.draining})"

    def begin_drain(self) -> None:
        """Stop taking requests: idle connections close now, busy ones after their answer."""
        self.draining = True
        for scope in self.idle_scopes:
            scope.cancel()


@attrs.frozen(repr=False)
class GatewayContext:
    settings: Settings
    connections: ConnectionPool
    backends: BackendRegistry
    nodes: NodeIndex
    router: Router
    notifications: Notifications
    clients: Clients
    listening: Listening
    hub: Hub
    request_log: RequestLog
    metrics: Metrics
    supervisor: Supervisor | None = None
    events: EventFeed = attrs.field(
        default=attrs.Factory(lambda ctx: EventFeed(ctx.hub), takes_self=True))
    reports: Reports = attrs.field(factory=lambda: Reports(AccessLog()))

    def __repr__(self) -> str:
        return f"GatewayContext({self.listening!r}, {self.clients!r}, {self.connections!r})"

    @property
    def config(self) -> Config:
        return self.settings.config

    # Read-only views of the parts above, for status answers and tests.
    @property
    def socket_path(self) -> str | None:
        return self.listening.socket_path

    @property
    def local_tcp_port(self) -> int | None:
        return self.listening.local_tcp_port

    @property
    def tcp_port(self) -> int | None:
        return self.listening.tcp_port

    @property
    def connection_count(self) -> int:
        return self.clients.count
