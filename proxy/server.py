"""Starts everything in one nursery — backend health checks, listeners, connections — and
drains gracefully on SIGTERM/SIGINT: stop accepting, let running answers finish until the
drain deadline, then cancel them; remove the socket file."""

from __future__ import annotations

import errno
import importlib.util
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
from proxy.listeners import (
    SOCKET_NAME,
    ListenerError,
    bound_port,
    choose_socket_dir,
    open_tcp_listener,
    open_unix_listener,
)
from proxy.models.launcher import INSTALL_HINT
from proxy.models.supervisor import Supervisor
from proxy.pool.backends import BackendRegistry, run_health_checks
from proxy.settings import Settings
from proxy.upstream import UpstreamPool

log = logging.getLogger("sluice.server")

STATE_FILE = "state.json"  # where the running gateway listens (for the CLI)
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
        if self.models and importlib.util.find_spec("xllamacpp") is None:
            raise StartupError(INSTALL_HINT)
        self._stop = trio.Event()
        self._drained = trio.Event()
        self._socket_path: Path | None = None
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
        cfg = self.settings.config
        out: list[tuple[trio.SocketListener, str]] = []
        try:
            folder = choose_socket_dir(cfg.local.socket_dir, self.settings.data_dir)
            if folder is not None:
                path = folder / SOCKET_NAME
                out.append((await open_unix_listener(path), "unix"))
                self._socket_path = path
                self.ctx.socket_path = os.fspath(path)
            else:
                listener = await open_tcp_listener("127.0.0.1", cfg.local.fallback_port)
                out.append((listener, "local-tcp"))
                self.ctx.local_tcp_port = bound_port(listener)
                log.warning("no socket folder works: local listener on 127.0.0.1:%d",
                            self.ctx.local_tcp_port)
            if cfg.api.enabled:
                listener = await open_tcp_listener("127.0.0.1", cfg.api.port)
                self.ctx.tcp_port = bound_port(listener)
                out.append((listener, "tcp"))
        except BaseException:
            for listener, _ in out:
                listener.socket.close()
            self._remove_socket()
            raise
        where = [f"unix:{self.ctx.socket_path}"] if self.ctx.socket_path else []
        if self.ctx.tcp_port is not None:
            where.append(f"http://127.0.0.1:{self.ctx.tcp_port}")
        log.info("sluice listening on %s", " and ".join(where))
        self._write_state()
        return out

    def _write_state(self) -> None:
        """Where this gateway listens, for the CLI (``sluice status``) to find it."""
        state = {"pid": os.getpid(), "socketPath": self.ctx.socket_path,
                 "localTcpPort": self.ctx.local_tcp_port, "tcpPort": self.ctx.tcp_port}
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self._state_file)

    def _remove_socket(self) -> None:
        path, self._socket_path = self._socket_path, None
        if path is not None:
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
