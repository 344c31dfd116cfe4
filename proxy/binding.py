"""Every listener a gateway binds at start (SPEC §4), and the socket file it owns until it
stops: bound before the gateway touches anything else, so a second gateway on the same data
dir fails fast; where they listen written to state.json for the CLI. The checks and binds
themselves are :mod:`proxy.listeners`'; serving them is :mod:`proxy.server`'s."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import trio

from proxy.context import Listening
from proxy.datadir import STATE_FILE, GatewayState, ServerRecord, read_state, write_state
from proxy.link.listener import LOCAL_TCP, TCP, UNIX, Listener
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
from proxy.notifications import Notifications
from proxy.settings.store import Settings

log = logging.getLogger("sluice.server")

Bound = list[tuple[trio.SocketListener, Listener]]  # each socket with its listener's kind


class Binding:
    """The gateway's listeners, each with its kind (:mod:`proxy.link.listener`: ``UNIX``,
    ``LOCAL_TCP``, ``TCP``, the node listener), once :meth:`bind` has run, and where they
    listen (:attr:`listening`). ``node``: the node listener's kind when the gateway has an
    identity, so it may open SPEC §16's node listener."""

    def __init__(self, settings: Settings, notifications: Notifications, *,
                 external: bool, node: Listener | None = None) -> None:
        self.settings = settings
        self.notifications = notifications
        self.external = external
        self.node = node
        self.listeners: Bound = []
        self.listening = Listening()
        self.socket_path: Path | None = None  # ours until removed
        self.state_written = False  # state.json is ours to remove
        self._socket_id: tuple[int, int] | None = None  # (st_dev, st_ino) of our socket file
        # Model servers: those a previous gateway of this data dir recorded (it died without
        # stopping them), and ours, both as state.json says.
        self.left_behind: tuple[ServerRecord, ...] = ()
        self.model_servers: tuple[ServerRecord, ...] = ()

    def __repr__(self) -> str:
        return f"Binding({self.listening!r}, listeners={len(self.listeners)})"

    async def bind(self) -> None:
        """Bind every listener: the local socket in the first usable folder, else
        127.0.0.1 on ``local.fallback_port``; then the API server unless disabled, the node
        listener (with external access and an identity) and the Ollama API's port when set.
        Raises ListenerError (exit 2) with nothing left bound."""
        cfg = self.settings.config
        out: Bound = []
        api_hosts: list[str] = []
        socket_path: str | None = None
        local_tcp_port: int | None = None
        tcp_port: int | None = None
        node_port: int | None = None
        try:
            await refuse_if_running(self.settings.data_dir)
            previous = read_state(self.settings.data_dir)
            self.left_behind = () if previous is None else previous.model_servers
            choice = choose_socket_dir(cfg.local.socket_dir, self.settings.data_dir)
            await remove_stale_sockets(f for f in choice.candidates if f != choice.folder)
            if choice.folder is not None:
                path = choice.folder / SOCKET_NAME
                out.append((await open_unix_listener(path), UNIX))
                info = os.lstat(path)
                self.socket_path, self._socket_id = path, (info.st_dev, info.st_ino)
                socket_path = os.fspath(path)
            else:
                # Never a wildcard address, whatever allow_external_access says: this stands
                # in for the private socket, it does not publish anything.
                listener = await open_tcp_listener("127.0.0.1", cfg.local.fallback_port)
                out.append((listener, LOCAL_TCP))
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
                out.extend((listener, TCP) for listener in api)
                tcp_port = bound_port(api[0])
                api_hosts = [listener.socket.getsockname()[0] for listener in api]
                if external and not self.settings.keys.all:
                    self.notifications.raise_("external_access_without_keys", (
                        "external access is on but no access key exists: remote clients "
                        "will be refused until one is made (sluice keys create)"))
            if self.node is not None and self.external and cfg.api.node_port:
                node_port = await self._open_node_listeners(cfg.api.node_port, self.node,
                                                            out)
            ollama_port = await self._open_ollama_listener(cfg.ollama_api.port, out)
        except BaseException:
            for listener, _ in out:
                listener.socket.close()
            self.remove_socket()
            raise
        self.listeners = out
        self.listening = Listening(socket_path, local_tcp_port, tcp_port, self.external,
                                   node_port)
        where = [f"unix:{socket_path}"] if socket_path else []
        if local_tcp_port is not None:
            where.append(f"http://127.0.0.1:{local_tcp_port} (local fallback)")
        where.extend(f"http://{host if ':' not in host else f'[{host}]'}:{tcp_port}"
                     for host in api_hosts)
        if node_port is not None:
            where.append(f"TLS port {node_port} (links from other gateways)")
        if ollama_port is not None:
            where.append(f"http://127.0.0.1:{ollama_port} (the Ollama API)")
        log.info("sluice listening on %s", " and ".join(where))
        self._write_state()

    async def _open_node_listeners(self, port: int, node: Listener, out: Bound) -> int | None:
        """``api.node_port`` (SPEC §16), on the API server's addresses: the TLS listener
        for other gateways. A port in use is a notification, not a failure to start."""
        try:
            listeners = await open_api_listeners(port, external=True)
        except ListenerError as exc:
            self.notifications.raise_("node_port_unavailable", (
                f"the node listener is off: {exc}; other computers cannot link to this one "
                "until api.node_port is free (or set to another port) and sluice restarts"))
            return None
        out.extend((listener, node) for listener in listeners)
        return bound_port(listeners[0])

    async def _open_ollama_listener(self, port: int, out: Bound) -> int | None:
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
        out.append((listener, LOCAL_TCP))
        return bound_port(listener)

    def _write_state(self) -> None:
        """Where this gateway listens, for the CLI (``sluice status``) to find it: the
        socket path, or the fallback port when no socket folder works."""
        listening = self.listening
        write_state(self.settings.data_dir, GatewayState(
            pid=os.getpid(), socket_path=listening.socket_path,
            local_tcp_port=listening.local_tcp_port, tcp_port=listening.tcp_port,
            node_port=listening.node_port, model_servers=self.model_servers))
        self.state_written = True

    def record_servers(self, servers: tuple[ServerRecord, ...]) -> None:
        """The model servers this gateway runs now, into state.json (blocking: run in a
        worker thread, one write at a time: proxy/models/ledger.py)."""
        self.model_servers = servers
        if self.state_written:
            self._write_state()

    def remove_state(self) -> None:
        """Remove state.json if this gateway wrote it (not another's, when binding failed
        because that one runs)."""
        if self.state_written:
            (self.settings.data_dir / STATE_FILE).unlink(missing_ok=True)
            self.state_written = False

    def close(self) -> None:
        """Stop listening: every listener closed, our socket file removed."""
        for listener, _ in self.listeners:
            listener.socket.close()
        self.remove_socket()

    def remove_socket(self) -> None:
        """Remove our socket file, unless it is no longer ours (replaced meanwhile)."""
        path, self.socket_path = self.socket_path, None
        if path is None:
            return
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return
        if (info.st_dev, info.st_ino) == self._socket_id:
            path.unlink(missing_ok=True)
