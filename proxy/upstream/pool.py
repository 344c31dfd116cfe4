"""Idle keep-alive connections to upstreams, and one request's exchange over them.

A pooled connection may have been closed by the server while idle: :meth:`take_idle` checks
it first (a poll with no wait: EOF or unsolicited bytes mean it is spent), and does not reuse
one that idled close to the timeout the server announced (``Keep-Alive: timeout=N``). The
poll cannot see a close that is about to happen, and llama.cpp closes its connection right
after every streamed answer while announcing keep-alive (UPSTREAMS.md): a request sent the
moment a stream ends would be written into a closing connection, and a written POST is never
sent again to the same server. So a connection that carried a streamed answer is reused only
when its upstream has shown it keeps such connections (:mod:`protocol.stream_reuse`): until
that is known it is probed with a GET first, off the request's path, by :meth:`run`.

A pinned address (SPEC §16: ``UpstreamAddress.pin``) is a TLS link, made with the client
context the pool was given (:mod:`proxy.link.tls`): its handshake is part of the
connect, and its connections are pooled and reused like plain ones under their own key.
"""

from __future__ import annotations

import socket
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from math import inf

import trio

from protocol.headers import Header
from protocol.http1 import ResponseHead
from protocol.stream_reuse import Action, Sign, StreamReuse, Verdict
from protocol.upstream_url import UpstreamAddress
from proxy.link.sockio import PlainWire
from proxy.link.tls import handshake
from proxy.tasks import TaskHolder
from proxy.upstream.connection import UpstreamConnection, UpstreamFailure, describe

IDLE_PER_ADDRESS = 64  # idle keep-alive connections kept per upstream address
IDEMPOTENT = frozenset({b"GET", b"HEAD"})  # may be sent again after a lost answer
PROBE_PATH = b"/health"  # what a probe asks for: any complete answer will do
PROBE_TIMEOUT = 5.0  # seconds a probe may take; one that takes longer tells nothing
PROBE_BODY_CAP = 1024 * 1024  # a probe answer's body is read (and dropped) up to this size
# A connection after a stream found closed when taken counts against its upstream only if
# it had been idle less than this: one idle longer may have met the server's idle timeout.
SIGN_WINDOW = 2.0
# A server that says how long it keeps an idle connection (Keep-Alive: timeout=N) closes it
# then, and a request sent at that moment would race its close: a pooled connection is
# reused only until this long before that (or half the timeout, if that is shorter).
IDLE_MARGIN = 1.0


class ConnectionPool:
    """Idle keep-alive connections per upstream address (most recently used first), and
    what each upstream does with its connections after streamed answers."""

    def __init__(self, ack_timeout: Callable[[], float] | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self._idle: dict[str, deque[UpstreamConnection]] = {}
        self._reuse: dict[str, StreamReuse] = {}
        self._probes = TaskHolder()  # the probes' nursery, while run() runs
        self.connects = 0
        self.probes = 0
        self.handshakes = 0  # TLS handshakes completed (pinned links)
        # The client context of pinned links (proxy.link.tls.client_context), None
        # without an identity: a pinned address then fails to connect.
        self.tls = tls
        # TCP_USER_TIMEOUT of upstream TCP sockets (timeouts.connection): bytes we sent
        # that the peer's kernel does not acknowledge in time end the connection. A request
        # written to an idle connection over a LAN link that went down since then fails
        # (a connection error) instead of waiting for a head until the total timeout.
        self._ack_timeout = ack_timeout

    def __repr__(self) -> str:
        idle = sum(len(q) for q in self._idle.values())
        return (f"ConnectionPool(addresses={len(self._idle)}, idle={idle}, "
                f"connects={self.connects}, handshakes={self.handshakes}, "
                f"probes={self.probes})")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Runs the probes of connections after streamed answers, until cancelled. Without
        it such connections of an upstream not known to keep them are closed."""
        await self._probes.run(task_status=task_status)

    def after_streams(self, address: UpstreamAddress) -> Verdict:
        """What is known of this upstream's connections after streamed answers."""
        reuse = self._reuse.get(address.key)
        return Verdict.UNKNOWN if reuse is None else reuse.verdict

    def _reuse_of(self, address: UpstreamAddress) -> StreamReuse:
        reuse = self._reuse.get(address.key)
        if reuse is None:
            reuse = self._reuse[address.key] = StreamReuse()
        return reuse

    async def connect(self, address: UpstreamAddress) -> UpstreamConnection:
        """A fresh connection. Raises UpstreamFailure(connect=True) when it cannot be made
        (for a pinned link: PinMismatch, HandshakeRefused, its subclasses)."""
        if address.pin is not None and self.tls is None:
            raise UpstreamFailure(f"cannot connect to {address.key}: this gateway has no "
                                  "identity for pinned links", connect=True)
        try:
            if address.unix_path is not None:
                stream = await trio.open_unix_socket(address.unix_path)
            else:
                assert address.host is not None
                assert address.port is not None
                stream = await trio.open_tcp_stream(address.host, address.port)
                if self._ack_timeout is not None and hasattr(socket, "TCP_USER_TIMEOUT"):
                    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                                      max(int(self._ack_timeout() * 1000), 1))
        except OSError as exc:
            raise UpstreamFailure(f"cannot connect to {address.key}: {describe(exc)}",
                                  connect=True) from None
        self.connects += 1
        if address.pin is None:
            return UpstreamConnection(PlainWire(stream.socket), address)
        assert self.tls is not None
        channel = await handshake(stream.socket, self.tls, address.pin)
        self.handshakes += 1
        return UpstreamConnection(channel, address)

    def take_idle(self, address: UpstreamAddress) -> UpstreamConnection | None:
        """An idle keep-alive connection that still looks alive, or None."""
        queue = self._idle.get(address.key)
        while queue:
            conn = queue.pop()
            idle = trio.current_time() - conn.idle_since
            if idle < conn.idle_limit and conn.looks_alive():
                return conn
            conn.close()
            if conn.after_stream and idle < min(SIGN_WINDOW, conn.idle_limit):
                self._reuse_of(address).see(Sign.FOUND_CLOSED)
        return None

    def lost(self, conn: UpstreamConnection) -> None:
        """A request written onto a pooled connection got nothing back: closed, and when the
        connection had carried a streamed answer, a sign against reusing such connections."""
        conn.close()
        if conn.after_stream:
            self._reuse_of(conn.address).see(Sign.FOUND_CLOSED)

    def release(self, conn: UpstreamConnection) -> None:
        """Keep a connection whose exchange finished cleanly; close anything else."""
        if not conn.reusable:
            conn.close()
            return
        if conn.streamed:
            reuse = self._reuse_of(conn.address)
            probes = self._probes.nursery
            action = reuse.after_stream(can_probe=probes is not None)
            if action is Action.CLOSE:
                conn.close()
                return
            if action is Action.PROBE:
                assert probes is not None
                conn.recycle()
                probes.start_soon(self._probe, conn, reuse)
                return
        self._keep(conn)

    def _keep(self, conn: UpstreamConnection) -> None:
        timeout = conn.head.idle_timeout if conn.head is not None else None
        conn.idle_limit = inf if timeout is None else max(timeout - IDLE_MARGIN, timeout / 2)
        conn.recycle()
        conn.idle_since = trio.current_time()
        queue = self._idle.setdefault(conn.address.key, deque())
        queue.append(conn)
        while len(queue) > IDLE_PER_ADDRESS:
            queue.popleft().close()

    async def _probe(self, conn: UpstreamConnection, reuse: StreamReuse) -> None:
        """Ask a connection that just carried a streamed answer for PROBE_PATH: an answer
        shows its upstream kept it, nothing at all (closed, reset) that it closes them."""
        self.probes += 1
        keep = False
        try:
            with trio.move_on_after(PROBE_TIMEOUT):
                address = conn.address
                await conn.send_request(b"GET", address.target(PROBE_PATH),
                                        [(b"host", address.authority)], b"")
                await conn.receive_head(request_method=b"GET")
                reuse.see(Sign.ANSWERED)
                await conn.receive_body(PROBE_BODY_CAP)
                # Its own answer must not be streamed, or the question starts again.
                keep = conn.reusable and not conn.streamed
        except UpstreamFailure as failure:
            if not failure.responded:
                reuse.see(Sign.LOST)
        finally:
            reuse.probe_ended()
            if keep:
                self._keep(conn)
            else:
                conn.close()

    def close(self) -> None:
        for queue in self._idle.values():
            while queue:
                queue.pop().close()
        self._idle.clear()


async def exchange(
    connections: ConnectionPool,
    address: UpstreamAddress,
    method: bytes,
    target: bytes,
    headers: Sequence[Header],
    body: bytes,
    *,
    on_connecting: Callable[[], None] = lambda: None,
    on_connected: Callable[[], None] = lambda: None,
) -> tuple[UpstreamConnection, ResponseHead]:
    """Send one request and receive the response head.

    A pooled connection is checked before reuse (:meth:`ConnectionPool.take_idle`), and one
    that carried a streamed answer is pooled only for an upstream known to keep it (module
    docstring). A reused connection whose request could not be written (so it provably
    never reached the server) is replaced by a fresh one, silently. Once the request is
    written, a reset or close before the response head is the upstream's failure: a POST is
    never sent a second time to the same server, which may already be generating
    (UPSTREAMS.md); only an idempotent GET or HEAD is retried there. The callbacks let the
    caller move its deadline between the connect phase and the wait for the answer. The
    returned connection is the caller's: release it to the pool or close it.
    """
    conn = connections.take_idle(address)
    if conn is None:  # the connect phase only when there is one
        on_connecting()
        conn = await connections.connect(address)
    retry = method in IDEMPOTENT
    for attempt in (1, 2):
        on_connected()
        written = False
        try:
            await conn.send_request(method, target, headers, body)
            written = True
            return conn, await conn.receive_head(request_method=method)
        except UpstreamFailure as failure:
            if conn.reused and not failure.responded:
                connections.lost(conn)
            else:
                conn.close()
            if attempt == 2 or not conn.reused or failure.responded or (written and not retry):
                raise
        except BaseException:
            conn.close()
            raise
        on_connecting()
        conn = await connections.connect(address)
    raise AssertionError("unreachable")


async def fetch(
    connections: ConnectionPool,
    address: UpstreamAddress,
    path: bytes,
    *,
    api_key: str | None = None,
    cap: int = 8 * 1024 * 1024,
) -> tuple[int, bytes]:
    """A small GET (health checks, model lists): status and whole body."""
    headers: list[Header] = [(b"host", address.authority), (b"accept", b"application/json")]
    if api_key:
        headers.append((b"authorization", b"Bearer " + api_key.encode()))
    head, body = await whole_exchange(connections, address, b"GET", address.target(path),
                                      headers, b"", cap=cap)
    return head.status_code, body


async def whole_exchange(
    connections: ConnectionPool,
    address: UpstreamAddress,
    method: bytes,
    target: bytes,
    headers: Sequence[Header],
    body: bytes,
    *,
    cap: int,
    on_connecting: Callable[[], None] = lambda: None,
    on_connected: Callable[[], None] = lambda: None,
) -> tuple[ResponseHead, bytes]:
    """:func:`exchange` for a small answer read whole (at most ``cap`` bytes): its head and
    body, the connection pooled again after."""
    conn, head = await exchange(connections, address, method, target, headers, body,
                                on_connecting=on_connecting, on_connected=on_connected)
    try:
        answer = await conn.receive_body(cap)
    except BaseException:
        conn.close()
        raise
    connections.release(conn)
    return head, answer
