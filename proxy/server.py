"""Starts everything in one nursery — backend health checks, listeners, connections — and
drains gracefully on SIGTERM/SIGINT: stop accepting, let running answers finish until the
drain deadline, then cancel them; remove the socket file."""

from __future__ import annotations

import errno
import logging
import os
import signal
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from protocol.config import Config, ModelConfig
from protocol.errors import overloaded
from protocol.response import Response
from proxy import logsetup
from proxy.api.nodes import version
from proxy.config_watch import ConfigWatcher, Follower
from proxy.connection import IDLE_TIMEOUT, ClientConnection
from proxy.context import Clients, GatewayContext, Listening
from proxy.datadir import STATE_FILE, GatewayState, write_state
from proxy.discovery_switch import DiscoverySwitch
from proxy.files import remove_leftovers
from proxy.listeners import (
    SOCKET_NAME,
    ListenerError,
    bound_port,
    choose_socket_dir,
    open_api_listeners,
    open_tcp_listener,
    open_unix_listener,
    refuse_if_running,
    remove_stale_sockets,
)
from proxy.models.launcher import INSTALL_HINT, llama_available
from proxy.notifications import Notifications
from proxy.observe.access_log import AccessLog
from proxy.observe.hub import Hub
from proxy.observe.metrics import Metrics
from proxy.observe.reports import Reports
from proxy.observe.request_log import RequestLog
from proxy.observe.state_events import StateEvents
from proxy.own_host import OwnHost
from proxy.pool.backends import BackendRegistry, run_health_checks
from proxy.pool.node_checks import run_node_checks
from proxy.pool.nodes import NodeIndex
from proxy.routing.router import Router
from proxy.settings import Settings
from proxy.upstream_pool import ConnectionPool

if TYPE_CHECKING:
    from proxy.models.ondemand import OnDemand

log = logging.getLogger("sluice.server")

DRAIN_TIMEOUT = 30.0  # seconds running answers get to finish after a stop signal
_ACCEPT_RETRY = 0.1  # pause after EMFILE and friends before accepting again
_TURNED_AWAY_DRAIN = 64 * 1024  # request bytes read (and dropped) from a turned-away connection
_FD_ERRORS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}


class StartupError(Exception):
    """The gateway cannot start; the message says why (exit code 2)."""


class Gateway:
    """The whole gateway. Its parts are made here; the context that connections share is
    made once the listeners are bound (:attr:`ctx`, from then on)."""

    ctx: GatewayContext

    def __init__(self, settings: Settings, *, drain_timeout: float = DRAIN_TIMEOUT,
                 extra_models: Sequence[ModelConfig] = ()) -> None:
        self.settings = settings
        self.drain_timeout = drain_timeout
        self.connections = ConnectionPool(lambda: settings.config.timeouts.connection)
        self.backends = BackendRegistry(settings.config.backends, settings.secrets.backend_keys)
        self.nodes = NodeIndex()
        self.hub = Hub()
        self.router = Router(settings, self.backends, self.nodes, self.hub)
        self.request_log = RequestLog(settings.config.observability.request_log_size)
        self.request_log.attach(self.hub)
        settings.subscribe(self.request_log.follow)
        self.notifications = Notifications(self.hub)
        external = settings.config.api.enabled and settings.config.api.allow_external_access
        self.discovery = DiscoverySwitch(settings, self.hub, self.notifications, OwnHost(),
                                         external=external, version=version())
        self.state_events = StateEvents(self.hub, settings, self.nodes, self.backends,
                                        self.router, self.notifications, external=external)
        self.clients = Clients()
        self.metrics = Metrics(self.router, self.clients.by_transport, version())
        self.metrics.attach(self.hub)
        self._extra_models = extra_models
        self.models = self._model_configs()
        if self.models and not llama_available():
            raise StartupError(INSTALL_HINT)
        self._stop = trio.Event()
        self._drained = trio.Event()
        self._socket_path: Path | None = None
        self._socket_id: tuple[int, int] | None = None  # (st_dev, st_ino) of our socket file
        self._state_file = settings.data_dir / STATE_FILE

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
        self._stop.set()

    async def run(self, *, handle_signals: bool = False,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners, listening = await self._open_listeners()
        # Bound: no other gateway uses this data folder. Temp files of a write cut short
        # by kill -9 go (the files themselves are whole: proxy/files.py).
        for path in (self.settings.config_path, self.settings.secrets_path):
            remove_leftovers(path)
        try:
            ondemand = await self._on_demand(self.settings.config)
            self.metrics.ondemand = ondemand
            self.ctx = GatewayContext(
                settings=self.settings, connections=self.connections, backends=self.backends,
                nodes=self.nodes, router=self.router, notifications=self.notifications,
                clients=self.clients, listening=listening, hub=self.hub,
                request_log=self.request_log, metrics=self.metrics, ondemand=ondemand,
                reports=Reports(AccessLog(logsetup.line_sink()), self.hub),
                own_host=self.discovery.own_host, discovery=self.discovery)
            self.settings.subscribe(Follower(self._follow, self.settings.config))
            watcher = ConfigWatcher(self.settings, self.notifications)
            async with trio.open_nursery() as background:
                await background.start(partial(watcher.run, signals=handle_signals))
                if handle_signals:  # the real process: sluice serve
                    background.start_soon(self._watch_signals, background.cancel_scope)
                    background.start_soon(logsetup.flush_periodically)
                await background.start(self.connections.run)  # probes after streams
                if ondemand is not None:
                    await background.start(ondemand.run)
                # Requests that come before a backend's first check wait for it
                # (BackendRegistry.wait_for_holder), so the first request finds its model.
                await background.start(run_health_checks, self.backends, self.connections,
                                       lambda: self.settings.config)
                background.start_soon(self.hub.run)
                background.start_soon(self.clients.close_idle, IDLE_TIMEOUT)
                background.start_soon(run_node_checks, self.nodes, self.connections,
                                      self.settings)
                background.start_soon(self.state_events.run)
                await background.start(self.discovery.run, listening.tcp_port)
                async with trio.open_nursery() as connections:
                    async with trio.open_nursery() as accepting:
                        for listener, transport in listeners:
                            accepting.start_soon(self._accept_loop, listener, transport,
                                                 connections)
                        accepting.start_soon(self._wait_for_stop, accepting.cancel_scope)
                        task_status.started()
                    await self.discovery.withdraw()  # goodbyes while we still listen
                    for listener, _ in listeners:
                        listener.socket.close()
                    self._remove_socket()
                    log.info("stopping: %d connection(s) to drain", self.clients.count)
                    self.clients.begin_drain()
                    self.ctx.events.close_all()  # live events subscribers: close code 1001
                    if self.clients.count:
                        with trio.move_on_after(self.drain_timeout):
                            await self._drained.wait()
                    connections.cancel_scope.cancel()
                background.cancel_scope.cancel()
        finally:
            for listener, _ in listeners:
                listener.socket.close()
            self.connections.close()
            self._remove_socket()
            self._state_file.unlink(missing_ok=True)
        log.info("stopped")

    async def _on_demand(self, config: Config) -> OnDemand | None:
        """The managed models (SPEC §11), or None when there can be none: no ``models:``
        entry and no folder to scan. Their modules are imported only when there can be
        some, so a gateway without them does not hold them (tests/test_lazy_imports.py)."""
        if not (self.models or config.model_loading.dirs):
            return None
        from proxy.models.ondemand import Estimates, OnDemand, prepare

        estimates: Estimates = {}  # GGUF headers read, kept for the rescans
        prepared = await trio.to_thread.run_sync(prepare, self.models, config,
                                                 self.settings.data_dir, estimates)
        if not (prepared or config.model_loading.dirs):  # a folder may get models later
            return None
        return OnDemand(
            prepared, config, self.settings.data_dir,
            None if self._socket_path is None else self._socket_path.parent,
            self.backends, self.connections, self.hub,
            load_timeout=lambda: self.settings.config.timeouts.model_load,
            models=self._model_configs, config=lambda: self.settings.config,
            estimates=estimates)

    async def _watch_signals(self, everything: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                if self._stop.is_set():
                    log.warning("second %s: cancelling running answers",
                                signal.Signals(signum).name)
                    everything.cancel()
                    self.clients.begin_drain()
                    self._drained.set()
                    return
                log.info("%s received: draining (send again to stop at once)",
                         signal.Signals(signum).name)
                self.shutdown()

    async def _wait_for_stop(self, accepting: trio.CancelScope) -> None:
        await self._stop.wait()
        accepting.cancel()

    async def _open_listeners(self) -> tuple[list[tuple[trio.SocketListener, str]], Listening]:
        """Bind every listener (SPEC §4): the local socket in the first usable folder, else
        127.0.0.1 on ``local.fallback_port``; then the API server unless disabled."""
        cfg = self.settings.config
        out: list[tuple[trio.SocketListener, str]] = []
        api_hosts: list[str] = []
        socket_path: str | None = None
        local_tcp_port: int | None = None
        tcp_port: int | None = None
        try:
            await refuse_if_running(self.settings.data_dir)
            choice = choose_socket_dir(cfg.local.socket_dir, self.settings.data_dir)
            await remove_stale_sockets(f for f in choice.candidates if f != choice.folder)
            if choice.folder is not None:
                path = choice.folder / SOCKET_NAME
                out.append((await open_unix_listener(path), "unix"))
                info = os.lstat(path)
                self._socket_path, self._socket_id = path, (info.st_dev, info.st_ino)
                socket_path = os.fspath(path)
            else:
                # Never a wildcard address, whatever allow_external_access says: this stands
                # in for the private socket, it does not publish anything.
                listener = await open_tcp_listener("127.0.0.1", cfg.local.fallback_port)
                out.append((listener, "local-tcp"))
                local_tcp_port = bound_port(listener)
                self.notifications.raise_("local_socket_unavailable", (
                    "no folder works for the local socket ("
                    f"{choice.reasons()}), so the local listener is on loopback TCP "
                    f"127.0.0.1:{local_tcp_port} instead: any local process can "
                    "reach it and the admin token is the only guard. Set local.socket_dir to "
                    "a short private folder (or make /tmp writable) and restart."))
            if cfg.api.enabled:
                external = cfg.api.allow_external_access
                api = await open_api_listeners(cfg.api.port, external=external)
                out.extend((listener, "tcp") for listener in api)
                tcp_port = bound_port(api[0])
                api_hosts = [listener.socket.getsockname()[0] for listener in api]
                if external and not self.settings.keys.all:
                    self.notifications.raise_("external_access_without_keys", (
                        "external access is on but no access key exists: remote clients "
                        "will be refused until one is made (sluice keys create)"))
            ollama_port = await self._open_ollama_listener(cfg.ollama_api.port, out)
        except BaseException:
            for listener, _ in out:
                listener.socket.close()
            self._remove_socket()
            raise
        listening = Listening(socket_path, local_tcp_port, tcp_port, self.discovery.external)
        where = [f"unix:{socket_path}"] if socket_path else []
        if local_tcp_port is not None:
            where.append(f"http://127.0.0.1:{local_tcp_port} (local fallback)")
        where.extend(f"http://{host if ':' not in host else f'[{host}]'}:{tcp_port}"
                     for host in api_hosts)
        if ollama_port is not None:
            where.append(f"http://127.0.0.1:{ollama_port} (the Ollama API)")
        log.info("sluice listening on %s", " and ".join(where))
        self._write_state(listening)
        return out, listening

    async def _open_ollama_listener(self, port: int,
                                    out: list[tuple[trio.SocketListener, str]]) -> int | None:
        """``ollama_api.port``: a loopback-only listener for apps that speak only Ollama's
        API (SPEC §12), served like the local fallback (loopback, no key). A port in use
        is a notification, not a failure to start."""
        if not port:
            return None
        try:
            listener = await open_tcp_listener("127.0.0.1", port)
        except ListenerError as exc:
            self.notifications.raise_("ollama_port_unavailable", (
                f"the Ollama API listener is off: {exc}; is Ollama itself running? Stop it, or set "
                "ollama_api.port to another port (0 = off), and restart sluice."))
            return None
        out.append((listener, "local-tcp"))
        return bound_port(listener)

    def _write_state(self, listening: Listening) -> None:
        """Where this gateway listens, for the CLI (``sluice status``) to find it: the
        socket path, or the fallback port when no socket folder works."""
        write_state(self.settings.data_dir, GatewayState(
            pid=os.getpid(), socket_path=listening.socket_path,
            local_tcp_port=listening.local_tcp_port, tcp_port=listening.tcp_port))

    def _remove_socket(self) -> None:
        """Remove our socket file, unless it is no longer ours (replaced meanwhile)."""
        path, self._socket_path = self._socket_path, None
        if path is None:
            return
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return
        if (info.st_dev, info.st_ino) == self._socket_id:
            path.unlink(missing_ok=True)

    async def _accept_loop(self, listener: trio.SocketListener, transport: str,
                           nursery: trio.Nursery) -> None:
        starved = False  # accept is failing for want of descriptors (logged once)
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno in _FD_ERRORS:
                    if not starved:  # once per episode: a flood must not flood the log
                        log.error("accept failed (%s); retrying every %gs",
                                  os.strerror(exc.errno or 0), _ACCEPT_RETRY)
                        starved = True
                    await trio.sleep(_ACCEPT_RETRY)
                    continue
                raise
            if starved:
                log.warning("accepting connections again")
                starved = False
            if self.clients.count >= self.settings.config.api.max_connections:
                nursery.start_soon(self._turn_away, stream)
            else:
                self.clients.count += 1
                nursery.start_soon(self._handle, stream, transport)

    async def _handle(self, stream: trio.SocketStream, transport: str) -> None:
        kind = "unix" if transport == "unix" else "tcp"  # local-tcp is TCP too
        self.clients.by_transport[kind] += 1
        try:
            await ClientConnection(stream, self.ctx, transport=transport).run()
        finally:
            self.clients.count -= 1
            self.clients.by_transport[kind] -= 1
            if self.clients.draining and not self.clients.count:
                self._drained.set()

    async def _turn_away(self, stream: trio.SocketStream) -> None:
        """Over api.max_connections: a fast 503 without reading the request, then close."""
        err = overloaded("too many connections (api.max_connections); try again shortly")
        answer = Response(keep_alive=False).whole(
            err.status, [(b"content-type", b"application/json")], err.body())
        with trio.move_on_after(1):
            try:
                await stream.send_all(answer)
                # Closing with unread request bytes would send a reset that can destroy the
                # 503 in flight: finish our side, then drain briefly before closing.
                await stream.send_eof()
                drained = 0
                while drained < _TURNED_AWAY_DRAIN and (data := await stream.receive_some(65536)):
                    drained += len(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
        stream.socket.close()


def drain_timeout() -> float:
    """DRAIN_TIMEOUT, or the seconds in ``$SLUICE_DRAIN_TIMEOUT`` (a hidden knob for tests)."""
    try:
        value = float(os.environ.get("SLUICE_DRAIN_TIMEOUT", DRAIN_TIMEOUT))
    except ValueError:
        return DRAIN_TIMEOUT
    return value if value > 0 else DRAIN_TIMEOUT


def serve(settings: Settings, extra_models: Sequence[ModelConfig] = ()) -> int:
    """Run the gateway until a stop signal; the process exit code."""
    try:
        gateway = Gateway(settings, drain_timeout=drain_timeout(), extra_models=extra_models)
        trio.run(lambda: gateway.run(handle_signals=True))
    except (ListenerError, StartupError) as exc:
        log.error("%s", exc)
        return 2
    return 0
