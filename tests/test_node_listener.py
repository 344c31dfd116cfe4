"""The node listener (SPEC §16) of a gateway in this test's trio loop, with external access
bound to loopback only (the ``loopback_only`` seam), ``api.node_port`` a free port, an
identity and its paired peers: a paired certificate with its bound key is served as on the
API port (the model list, a streamed chat byte for byte as over the Unix socket); another
key or none is 401; a client without a certificate reaches only the pairing exchange; an
unknown certificate, TLS 1.2 and plain HTTP are refused at the handshake (logged at DEBUG,
no traceback); a peer removed loses its open connections and its next handshake; state.json
names the port."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
import trio

from protocol.access import Column
from protocol.http1 import ResponseHead
from protocol.upstream_url import UpstreamAddress, parse_upstream_url
from proxy import binding
from proxy.datadir import STATE_FILE
from proxy.lan.node_peers import NodePeers
from proxy.link.identity import Identity
from proxy.link.tls import HandshakeRefused
from proxy.server import Gateway
from proxy.upstream.pool import ConnectionPool, exchange
from tests.client import CHAT, chat_body, request
from tests.conftest import free_port, gateway_config, open_settings
from tests.fakeupstream import FakeUpstream, sse_events, sse_stream
from tests.tls_certs import client_context, identities, open_pinned, plain_http_to
from tests.waits import settled


@pytest.fixture
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """External access binds 127.0.0.1 only: no test listens on this machine's LAN."""
    real = binding.open_api_listeners

    async def loopback(port: int, *, external: bool) -> list[trio.SocketListener]:
        return await real(port, external=False)

    monkeypatch.setattr(binding, "open_api_listeners", loopback)


@attrs.define
class Node:
    gateway: Gateway
    own: Identity  # the gateway's (B)
    peer: Identity  # a paired gateway's (A)
    stranger: Identity
    peers: NodePeers
    key: str  # the access key bound to the peer's certificate
    other_key: str  # another access key of this gateway

    @property
    def port(self) -> int:
        port = self.gateway.ctx.node_port
        assert port is not None
        return port

    def address(self) -> UpstreamAddress:
        return parse_upstream_url(f"http://127.0.0.1:{self.port}").pinned(self.own.fingerprint)

    def pool(self, who: Identity | None) -> ConnectionPool:
        return ConnectionPool(tls=client_context(who))


@pytest.fixture
async def node(nursery: trio.Nursery, short_tmp: Path, upstream: FakeUpstream,
               loopback_only: None) -> AsyncIterator[Node]:
    with trio.fail_after(30):
        own, peer, stranger = identities(short_tmp / "ids", "b", "a", "x")
        cfg = gateway_config([("fake", upstream.url)], socket_dir=short_tmp / "s",
                             allow_external_access=True, node_port=free_port())
        settings = open_settings(short_tmp / "data", cfg)
        record, key = await settings.keys.add("a")
        _, other_key = await settings.keys.add("phone")
        peers = NodePeers({peer.fingerprint: (peer.der, record.id)})
        gateway = Gateway(settings, drain_timeout=1, identity=own, node_peers=peers)
        await nursery.start(gateway.run)
        await gateway.backends.ready.wait()
        yield Node(gateway, own, peer, stranger, peers, key, other_key)


def bearer(key: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", b"Bearer " + key.encode())]


async def ask(pool: ConnectionPool, address: UpstreamAddress, method: bytes, path: str,
              headers: list[tuple[bytes, bytes]], body: bytes = b""
              ) -> tuple[ResponseHead, bytes]:
    """One request over the pool; the head and the whole body (dechunked)."""
    head_lines = [(b"host", address.authority), *headers]
    if body:
        head_lines += [(b"content-type", b"application/json"),
                       (b"content-length", str(len(body)).encode())]
    conn, head = await exchange(pool, address, method, path.encode(), head_lines, body)
    parts = []
    while (part := await conn.receive_payload()) is not None:
        parts.append(part)
    pool.release(conn)
    return head, b"".join(parts)


def code_of(body: bytes) -> str:
    error = json.loads(body)["error"]
    assert set(error) >= {"code", "message", "type"}
    return str(error["code"])


async def test_a_paired_peer_with_its_key_is_served(node: Node, upstream: FakeUpstream) -> None:
    pool = node.pool(node.peer)
    head, body = await ask(pool, node.address(), b"GET", "/v1/models", bearer(node.key))
    assert head.status_code == 200, body
    assert [m["id"] for m in json.loads(body)["data"]] == ["fake-model"]
    upstream.on("POST", CHAT, sse_stream(sse_events(6)))
    head, streamed = await ask(pool, node.address(), b"POST", CHAT, bearer(node.key),
                               chat_body(stream=True))
    assert head.status_code == 200
    assert head.chunked
    assert streamed == b"".join(sse_events(6))  # byte for byte what the model server sent
    local = await request(f"unix:{node.gateway.ctx.socket_path}", "POST", CHAT,
                          chat_body(stream=True))
    assert local.body == streamed  # as over the Unix socket
    assert (pool.connects, pool.handshakes) == (1, 1)  # one connection for all of it
    assert node.gateway.node_listener is not None
    assert node.gateway.node_listener.handshakes == 1
    pool.close()


@pytest.mark.parametrize("credential", ["another key", "none", "the admin token", "junk"])
async def test_a_paired_peer_without_its_key_is_401(node: Node, credential: str) -> None:
    headers = {"another key": bearer(node.other_key), "none": [],
               "the admin token": bearer(node.gateway.settings.secrets.admin_token),
               "junk": bearer("sk-sluice-nothing")}[credential]
    pool = node.pool(node.peer)
    head, body = await ask(pool, node.address(), b"GET", "/v1/models", headers)
    assert head.status_code == 401
    assert code_of(body) in {"missing_api_key", "invalid_api_key"}
    pool.close()


async def test_open_paths_need_no_key(node: Node) -> None:
    pool = node.pool(node.peer)
    head, _ = await ask(pool, node.address(), b"GET", "/health", [])
    assert head.status_code == 200
    pool.close()


async def test_without_a_certificate_only_the_pairing_exchange(node: Node) -> None:
    pool = node.pool(None)
    for method, path, headers in [(b"GET", "/v1/models", bearer(node.key)),
                                  (b"GET", "/health", []),
                                  (b"POST", "/api/v1/pairing/claim", []),
                                  (b"GET", "/api/v1/pairing/exchange", [])]:
        head, body = await ask(pool, node.address(), method, path, headers)
        assert head.status_code == 401, (method, path)
        assert code_of(body) == "unpaired_certificate"
    head, body = await ask(pool, node.address(), b"POST", "/api/v1/pairing/exchange", [],
                           b'{"step": 1}')
    assert head.status_code not in (401, 403), body  # past the access check (404: no route yet)
    assert pool.handshakes == 1
    pool.close()


async def test_the_host_guard_applies(node: Node) -> None:
    pool = node.pool(node.peer)
    address = node.address()
    conn, head = await exchange(pool, address, b"GET", b"/v1/models",
                                [(b"host", b"evil.example:80"), *bearer(node.key)], b"")
    await conn.receive_body(65536)
    conn.close()
    assert head.status_code == 403
    pool.close()


async def test_an_unknown_certificate_is_refused_at_the_handshake(
        node: Node, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, "sluice")
    with pytest.raises(HandshakeRefused):
        await ask(node.pool(node.stranger), node.address(), b"GET", "/health", [])
    listener = node.gateway.node_listener
    assert listener is not None
    await settled(lambda: listener.refused >= 1, "the refusal at the server")  # logged
    assert any(r.levelno == logging.DEBUG and "handshake" in r.getMessage()
               for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


async def test_plain_http_on_the_node_port_is_closed(node: Node,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    assert b"HTTP" not in await plain_http_to(node.port)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


async def test_a_removed_peer_is_cut_off(node: Node) -> None:
    pool = node.pool(node.peer)
    head, _ = await ask(pool, node.address(), b"GET", "/v1/models", bearer(node.key))
    assert head.status_code == 200
    held = await open_pinned("127.0.0.1", node.port, node.own.fingerprint,
                             client_context(node.peer), 10)
    listener = node.gateway.node_listener
    assert listener is not None
    await settled(lambda: listener.open_connections(node.peer.fingerprint) >= 2,
                  "both connections at the listener")
    node.peers.set({})
    assert listener.open_connections(node.peer.fingerprint) == 0
    assert await held.recv(4096) == b""  # closed by the gateway, with a close_notify
    held.close()
    with pytest.raises(HandshakeRefused):  # the pooled connection is gone; a new one refused
        await ask(pool, node.address(), b"GET", "/v1/models", bearer(node.key))
    pool.close()


async def test_state_names_the_node_port(node: Node) -> None:
    state = json.loads((node.gateway.settings.data_dir / STATE_FILE).read_text())
    assert state["nodePort"] == node.port
    assert state["tcpPort"] != node.port


async def test_no_node_listener_without_external_access_an_identity_or_a_port(
        nursery: trio.Nursery, short_tmp: Path, loopback_only: None) -> None:
    own, = identities(short_tmp / "ids", "b")
    cases = [(False, own, free_port()), (True, None, free_port()), (True, own, 0)]
    for n, (external, identity, port) in enumerate(cases):
        cfg = gateway_config(socket_dir=short_tmp / f"s{n}", allow_external_access=external,
                             node_port=port)
        gateway = Gateway(open_settings(short_tmp / f"d{n}", cfg), identity=identity)
        await nursery.start(gateway.run)
        assert gateway.ctx.node_port is None
        state = json.loads((short_tmp / f"d{n}" / STATE_FILE).read_text())
        assert state["nodePort"] is None
        assert all(kind.column is not Column.NODE for _, kind in gateway.binding.listeners)


async def test_an_error_body_has_the_client_api_shape(node: Node) -> None:
    pool = node.pool(None)
    head, body = await ask(pool, node.address(), b"POST", "/v1/messages", [],
                           b'{"model": "fake-model"}')
    assert head.status_code == 401
    doc = json.loads(body)
    assert doc["type"] == "error"  # Anthropic's shape for /v1/messages
    assert doc["error"]["type"] == "authentication_error" or doc["error"]["type"]
    assert "pairing/exchange" in doc["error"]["message"]
    pool.close()


async def test_a_client_that_never_shakes_hands_is_closed(node: Node) -> None:
    settings = node.gateway.settings
    timeouts = attrs.evolve(settings.config.timeouts, connection=0.2)
    settings.config = attrs.evolve(settings.config, timeouts=timeouts)  # read per connection
    stream = await trio.open_tcp_stream("127.0.0.1", node.port)
    with trio.fail_after(10):
        assert await stream.receive_some(4096) == b""  # closed after timeouts.connection
    await stream.aclose()
    listener = node.gateway.node_listener
    assert listener is not None
    assert listener.refused == 1


LARGE_BODY = 30 << 20  # what a stranger sent in issue 39; under api.max_body_size (32 MiB)
PIECE = 64 * 1024


def _whole(answer: bytes) -> bool:
    """A whole answer with a Content-Length has arrived."""
    head, found, body = answer.partition(b"\r\n\r\n")
    for line in head.lower().split(b"\r\n"):
        if found and line.startswith(b"content-length:"):
            return len(body) >= int(line.partition(b":")[2])
    return False


async def _stranger_posts(node: Node, framing: str) -> tuple[bytes, int, bool]:
    """A client without a certificate POSTs a LARGE_BODY pairing exchange, sending the body
    in pieces while it reads the answer: (the answer up to the end of the connection, the
    body bytes sent when its head had come, whether the connection ended after it)."""
    context = client_context(None)
    tcp = await trio.open_tcp_stream("127.0.0.1", node.port)
    stream = trio.SSLStream(tcp, context, server_hostname=None)
    await stream.do_handshake()
    framed = (b"content-length: " + str(LARGE_BODY).encode() if framing == "length"
              else b"transfer-encoding: chunked")
    await stream.send_all(b"POST /api/v1/pairing/exchange HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                          b"content-type: application/json\r\n" + framed + b"\r\n\r\n")
    sent = 0
    piece = b" " * PIECE
    if framing == "chunked":
        piece = f"{PIECE:x}\r\n".encode() + piece + b"\r\n"

    async def send_body() -> None:
        nonlocal sent
        try:
            while sent < LARGE_BODY:  # bounded: at most LARGE_BODY bytes
                await stream.send_all(piece)
                sent += PIECE
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the gateway closed the connection: what is expected

    answer = b""
    sent_at_answer = -1
    ended = False
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_body)
            try:
                while not _whole(answer) and (data := await stream.receive_some(65536)):
                    answer += data
                    if sent_at_answer < 0 and b"\r\n\r\n" in answer:
                        sent_at_answer = sent
                with trio.move_on_after(5):  # then the end of the connection
                    ended = not await stream.receive_some(65536)
            except trio.BrokenResourceError:  # a reset after the answer: closed too
                ended = True
            nursery.cancel_scope.cancel()
    await trio.aclose_forcefully(stream)
    return answer, sent_at_answer, ended


@pytest.mark.parametrize("framing", ["length", "chunked"])
async def test_a_strangers_large_exchange_is_refused_unread(node: Node, framing: str) -> None:
    """Issue 39: the pairing exchange's body is capped at a claim's 4 KiB on the node port
    too: 413 before the body is read (not after 30 MB), the connection closed, and the
    gateway serves others."""
    answer, sent_at_answer, ended = await _stranger_posts(node, framing)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 "), answer[:300]
    assert b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "request_too_large"
    assert 0 <= sent_at_answer < LARGE_BODY  # answered while the body was still coming
    assert ended  # and the connection closed
    pool = node.pool(node.peer)  # others are served
    head_, models = await ask(pool, node.address(), b"GET", "/v1/models", bearer(node.key))
    assert head_.status_code == 200, models
    pool.close()
