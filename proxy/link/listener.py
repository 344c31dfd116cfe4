"""The listeners' kinds, one :class:`Listener` value each: the Unix socket (:data:`UNIX`),
the loopback-only TCP listeners (:data:`LOCAL_TCP`: the local fallback, the Ollama API's
port), the TCP API listener (:data:`TCP`) and SPEC §16's node listener (:func:`node`).
Each carries what differs between them, so nothing downstream asks which one it has:

- its wire (:class:`Wires`): the socket's own (:data:`PLAIN`), or TLS after the node
  listener's handshake (:class:`~proxy.link.node_listener.NodeListener`);
- whether its peers count as remote (:class:`Peers`), and who it lets in at all;
- how it turns a client away over ``api.max_connections`` (a fast 503, or a plain close
  for a client that speaks TLS first);
- its column of the access table (:class:`protocol.access.Column`) and whether the
  Host/Origin guard applies (TCP);
- its names: in logs, and the ``transport`` of the metrics and the request log.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

import attrs
import trio

from protocol.access import Column
from protocol.errors import overloaded
from proxy.downstream import Downstream
from proxy.errors import ClientGone
from proxy.link import peer_checks
from proxy.link.sockio import PlainWire
from proxy.link.wire import Wire

if TYPE_CHECKING:
    from proxy.link.node_listener import NodeListener

__all__ = ["LOCAL_TCP", "PLAIN", "TCP", "UNIX", "Listener", "Peer", "Peers", "Wires", "node"]

TURNED_AWAY_DRAIN = 64 * 1024  # request bytes read (and dropped) from a turned-away connection
TURN_AWAY_TIME = 1.0  # seconds a turned-away connection gets for its 503, then it is closed

# Serves one connection once its wire is made: (the wire, the client's certificate pin or None).
OnWire = Callable[[Wire, "str | None"], Awaitable[None]]


class Wires(Protocol):
    """How a listener makes an accepted connection's wire, and turns one away."""

    async def open(self, sock: trio.socket.SocketType, address: str, serve: OnWire) -> None:
        """Make the wire (a handshake, for TLS), ``serve`` it, close it."""

    async def turn_away(self, stream: trio.SocketStream) -> None:
        """Over ``api.max_connections``: refuse the connection quickly, then close it."""


class _Plain:
    """The socket's own wire (:class:`~proxy.link.sockio.PlainWire`)."""

    def __repr__(self) -> str:
        return "PLAIN"

    async def open(self, sock: trio.socket.SocketType, address: str, serve: OnWire) -> None:
        wire = PlainWire(sock)
        try:
            await serve(wire, None)
        finally:
            wire.close()

    async def turn_away(self, stream: trio.SocketStream) -> None:
        """A fast 503 without reading the request, then close."""
        out = Downstream(PlainWire(stream.socket), lambda: True)  # the answer ends it
        with trio.move_on_after(TURN_AWAY_TIME):
            try:
                await out.send_error(overloaded(
                    "too many connections (api.max_connections); try again shortly"))
                # Closing with unread request bytes would send a reset that can destroy the
                # 503 in flight: finish our side, then drain briefly before closing.
                await stream.send_eof()
                drained = 0
                while drained < TURNED_AWAY_DRAIN and (data := await stream.receive_some(65536)):
                    drained += len(data)
            except (ClientGone, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
        stream.socket.close()


PLAIN: Wires = _Plain()


class Peers(enum.Enum):
    """Who a listener's peers are."""

    OWNER = "owner"  # a Unix socket: this machine; the peer's uid must be ours or root
    LOOPBACK = "loopback"  # bound to 127.0.0.1 only: this machine
    BY_ADDRESS = "by address"  # the API listener: remote unless its address is loopback
    REMOTE = "remote"  # the node listener: every peer counts as remote


@attrs.frozen
class Listener:
    """One kind of listener (see the module)."""

    name: str  # in logs: "unix", "local-tcp", "tcp", "node"
    transport: str  # the metrics' and the request log's: "unix" or "tcp"
    column: Column  # its column of the access table
    peers: Peers
    host_guard: bool  # the Host/Origin guard applies (every TCP listener)
    wires: Wires = attrs.field(default=PLAIN, eq=False)

    def __repr__(self) -> str:
        return f"Listener({self.name})"

    def peer(self, sock: trio.socket.SocketType) -> Peer | None:
        """Who the client of an accepted socket is; None: not let in (a Unix-socket peer of
        another user), or already gone."""
        try:
            if self.peers is Peers.OWNER:
                return Peer(self) if peer_checks.unix_peer_allowed(sock) else None
            if self.peers is Peers.LOOPBACK:
                return Peer(self)
            host = str(sock.getpeername()[0])
        except OSError:  # the peer is already gone
            return None
        if self.peers is Peers.REMOTE:
            return Peer(self, loopback=False, address=host)
        return Peer(self, peer_checks.peer_is_loopback(host), host)

    async def serve(self, stream: trio.SocketStream,
                    connection: Callable[[Wire, Peer], Awaitable[None]]) -> None:
        """Serve an accepted connection: its peer let in, its wire made, then
        ``connection(wire, peer)``; closed in the end."""
        sock = stream.socket
        peer = self.peer(sock)
        if peer is None:
            sock.close()
            return

        async def serve(wire: Wire, certificate: str | None) -> None:
            await connection(wire, peer if certificate is None
                             else attrs.evolve(peer, certificate=certificate))

        await self.wires.open(sock, peer.address, serve)

    async def turn_away(self, stream: trio.SocketStream) -> None:
        """Over ``api.max_connections`` (see :meth:`Wires.turn_away`)."""
        await self.wires.turn_away(stream)


@attrs.frozen
class Peer:
    """Who is asking: the listener it came on and, over TCP, whether the peer is this
    machine."""

    listener: Listener
    loopback: bool = True
    address: str = ""  # the TCP API or node listener's peer IP ("" elsewhere: one local peer)
    certificate: str | None = None  # the node listener's client certificate's pin, if any


UNIX = Listener("unix", "unix", Column.LOCAL, Peers.OWNER, host_guard=False)
LOCAL_TCP = Listener("local-tcp", "tcp", Column.LOCAL, Peers.LOOPBACK, host_guard=True)
TCP = Listener("tcp", "tcp", Column.API, Peers.BY_ADDRESS, host_guard=True)


def node(tls: NodeListener) -> Listener:
    """SPEC §16's node listener: TLS 1.3 first (``tls`` makes the wire), every peer remote
    and known by its certificate."""
    return Listener("node", "tcp", Column.NODE, Peers.REMOTE, host_guard=True, wires=tls)
