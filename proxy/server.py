"""The whole gateway: its parts made once, then started in the order :data:`START_ORDER`
names (each step with why it comes where it does), all in one nursery, until a stop signal
begins the drain (:mod:`proxy.drain`): stop accepting, let running answers finish until
the drain deadline, then cancel them; remove the socket file and state.json."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

import trio

from protocol.config import Config, ModelConfig
from protocol.model_spec import Bundled, engine_of
from proxy import logsetup
from proxy.accept import accept_loop
from proxy.api.nodes import version
from proxy.binding import Binding
from proxy.connection import IDLE_TIMEOUT, ClientConnection
from proxy.context import Clients, GatewayContext
from proxy.drain import DRAIN_TIMEOUT, Drain
from proxy.files import remove_leftovers
from proxy.lan.discovery_switch import DiscoverySwitch
from proxy.lan.link_warnings import IdentityChanges, PlainLinks
from proxy.lan.node_peers import NodePeers, peers_of
from proxy.lan.own_host import OwnHost
from proxy.link import listener as listeners
from proxy.link.identity import Identity
from proxy.link.listener import Listener, Peer
from proxy.link.node_listener import NodeListener
from proxy.link.tls import End, tls_context
from proxy.link.wire import Wire
from proxy.models.launcher import INSTALL_HINT, llama_available
from proxy.models.llama_backends import LlamaBackends
from proxy.notifications import Notifications
from proxy.observe.access_log import AccessLog
from proxy.observe.hub import Hub
from proxy.observe.metrics import Metrics
from proxy.observe.reports import Reports
from proxy.observe.request_log import RequestLog
from proxy.observe.state_events import StateEvents
from proxy.registry.backends import BackendRegistry, run_health_checks
from proxy.registry.node_checks import run_node_checks
from proxy.registry.nodes import NodeIndex
from proxy.routing.router import Router
from proxy.routing.scheduler import Scheduler
from proxy.settings.config_watch import ConfigWatcher, Follower
from proxy.settings.store import Settings
from proxy.start_steps import Kind, Step
from proxy.upstream.pool import ConnectionPool

if TYPE_CHECKING:
    from proxy.models.ledger import Ledger
    from proxy.models.ondemand import OnDemand

log = logging.getLogger("sluice.server")


class StartupError(Exception):
    """The gateway cannot start; the message says why (exit code 2)."""


class Gateway:
    """The whole gateway. Its parts are made here; the context that connections share is
    made once the listeners are bound (:attr:`ctx`, from then on).

    ``identity`` (SPEC §16): this gateway's certificate, for pinned links to nodes and for
    the node listener (opened with external access on ``api.node_port``), which trusts the
    peers in ``node_peers`` (an empty set when not given). None: neither."""

    ctx: GatewayContext

    def __init__(self, settings: Settings, *, drain_timeout: float = DRAIN_TIMEOUT,
                 extra_models: Sequence[ModelConfig] = (), identity: Identity | None = None,
                 node_peers: NodePeers | None = None, llama: LlamaBackends | None = None,
                 handle_signals: bool = False) -> None:
        self.settings = settings
        self.llama = llama or LlamaBackends()  # SPEC §11.1; given: already known (tests)
        self.drain_timeout = drain_timeout
        self._max_connections = lambda: settings.config.api.max_connections
        self.identity = identity
        self.node_peers = node_peers if node_peers is not None or identity is None \
            else NodePeers()
        if node_peers is None and self.node_peers is not None:  # ours: it follows the keys
            peers = self.node_peers
            settings.keys.watch(lambda keys: peers.set(peers_of(keys)))
        self.connections = ConnectionPool(
            lambda: settings.config.timeouts.connection,
            tls=None if identity is None else tls_context(End.CLIENT, identity))
        self.node_listener = None if identity is None or self.node_peers is None else \
            NodeListener(identity, self.node_peers, lambda: settings.config.timeouts.connection)
        self.backends = BackendRegistry(settings.config.backends, settings.secrets.backend_keys)
        self.nodes = NodeIndex()
        self.hub = Hub()
        self.router = Router(settings, self.backends, self.nodes, self.hub)
        self.request_log = RequestLog(settings.config.observability.request_log_size)
        self.request_log.attach(self.hub)
        settings.subscribe(self.request_log.follow)
        self.notifications = Notifications(self.hub)
        external = settings.config.api.enabled and settings.config.api.allow_external_access
        self.binding = Binding(settings, self.notifications, external=external,
                               node=None if self.node_listener is None
                               else listeners.node(self.node_listener))
        listening = self.binding.listening  # filled in as the listeners are bound
        self.discovery = DiscoverySwitch(  # announced beside fp: TXT id=, tls= (SPEC §16)
            settings, self.hub, self.notifications, OwnHost(), external=external,
            version=version(), identity="" if identity is None else identity.fingerprint,
            node_port=lambda: listening.node_port)
        self.state_events = StateEvents(
            self.hub, settings, self.nodes, self.backends, self.router, self.notifications,
            external=external, identity=None if identity is None else identity.fingerprint)
        self.clients = Clients()
        self.scheduler = Scheduler(settings, self.router)  # the queue (SPEC §18)
        self.metrics = Metrics(self.router, self.clients.by_transport, version(),
                               self.scheduler, lambda: self._ondemand)
        self.metrics.attach(self.hub)
        self._extra_models = extra_models
        self.models = self._model_configs()
        if any(isinstance(engine_of(m), Bundled) for m in self.models) \
                and not llama_available():
            raise StartupError(INSTALL_HINT)
        self.drain = Drain(self.clients, drain_timeout)
        self.watcher = ConfigWatcher(settings, self.notifications)
        self.handle_signals = handle_signals  # the real process (sluice serve): its signals
        self._ondemand: OnDemand | None = None
        self._ledger: Ledger | None = None

    def __repr__(self) -> str:
        return f"Gateway({self.clients!r}, {self.connections!r})"

    def _model_configs(self) -> list[ModelConfig]:
        """The managed models the config names, and the demo's unless the config names it."""
        models = self.settings.config.models
        configured = {m.name for m in models}
        return [*models, *(m for m in self._extra_models if m.name not in configured)]

    def _follow(self, old: Config, new: Config) -> None:
        """A new config, from any source (SPEC §13): the parts made from it at start follow
        it; everything else reads ``ctx.config`` per use."""
        self.backends.follow(new.backends, self.settings.secrets.backend_keys)
        ondemand = self.ctx.ondemand
        if ondemand is not None and (old.models != new.models or
                                     old.model_loading != new.model_loading):
            ondemand.follow(new)

    def shutdown(self) -> None:
        """Begin the graceful stop (what SIGTERM does)."""
        self.drain.begin()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Start every part in :data:`START_ORDER`, serve until the stop, drain."""
        try:
            for step in START_ORDER:
                if step.kind is Kind.SETUP:
                    await step.begin(self)
            with self.drain.everything:  # a second stop signal cancels it all
                await self._start(task_status)
        finally:
            self.binding.close()
            self.connections.close()
            self.binding.remove_state()  # only ours: a second gateway's start leaves it
        log.info("stopped")

    async def _start(self, task_status: trio.TaskStatus[None]) -> None:
        """The background nursery: every task of START_ORDER, then the drain."""
        async with trio.open_nursery() as background:
            for step in START_ORDER:
                task = None if step.kind is Kind.SETUP else step.begin(self)
                if task is None:  # done above, or not in this gateway
                    continue
                if step.kind is Kind.READY:
                    await background.start(task)
                elif step.kind is Kind.SOON:
                    background.start_soon(task)
                else:  # SERVE
                    await task(task_status)
            background.cancel_scope.cancel()

    # -------------------------------------------------------- the steps, in their order

    async def _clean_leftovers(self) -> None:
        for path in (self.settings.config_path, self.settings.secrets_path):
            remove_leftovers(path)

    async def _prepare_models(self) -> None:
        left = self.binding.left_behind  # model servers a killed gateway did not stop
        if left or self.models or self.settings.config.model_loading.dirs:
            from proxy.models.ledger import Ledger

            self._ledger = Ledger(self.binding.record_servers, left)
        self._ondemand = await self._on_demand(self.settings.config)

    async def _build_context(self) -> None:
        self.ctx = GatewayContext(
            settings=self.settings, connections=self.connections, backends=self.backends,
            nodes=self.nodes, router=self.router, notifications=self.notifications,
            clients=self.clients, listening=self.binding.listening, hub=self.hub,
            request_log=self.request_log, metrics=self.metrics, ondemand=self._ondemand,
            reports=Reports(AccessLog(logsetup.line_sink()), self.hub),
            own_host=self.discovery.own_host, discovery=self.discovery,
            identity=self.identity, node_peers=self.node_peers, llama=self.llama,
            scheduler=self.scheduler)
        self.settings.subscribe(Follower(self._follow, self.settings.config))
        self.settings.subscribe(PlainLinks(self.notifications, self.settings.config))
        self.nodes.changes.subscribe(IdentityChanges(self.notifications))

    async def _serve(self, task_status: trio.TaskStatus[None]) -> None:
        """The accept loops until the stop; then the drain."""
        async with trio.open_nursery() as connections:
            async with trio.open_nursery() as accepting:
                for listener, kind in self.binding.listeners:
                    accepting.start_soon(accept_loop, listener, kind, connections,
                                         self.clients, self._max_connections, self._handle)
                accepting.start_soon(self.drain.end_accepting, accepting.cancel_scope)
                task_status.started()
            await self.drain.run(self._stop_listening, self.ctx.events,
                                 connections.cancel_scope)

    async def _stop_listening(self) -> None:
        await self.discovery.withdraw()  # goodbyes while we still listen
        self.binding.close()

    async def _on_demand(self, config: Config) -> OnDemand | None:
        """The managed models (SPEC §11), or None when there can be none: no ``models:``
        entry and no folder to scan. Their modules are imported only when there can be
        some, so a gateway without them does not hold them (tests/test_lazy_imports.py)."""
        if not (self.models or config.model_loading.dirs):
            return None
        from proxy.models.ondemand import OnDemand
        from proxy.models.specs import Estimates, config_problems, prepare

        estimates: Estimates = {}  # GGUF headers read, kept for the rescans
        prepared = await trio.to_thread.run_sync(prepare, self.models, config,
                                                 self.settings.data_dir, estimates)
        problems = config_problems(prepared)
        if problems:  # SPEC §3: an invalid config; serve exits 2
            raise StartupError(f"invalid configuration: {problems[0]}")
        if not (prepared or config.model_loading.dirs):  # a folder may get models later
            return None
        return OnDemand(
            prepared, config, self.settings.data_dir,
            None if self.binding.socket_path is None else self.binding.socket_path.parent,
            self.backends, self.connections, self.hub,
            load_timeout=lambda: self.settings.config.timeouts.model_load,
            models=self._model_configs, config=lambda: self.settings.config,
            estimates=estimates, ledger=self._ledger, notifications=self.notifications)

    async def _handle(self, stream: trio.SocketStream, listener: Listener) -> None:
        transport = listener.transport
        self.clients.by_transport[transport] += 1
        try:
            await listener.serve(stream, self._serve_connection)
        finally:
            self.clients.count -= 1
            self.clients.by_transport[transport] -= 1
            self.drain.connection_closed()

    async def _serve_connection(self, wire: Wire, peer: Peer) -> None:
        """A connection let in by its listener, over the wire it made (SPEC §16: TLS on the
        node listener): served the same way on every listener."""
        await ClientConnection(wire, self.ctx, peer).run()


START_ORDER: tuple[Step, ...] = (
    # Bound before anything else: a second gateway on this data dir fails fast, before it
    # touches a file (state.json included); then state.json says where we listen.
    Step("listeners", Kind.SETUP, lambda g: g.binding.bind()),
    # Bound, no other gateway uses this data dir: temp files of a write cut short by kill -9
    # are ours to remove (the files themselves are whole: proxy/files.py).
    Step("leftover temp files", Kind.SETUP, Gateway._clean_leftovers),
    # Managed models (GGUF headers read in a thread) before the context, which holds them.
    Step("model preparation", Kind.SETUP, Gateway._prepare_models),
    # The context connections share, once where we listen and the models are known; the
    # parts made from the config follow it from here on.
    Step("context", Kind.SETUP, Gateway._build_context),
    # Hand edits of config.yaml (and SIGHUP) are watched from the first task on: an edit
    # made while the rest starts is not missed.
    Step("config watcher", Kind.READY,
         lambda g: partial(g.watcher.run, signals=g.handle_signals)),
    # sluice serve only: SIGTERM/SIGINT begin the drain; the log is flushed now and then.
    Step("stop signals", Kind.SOON, lambda g: g.drain.watch_signals if g.handle_signals
         else None),
    Step("log flush", Kind.SOON, lambda g: logsetup.flush_periodically if g.handle_signals
         else None),
    # Upstream connections: the probes of connections after streamed answers, ready
    # before the steps below send anything upstream.
    Step("upstream connections", Kind.READY, lambda g: g.connections.run),
    # Model servers a previous gateway of this data dir left running (killed, it could not
    # stop them) are stopped before one of ours starts (a start waits for it).
    Step("leftover model servers", Kind.SOON, lambda g: None if g._ledger is None
         else g._ledger.run),
    # Model servers on demand, when there can be any (they use the connections).
    Step("model servers", Kind.READY, lambda g: None if g._ondemand is None
         else g._ondemand.run),
    # The backends' first health check done before the first request (one that comes
    # before it waits for it: BackendRegistry.wait_for_holder), so it finds its model.
    Step("backend health checks", Kind.READY, lambda g: partial(
        run_health_checks, g.backends, g.connections, lambda: g.settings.config)),
    # The feed of what happens, idle client connections closed, the nodes' checks and
    # the state events: none is needed before the next, so all start at once.
    Step("hub", Kind.SOON, lambda g: g.hub.run),
    Step("idle clients", Kind.SOON, lambda g: partial(g.clients.close_idle, IDLE_TIMEOUT)),
    Step("node checks", Kind.SOON,
         lambda g: partial(run_node_checks, g.nodes, g.connections, g.settings)),
    Step("state events", Kind.SOON, lambda g: g.state_events.run),
    # Where the question of llama.cpp's compute backends runs, once somebody asks it.
    Step("llama.cpp backends", Kind.READY, lambda g: g.llama.run),
    # LAN discovery announces us once everything above can answer.
    Step("discovery", Kind.READY,
         lambda g: partial(g.discovery.run, g.binding.listening.tcp_port)),
    # Accept loops last: a connection finds every part running. Then the drain.
    Step("accept loops", Kind.SERVE, lambda g: g._serve),
)
