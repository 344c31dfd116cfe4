"""Starts everything in one nursery — backend health checks, listeners, connections — and
drains gracefully on SIGTERM/SIGINT: stop accepting, let running answers finish until the
drain deadline, then cancel them; remove the socket file."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
from collections.abc import Sequence
from pathlib import Path

import trio

from protocol.config import ModelConfig
from protocol.errors import overloaded
from proxy.connection import ClientConnection
from proxy.context import GatewayContext
from proxy.datadir import STATE_FILE, GatewayState, write_state
from proxy.listeners import (
    SOCKET_NAME,
    ListenerError,
    bound_port,
    choose_socket_dir,
    open_api_listeners,
    open_tcp_listener,
    open_unix_listener,
    remove_stale_sockets,
    socket_is_live,
    tcp_port_is_live,
)
from proxy.models.launcher import INSTALL_HINT, llama_available
from proxy.models.supervisor import Supervisor
from proxy.pool.backends import BackendRegistry, run_health_checks
from proxy.pool.nodes import run_node_checks
from proxy.settings import Settings
from proxy.upstream import UpstreamPool

log = logging.getLogger("sluice.server")

DRAIN_TIMEOUT = 30.0  # seconds running answers get to finish after a stop signal
_ACCEPT_RETRY = 0.1  # pause after EMFILE and friends before accepting again
_REFUSE_DRAIN = 64 * 1024  # request bytes read (and dropped) from a refused connection
_FD_ERRORS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}


class StartupError(Exception):
    """The gateway cannot start; the message says why (exit code 2)."""


class Gateway:
    def __init__(self, settings: Settings, *, drain_timeout: float = DRAIN_TIMEOUT,
                 extra_models: Sequence[ModelConfig] = ()) -> None:
        self.settings = settings
        self.drain_timeout = drain_timeout
        self.pool = UpstreamPool()
        self.backends = BackendRegistry(settings.config.backends, settings.secrets.backend_keys)
        self.ctx = GatewayContext(settings, self.pool, self.backends)
        configured = {m.name for m in settings.config.models}
        self.models = [*settings.config.models,
                       *(m for m in extra_models if m.name not in configured)]
        if self.models and not llama_available():
            raise StartupError(INSTALL_HINT)
        self._stop = trio.Event()
        self._drained = trio.Event()
        self._socket_path: Path | None = None
        self._socket_id: tuple[int, int] | None = None  # (st_dev, st_ino) of our socket file
        self._state_file = settings.data_dir / STATE_FILE

    def __repr__(self) -> str:
        return f"Gateway(socket={self.ctx.socket_path}, port={self.ctx.tcp_port}, {self.ctx!r})"

    def shutdown(self) -> None:
        """Begin the graceful stop (what SIGTERM does)."""
        self._stop.set()

    async def run(self, *, handle_signals: bool = False,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await self._open_listeners()
        try:
            async with trio.open_nursery() as background:
                if handle_signals:
                    background.start_soon(self._watch_signals, background.cancel_scope)
                if self.models:
                    supervisor = Supervisor(
                        self.models, self.settings.data_dir,
                        None if self._socket_path is None else self._socket_path.parent,
                        self.backends, self.pool)
                    self.ctx.supervisor = supervisor
                    background.start_soon(supervisor.run)
                # Requests that come before a backend's first check wait for it
                # (BackendRegistry.wait_for_holder), so the first request finds its model.
                await background.start(run_health_checks, self.backends, self.pool,
                                       lambda: self.settings.config)
                background.start_soon(run_node_checks, self.ctx.nodes, self.pool, self.settings)
                async with trio.open_nursery() as connections:
                    async with trio.open_nursery() as accepting:
                        for listener, transport in listeners:
                            accepting.start_soon(self._accept_loop, listener, transport,
                                                 connections)
                        accepting.start_soon(self._wait_for_stop, accepting.cancel_scope)
                        task_status.started()
                    for listener, _ in listeners:
                        listener.socket.close()
                    self._remove_socket()
                    log.info("stopping: %d connection(s) to drain", self.ctx.connection_count)
                    self.ctx.begin_drain()
                    if self.ctx.connection_count:
                        with trio.move_on_after(self.drain_timeout):
                            await self._drained.wait()
                    connections.cancel_scope.cancel()
                background.cancel_scope.cancel()
        finally:
            for listener, _ in listeners:
                listener.socket.close()
            self.pool.close()
            self._remove_socket()
            self._state_file.unlink(missing_ok=True)
        log.info("stopped")

    async def _watch_signals(self, everything: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                if self._stop.is_set():
                    log.warning("second %s: cancelling running answers",
                                signal.Signals(signum).name)
                    everything.cancel()
                    self.ctx.begin_drain()
                    self._drained.set()
                    return
                log.info("%s received: draining (send again to stop at once)",
                         signal.Signals(signum).name)
                self.shutdown()

    async def _wait_for_stop(self, accepting: trio.CancelScope) -> None:
        await self._stop.wait()
        accepting.cancel()

    async def _open_listeners(self) -> list[tuple[trio.SocketListener, str]]:
        """Bind every listener (SPEC §4): the local socket in the first usable folder, else
        127.0.0.1 on ``local.fallback_port``; then the API server unless disabled."""
        cfg = self.settings.config
        out: list[tuple[trio.SocketListener, str]] = []
        api_hosts: list[str] = []
        try:
            await self._refuse_if_running()
            choice = choose_socket_dir(cfg.local.socket_dir, self.settings.data_dir)
            await remove_stale_sockets(f for f in choice.candidates if f != choice.folder)
            if choice.folder is not None:
                path = choice.folder / SOCKET_NAME
                out.append((await open_unix_listener(path), "unix"))
                info = os.lstat(path)
                self._socket_path, self._socket_id = path, (info.st_dev, info.st_ino)
                self.ctx.socket_path = os.fspath(path)
            else:
                # Never a wildcard address, whatever allow_external_access says: this stands
                # in for the private socket, it does not publish anything.
                listener = await open_tcp_listener("127.0.0.1", cfg.local.fallback_port)
                out.append((listener, "local-tcp"))
                self.ctx.local_tcp_port = bound_port(listener)
                self.ctx.notifications.raise_("local_socket_unavailable", (
                    "no folder works for the local socket ("
                    f"{choice.reasons()}), so the local listener is on loopback TCP "
                    f"127.0.0.1:{self.ctx.local_tcp_port} instead: any local process can "
                    "reach it and the admin token is the only guard. Set local.socket_dir to "
                    "a short private folder (or make /tmp writable) and restart."))
            if cfg.api.enabled:
                external = cfg.api.allow_external_access
                api = await open_api_listeners(cfg.api.port, external=external)
                out.extend((listener, "tcp") for listener in api)
                self.ctx.tcp_port = bound_port(api[0])
                api_hosts = [listener.socket.getsockname()[0] for listener in api]
                if external and not self.settings.secrets.access_keys:
                    self.ctx.notifications.raise_("external_access_without_keys", (
                        "external access is on but no access key exists: remote clients "
                        "will be refused until one is made (sluice keys create)"))
        except BaseException:
            for listener, _ in out:
                listener.socket.close()
            self._remove_socket()
            raise
        where = [f"unix:{self.ctx.socket_path}"] if self.ctx.socket_path else []
        if self.ctx.local_tcp_port is not None:
            where.append(f"http://127.0.0.1:{self.ctx.local_tcp_port} (local fallback)")
        where.extend(f"http://{host if ':' not in host else f'[{host}]'}:{self.ctx.tcp_port}"
                     for host in api_hosts)
        log.info("sluice listening on %s", " and ".join(where))
        self._write_state()
        return out

    async def _refuse_if_running(self) -> None:
        """Another gateway on this data dir (its state file names a live process whose
        local listener answers) means we must not start: exit 2 saying so."""
        try:
            state = json.loads(self._state_file.read_text())
        except (OSError, ValueError):
            return
        pid = state.get("pid") if isinstance(state, dict) else None
        if not isinstance(pid, int) or pid <= 0:
            return
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass
        path, port = state.get("socketPath"), state.get("localTcpPort")
        where = None
        if isinstance(path, str):
            try:
                if await socket_is_live(Path(path)):
                    where = path
            except OSError:
                pass
        if isinstance(port, int) and 0 < port < 65536 and await tcp_port_is_live(port):
            where = f"127.0.0.1:{port}"
        if where is not None:
            raise ListenerError(f"another gateway (pid {pid}) is already running for "
                                f"{self.settings.data_dir}: it answers on {where}")

    def _write_state(self) -> None:
        """Where this gateway listens, for the CLI (``sluice status``) to find it: the
        socket path, or the fallback port when no socket folder works."""
        write_state(self.settings.data_dir, GatewayState(
            pid=os.getpid(), socket_path=self.ctx.socket_path,
            local_tcp_port=self.ctx.local_tcp_port, tcp_port=self.ctx.tcp_port))

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
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno in _FD_ERRORS:
                    log.error("accept failed (%s); retrying", os.strerror(exc.errno or 0))
                    await trio.sleep(_ACCEPT_RETRY)
                    continue
                raise
            if self.ctx.connection_count >= self.settings.config.api.max_connections:
                nursery.start_soon(self._refuse, stream)
            else:
                self.ctx.connection_count += 1
                nursery.start_soon(self._handle, stream, transport)

    async def _handle(self, stream: trio.SocketStream, transport: str) -> None:
        try:
            await ClientConnection(stream, self.ctx, transport=transport).run()
        finally:
            self.ctx.connection_count -= 1
            if self.ctx.draining and not self.ctx.connection_count:
                self._drained.set()

    async def _refuse(self, stream: trio.SocketStream) -> None:
        """Over api.max_connections: a fast 503 without reading the request, then close."""
        err = overloaded("too many connections (api.max_connections); try again shortly")
        body = err.body()
        head = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n")
        with trio.move_on_after(1):
            try:
                await stream.send_all(head + body)
                # Closing with unread request bytes would send a reset that can destroy the
                # 503 in flight: finish our side, then drain briefly before closing.
                await stream.send_eof()
                drained = 0
                while drained < _REFUSE_DRAIN and (data := await stream.receive_some(65536)):
                    drained += len(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
        stream.socket.close()


def serve(settings: Settings, extra_models: Sequence[ModelConfig] = ()) -> int:
    """Run the gateway until a stop signal; the process exit code."""
    try:
        gateway = Gateway(settings, extra_models=extra_models)
        trio.run(lambda: gateway.run(handle_signals=True))
    except (ListenerError, StartupError) as exc:
        log.error("%s", exc)
        return 2
    return 0
