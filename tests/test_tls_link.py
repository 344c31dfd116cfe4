"""The TLS of SPEC §16's links (proxy/link/tls.py, proxy/link/tlsio.py) on 127.0.0.1: a
server with the node listener's context and a client with a pinned link's, both through
TlsChannel. A pinned handshake; a wrong pin refused before any byte of a request (or our
certificate) is sent; an unknown certificate, a twin of a peer's, one a peer signed, TLS 1.2
and plain HTTP refused at the handshake; no certificate let through; the pool's pinned
connections reused (one handshake for many requests) and never shared with a plain link."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
import trio

from protocol.lan.pinning import fingerprint_of
from protocol.upstream_url import UpstreamAddress, parse_upstream_url
from proxy.link.identity import Identity
from proxy.link.tls import HandshakeRefused, PinMismatch, open_for_pairing
from proxy.link.tlsio import TlsChannel
from proxy.link.wire import Wire
from proxy.upstream.connection import UpstreamFailure
from proxy.upstream.pool import ConnectionPool, whole_exchange
from tests.tls_certs import (
    client_context,
    identities,
    open_pinned,
    plain_http_to,
    server_context,
    signed_by,
    twin_of,
)
from tests.waits import settled

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


@attrs.define
class Seen:
    """What the server saw of one connection."""

    done: trio.Event = attrs.field(factory=trio.Event)
    handshake: bool = False
    peer: bytes | None = None
    version: str | None = None
    received: bytes = b""
    error: BaseException | None = None


class TlsServer:
    """A TLS server on 127.0.0.1 that answers every request head with ANSWER (keep-alive)."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context
        self.port = 0
        self.seen: list[Seen] = []
        self.answers: int | None = None  # answers per connection before it closes

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listener.socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, [listener])

    async def _handle(self, stream: trio.SocketStream) -> None:
        seen = Seen()
        self.seen.append(seen)
        channel = TlsChannel(stream.socket, self.context, server_side=True)
        try:
            await channel.handshake()
            seen.handshake = True
            seen.peer = channel.peer_certificate()
            seen.version = channel.version()
            buffer = b""
            while data := await channel.recv(65536):
                seen.received += data
                buffer += data
                while b"\r\n\r\n" in buffer:
                    buffer = buffer.partition(b"\r\n\r\n")[2]
                    await channel.send_all(ANSWER)
                    if self.answers is not None and seen.received.count(b"\r\n\r\n") >= \
                            self.answers:
                        return
        except OSError as exc:  # ssl.SSLError included
            seen.error = exc
        finally:
            channel.close()
            seen.done.set()

    async def outcome(self, index: int = -1) -> Seen:
        await settled(lambda: bool(self.seen), "a connection at the server")
        seen = self.seen[index]
        await seen.done.wait()
        return seen


@attrs.frozen
class Nodes:
    server: Identity  # the listener's (B)
    peer: Identity  # a paired peer (A)
    stranger: Identity


@pytest.fixture
def nodes(tmp_path: Path) -> Nodes:
    return Nodes(*identities(tmp_path, "b", "a", "x"))


@pytest.fixture
async def server(nursery: trio.Nursery, nodes: Nodes) -> AsyncIterator[TlsServer]:
    with trio.fail_after(20):
        tls = TlsServer(server_context(nodes.server, [nodes.peer.der]))
        await nursery.start(tls.serve)
        yield tls


async def ask(channel: Wire) -> bytes:
    await channel.send_all(b"GET / HTTP/1.1\r\nhost: b\r\n\r\n")
    got = b""
    while not got.endswith(b"ok"):
        data = await channel.recv(65536)
        assert data
        got += data
    return got


async def test_a_pinned_handshake(server: TlsServer, nodes: Nodes) -> None:
    channel = await open_pinned("127.0.0.1", server.port, nodes.server.fingerprint,
                                client_context(nodes.peer), 10)
    assert channel.version() == "TLSv1.3"
    assert await ask(channel) == ANSWER
    channel.close()
    seen = await server.outcome()
    assert seen.handshake
    assert seen.version == "TLSv1.3"
    assert seen.peer is not None
    assert fingerprint_of(seen.peer) == nodes.peer.fingerprint
    assert seen.error is None  # our close_notify: a clean end


async def test_a_wrong_pin_sends_nothing(server: TlsServer, nodes: Nodes) -> None:
    with pytest.raises(PinMismatch) as caught:
        await open_pinned("127.0.0.1", server.port, nodes.stranger.fingerprint,
                          client_context(nodes.peer), 10)
    assert caught.value.expected == nodes.stranger.fingerprint
    assert caught.value.got == nodes.server.fingerprint
    assert caught.value.connect
    assert nodes.server.fingerprint in str(caught.value)
    seen = await server.outcome()
    assert not seen.handshake  # our certificate and Finished were never sent
    assert seen.received == b""
    assert isinstance(seen.error, ssl.SSLError)


async def test_an_uppercase_pin_matches(server: TlsServer, nodes: Nodes) -> None:
    channel = await open_pinned("127.0.0.1", server.port, nodes.server.fingerprint.upper(),
                                client_context(nodes.peer), 10)
    channel.close()


@pytest.mark.parametrize("make", ["stranger", "twin", "signed by the peer"])
async def test_a_certificate_not_paired_is_refused_at_the_handshake(
        server: TlsServer, nodes: Nodes, tmp_path: Path, make: str) -> None:
    client = (nodes.stranger if make == "stranger" else
              twin_of(nodes.peer, tmp_path / "twin") if make == "twin" else
              signed_by(nodes.peer, tmp_path / "child"))
    assert client.fingerprint != nodes.peer.fingerprint
    with pytest.raises(HandshakeRefused) as caught:
        await open_pinned("127.0.0.1", server.port, nodes.server.fingerprint,
                          client_context(client), 10)
    assert caught.value.connect
    assert caught.value.reason  # OpenSSL's alert, e.g. TLSV1_ALERT_UNKNOWN_CA
    seen = await server.outcome()
    assert not seen.handshake
    assert isinstance(seen.error, ssl.SSLCertVerificationError)
    assert seen.received == b""


async def test_no_client_certificate_is_let_through(server: TlsServer, nodes: Nodes) -> None:
    conn, pin = await open_for_pairing(parse_upstream_url(f"http://127.0.0.1:{server.port}"),
                                       10)
    assert pin == nodes.server.fingerprint
    assert await ask(conn.wire) == ANSWER
    conn.close()
    seen = await server.outcome()
    assert seen.handshake
    assert seen.peer is None


async def test_tls12_is_refused(server: TlsServer, nodes: Nodes) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(nodes.peer.cert_path, nodes.peer.key_path)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    channel = TlsChannel(stream.socket, context, server_side=False)
    with pytest.raises(ssl.SSLError):
        await channel.handshake()
    channel.close()
    seen = await server.outcome()
    assert not seen.handshake
    assert "UNSUPPORTED_PROTOCOL" in str(seen.error)


async def test_plain_http_is_refused(server: TlsServer) -> None:
    assert b"HTTP" not in await plain_http_to(server.port)  # an alert at most, then the close
    seen = await server.outcome()
    assert not seen.handshake
    assert isinstance(seen.error, ssl.SSLError)


async def test_a_server_without_tls_is_a_refused_handshake(nursery: trio.Nursery,
                                                           nodes: Nodes) -> None:
    async def plain(stream: trio.SocketStream) -> None:
        await stream.receive_some(4096)
        await stream.send_all(ANSWER)
        await stream.aclose()

    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    nursery.start_soon(trio.serve_listeners, plain, [listener])
    with pytest.raises(HandshakeRefused):
        await open_pinned("127.0.0.1", listener.socket.getsockname()[1],
                          nodes.server.fingerprint, client_context(nodes.peer), 10)


# ------------------------------------------------------------------------ the pool


def pinned(server: TlsServer, pin: str) -> UpstreamAddress:
    return parse_upstream_url(f"http://127.0.0.1:{server.port}").pinned(pin)


async def get(pool: ConnectionPool, address: UpstreamAddress) -> bytes:
    head, body = await whole_exchange(pool, address, b"GET", b"/x",
                                      [(b"host", address.authority)], b"", cap=1024)
    assert head.status_code == 200
    return body


async def test_the_pool_reuses_one_tls_connection(server: TlsServer, nodes: Nodes) -> None:
    pool = ConnectionPool(tls=client_context(nodes.peer))
    address = pinned(server, nodes.server.fingerprint)
    for _ in range(20):
        assert await get(pool, address) == b"ok"
    assert (pool.connects, pool.handshakes) == (1, 1)
    assert len(server.seen) == 1
    pool.close()


async def test_more_session_tickets_do_not_spoil_an_idle_connection(
        nursery: trio.Nursery, nodes: Nodes) -> None:
    context = server_context(nodes.server, [nodes.peer.der])
    context.num_tickets = 3  # the two after the first arrive while the connection idles
    server = TlsServer(context)
    await nursery.start(server.serve)
    pool = ConnectionPool(tls=client_context(nodes.peer))
    address = pinned(server, nodes.server.fingerprint)
    for _ in range(3):
        assert await get(pool, address) == b"ok"
    assert pool.handshakes == 1
    pool.close()


async def test_a_pinned_and_a_plain_link_never_share(server: TlsServer, nodes: Nodes) -> None:
    pool = ConnectionPool(tls=client_context(nodes.peer))
    tls = pinned(server, nodes.server.fingerprint)
    plain = parse_upstream_url(f"http://127.0.0.1:{server.port}")
    assert tls.key != plain.key
    assert tls.authority == plain.authority
    assert await get(pool, tls) == b"ok"
    with pytest.raises(UpstreamFailure):  # plain HTTP to the TLS port: not the TLS connection
        await get(pool, plain)
    assert await get(pool, tls) == b"ok"
    assert (pool.connects, pool.handshakes) == (2, 1)
    pool.close()


async def test_the_pool_refuses_a_wrong_pin(server: TlsServer, nodes: Nodes) -> None:
    pool = ConnectionPool(tls=client_context(nodes.peer))
    with pytest.raises(PinMismatch) as caught:
        await get(pool, pinned(server, nodes.stranger.fingerprint))
    assert caught.value.connection_error
    assert pool.handshakes == 0
    seen = await server.outcome()
    assert seen.received == b""


async def test_a_pool_without_an_identity_cannot_pin(server: TlsServer, nodes: Nodes) -> None:
    with pytest.raises(UpstreamFailure, match="no identity"):
        await get(ConnectionPool(), pinned(server, nodes.server.fingerprint))
    assert not server.seen


async def test_an_idle_connection_the_server_closed_is_replaced(
        server: TlsServer, nodes: Nodes) -> None:
    server.answers = 1  # then it closes (close_notify, then the socket)
    pool = ConnectionPool(tls=client_context(nodes.peer))
    address = pinned(server, nodes.server.fingerprint)
    assert await get(pool, address) == b"ok"
    await server.outcome(0)  # closed: the idle check sees it
    assert await get(pool, address) == b"ok"
    assert (pool.connects, pool.handshakes) == (2, 2)
    pool.close()


async def test_closing_twice_touches_nothing(server: TlsServer, nodes: Nodes) -> None:
    """close() is idempotent: after it the descriptor number may be another socket's."""
    channel = await open_pinned("127.0.0.1", server.port, nodes.server.fingerprint,
                                client_context(nodes.peer), 10)
    assert channel.looks_alive()
    channel.close()
    other = trio.socket.socket()  # likely takes the same descriptor number
    try:
        channel.close()
        assert not channel.looks_alive()
        assert channel.closed
    finally:
        other.close()
    assert (await server.outcome()).error is None


async def test_a_pairing_link_carries_http(server: TlsServer, nodes: Nodes) -> None:
    address = parse_upstream_url(f"http://127.0.0.1:{server.port}")
    conn, pin = await open_for_pairing(address, 10)
    for _ in range(2):  # the exchange's two round trips, on one connection
        await conn.send_request(b"POST", b"/api/v1/pairing/exchange",
                                [(b"host", address.authority), (b"content-length", b"2")], b"{}")
        head = await conn.receive_head()
        assert head.status_code == 200
        assert await conn.receive_body(1024) == b"ok"
        conn.recycle()
    conn.close()
    seen = await server.outcome()
    assert seen.peer is None
    assert pin == nodes.server.fingerprint


async def test_several_peers_each_pass_under_its_own_certificate(
        nursery: trio.Nursery, nodes: Nodes, tmp_path: Path) -> None:
    """Every gateway's certificate is CN=sluice: the key ids tell the anchors apart."""
    peers = [nodes.peer, *identities(tmp_path / "more", "p1", "p2", "p3")]
    server = TlsServer(server_context(nodes.server, [p.der for p in peers]))
    await nursery.start(server.serve)
    for n, peer in enumerate(peers):
        channel = await open_pinned("127.0.0.1", server.port, nodes.server.fingerprint,
                                    client_context(peer), 10)
        channel.close()
        seen = await server.outcome(n)
        assert seen.peer is not None
        assert fingerprint_of(seen.peer) == peer.fingerprint
    with pytest.raises(HandshakeRefused):
        await open_pinned("127.0.0.1", server.port, nodes.server.fingerprint,
                          client_context(nodes.stranger), 10)
