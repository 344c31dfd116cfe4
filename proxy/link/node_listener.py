"""The node listener's TLS (SPEC §16): each connection accepted on ``api.node_port`` is
served only after a TLS 1.3 server handshake that trusts exactly the paired peers'
certificates (:func:`proxy.link.tls.tls_context`, rebuilt when :class:`NodePeers`
changes: new handshakes use the new set). A failed handshake (plain HTTP, TLS 1.2, an unknown
certificate, nothing within ``timeouts.connection``) just closes, logged at DEBUG. Then the
connection is served by the same connection and exchange code as the API port, through its
:class:`~proxy.link.tlsio.TlsChannel` (its :class:`~proxy.link.wire.Wire`); its client's
certificate pin (None without one) decides what it may ask (the node column of
:func:`protocol.access.authorize`). A peer removed from the set has its open connections
closed. It is the wire maker of the node :class:`~proxy.link.listener.Listener`.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable

import trio

from protocol.lan.pinning import fingerprint_of
from proxy.lan.node_peers import NodePeers
from proxy.link.identity import Identity
from proxy.link.tls import End, tls_context
from proxy.link.tlsio import TlsChannel
from proxy.link.wire import Wire

__all__ = ["NodeListener", "Serve"]

log = logging.getLogger("sluice.node")

# Serves one connection once its wire is made: (the wire, the client's certificate pin or None).
Serve = Callable[[Wire, "str | None"], Awaitable[None]]


class NodeListener:
    """The TLS side of the node listener (see the module); ``handshakes`` counts the ones
    that succeeded, ``refused`` the others."""

    def __init__(self, identity: Identity, peers: NodePeers,
                 handshake_timeout: Callable[[], float]) -> None:
        self.identity = identity
        self.peers = peers
        self._timeout = handshake_timeout
        self._context: ssl.SSLContext | None = None
        self._context_version = -1
        self._open: dict[str, set[trio.CancelScope]] = {}  # a paired peer's connections
        self.handshakes = 0
        self.refused = 0
        peers.subscribe(self._peers_changed)

    def __repr__(self) -> str:
        open_ = sum(len(scopes) for scopes in self._open.values())
        return (f"NodeListener({self.peers!r}, open={open_}, handshakes={self.handshakes}, "
                f"refused={self.refused})")

    def context(self) -> ssl.SSLContext:
        """The server context for the peers as they are now (made again after a change)."""
        if self._context is None or self._context_version != self.peers.version:
            self._context = tls_context(End.SERVER, self.identity,
                                        self.peers.certificates())
            self._context_version = self.peers.version
        return self._context

    def _peers_changed(self, removed: frozenset[str]) -> None:
        for pin in removed:
            for scope in self._open.pop(pin, ()):
                scope.cancel()

    def open_connections(self, pin: str) -> int:
        return len(self._open.get(pin, ()))

    async def open(self, sock: trio.socket.SocketType, address: str, serve: Serve) -> None:
        """Handshake, then ``serve`` the connection (until it ends, or its peer is
        removed); closes it either way."""
        channel = TlsChannel(sock, self.context(), server_side=True)
        try:
            good, pin = await self._handshake(channel, address)
            if not good:
                return
            scope = trio.CancelScope()
            if pin is not None:
                self._open.setdefault(pin, set()).add(scope)
            try:
                with scope:
                    await serve(channel, pin)
            finally:
                if pin is not None:
                    scopes = self._open.get(pin)
                    if scopes is not None:
                        scopes.discard(scope)
                        if not scopes:
                            del self._open[pin]
        finally:
            channel.close()

    async def turn_away(self, stream: trio.SocketStream) -> None:
        """Over ``api.max_connections``: its client speaks TLS first, so closed at once."""
        stream.socket.close()
        await trio.lowlevel.checkpoint()

    async def _handshake(self, channel: TlsChannel, address: str) -> tuple[bool, str | None]:
        """Whether the handshake went well, and the client's pin (None: no
        certificate)."""
        with trio.move_on_after(self._timeout()) as waited:
            try:
                await channel.handshake()
            except OSError as exc:  # ssl.SSLError included: not TLS 1.3, unknown cert
                self.refused += 1
                reason = exc.reason if isinstance(exc, ssl.SSLError) else exc
                log.debug("node listener: handshake with %s failed: %s", address, reason)
                return False, None
        if waited.cancelled_caught:
            self.refused += 1
            log.debug("node listener: no handshake from %s in time", address)
            return False, None
        der = channel.peer_certificate()
        pin = None if der is None else fingerprint_of(der)
        if pin is not None and self.peers.key_id_for(pin) is None:
            # Verified against a set that changed during the handshake: not a peer now.
            self.refused += 1
            log.debug("node listener: %s is no paired peer (any more)", address)
            return False, None
        self.handshakes += 1
        return True, pin
