"""What every connection shares, built once when the gateway has bound its listeners and
passed explicitly (no module-level singletons). Each part has its own owner:

- ``settings`` — config.yaml and secrets.yaml (:mod:`proxy.settings.store`), and the access keys
  in them, ``settings.keys`` (:mod:`proxy.access.key_store`);
- ``connections`` — idle keep-alive connections to model servers (:mod:`proxy.upstream.pool`);
- ``backends`` — local model servers and their models (:mod:`proxy.registry.backends`);
- ``nodes`` — network nodes and their models (:mod:`proxy.registry.nodes`);
- ``router`` — the routing decision, breakers and counters (:mod:`proxy.routing.router`);
- ``scheduler`` — the queue: which waiting request goes to which free slot
  (:mod:`proxy.routing.scheduler`, SPEC §18);
- ``clients`` — the client connections: how many, draining or not (:class:`Clients`);
- ``listening`` — where the gateway listens (:class:`Listening`, fixed at start);
- ``hub`` — the one feed of what happens (:mod:`proxy.observe.hub`, SPEC §9),
  ``request_log``, the finished requests it reports (:mod:`proxy.observe.request_log`),
  ``metrics``, what ``/metrics`` shows (:mod:`proxy.observe.metrics`), and ``events``, the
  live events subscribers (:mod:`proxy.observe.feed`), and ``reports``, the report phase
  of each request: its access-log line and its record (:mod:`proxy.observe.reports`);
- ``notifications``, ``ondemand`` (managed models on demand, when there are any), and
  ``llama``, the compute backends of the installed llama.cpp, asked once when first wanted
  (:mod:`proxy.models.llama_backends`);
- ``key_grants``, the access keys' token buckets (:mod:`proxy.access.key_grants`, SPEC §13);
- ``pairing``, the pairing code and the claims against it (:mod:`proxy.lan.pairing`, SPEC §14);
- ``own_host``, our addresses for the Host guard (:mod:`proxy.lan.own_host`), and
  ``discovery``, LAN discovery's switch (:mod:`proxy.lan.discovery_switch`, SPEC §14);
- ``identity``, this gateway's certificate (:mod:`proxy.link.identity`), and ``node_peers``,
  the paired peers the node listener trusts (:mod:`proxy.lan.node_peers`, SPEC §16), when
  the gateway has them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import attrs
import trio

from protocol.config import Config
from proxy.access.key_grants import KeyGrants
from proxy.lan.own_host import OwnHost
from proxy.lan.pairing import Pairing
from proxy.link.identity import Identity
from proxy.models.llama_backends import LlamaBackends
from proxy.notifications import Notifications
from proxy.observe.access_log import AccessLog
from proxy.observe.feed import EventFeed
from proxy.observe.hub import Hub
from proxy.observe.metrics import Metrics
from proxy.observe.reports import Reports
from proxy.observe.request_log import RequestLog
from proxy.registry.backends import BackendRegistry
from proxy.registry.nodes import NodeIndex
from proxy.routing.router import Router
from proxy.routing.scheduler import Scheduler
from proxy.upstream.pool import ConnectionPool

if TYPE_CHECKING:
    from proxy.lan.discovery_switch import DiscoverySwitch
    from proxy.lan.node_peers import NodePeers
    from proxy.models.ondemand import OnDemand
    from proxy.settings.store import Settings


@attrs.frozen
class Listening:
    """Where this gateway listens: its local socket (or, when no socket folder works, the
    loopback TCP port standing in for it), the TCP API port and the node listener's TLS
    port (None when off)."""

    socket_path: str | None = None
    local_tcp_port: int | None = None
    tcp_port: int | None = None
    external: bool = False  # the API listener binds every address (allow_external_access)
    node_port: int | None = None  # the TLS listener for paired gateways (SPEC §16)


class Clients:
    """The client connections of the gateway: the count (for ``api.max_connections``), the
    count per transport (``unix``, ``tcp``: the metrics' gauge), the idle keep-alive ones
    and the drain. Owned by the server.

    A connection waiting for its next request registers in ``idle`` (with the moment it
    began to wait) instead of opening a cancel scope per request (entering and leaving one
    costs more than the rest of a small request's bookkeeping): :meth:`close_idle` runs
    once per gateway and ends each wait that reaches ``idle_timeout``; a drain ends them all
    at once."""

    __slots__ = ("_wake", "by_transport", "count", "draining", "idle")

    def __init__(self) -> None:
        self.count = 0
        self.by_transport = {"unix": 0, "tcp": 0}
        self.draining = False
        # A connection -> when its idle wait began; oldest first (a wait re-registers).
        self.idle: dict[IdleWait, float] = {}
        self._wake: trio.Event | None = None

    def __repr__(self) -> str:
        return f"Clients(count={self.count}, idle={len(self.idle)}, draining={self.draining})"

    def wait_idle(self, connection: IdleWait) -> None:
        """``connection`` waits for its next request from now on (until :meth:`busy`)."""
        idle = self.idle
        idle[connection] = trio.current_time()
        if len(idle) == 1 and self._wake is not None:
            self._wake.set()

    def busy(self, connection: IdleWait) -> None:
        self.idle.pop(connection, None)

    def begin_drain(self) -> None:
        """Stop taking requests: idle connections close now, busy ones after their answer."""
        self.draining = True
        for connection in list(self.idle):
            connection.end_idle()

    async def close_idle(self, idle_timeout: float) -> None:
        """End every idle wait that reaches ``idle_timeout``, until cancelled. It sleeps
        until the oldest wait is due (newer ones are due later), or until there is one."""
        idle = self.idle
        while True:
            if not idle:
                self._wake = trio.Event()
                await self._wake.wait()
                self._wake = None
                continue
            connection, since = next(iter(idle.items()))
            await trio.sleep_until(since + idle_timeout)
            if idle.get(connection) == since:  # still that wait: it is over
                del idle[connection]
                connection.end_idle()


class IdleWait(Protocol):
    """A client connection, as :class:`Clients` sees its idle wait."""

    def end_idle(self) -> None:
        """The wait is over (idle too long, or a drain): the connection closes quietly."""


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
    ondemand: OnDemand | None = None
    events: EventFeed = attrs.field(
        default=attrs.Factory(lambda ctx: EventFeed(ctx.hub), takes_self=True))
    reports: Reports = attrs.field(factory=lambda: Reports(AccessLog()))
    key_grants: KeyGrants = attrs.field(factory=KeyGrants)  # access keys' buckets (SPEC §13)
    pairing: Pairing = attrs.field(  # the pairing code and its claims (SPEC §14)
        default=attrs.Factory(lambda ctx: Pairing(ctx.hub, ctx.notifications), takes_self=True))
    own_host: OwnHost = attrs.field(factory=OwnHost)  # the Host guard's addresses (SPEC §14)
    discovery: DiscoverySwitch | None = None  # LAN discovery (SPEC §14)
    identity: Identity | None = None  # this gateway's certificate (SPEC §16)
    node_peers: NodePeers | None = None  # the paired peers (SPEC §16)
    llama: LlamaBackends = attrs.field(factory=LlamaBackends)  # SPEC §11.1
    scheduler: Scheduler = attrs.field(  # the queue in front of every server (SPEC §18)
        default=attrs.Factory(lambda ctx: Scheduler(ctx.settings, ctx.router), takes_self=True))

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
    def node_port(self) -> int | None:
        return self.listening.node_port

    @property
    def connection_count(self) -> int:
        return self.clients.count
