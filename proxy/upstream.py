"""The upstream side: a small h11 client on trio sockets with a keep-alive pool per address.

Timeouts belong to the caller (cancel scopes around these calls). Every OS and h11 failure
is translated here, once, into a :class:`UpstreamFailure` that says whether any response
byte had arrived, because only a failure before that may be retried on a fresh connection.
"""

from __future__ import annotations

import errno
import socket
from collections import deque
from collections.abc import Callable, Sequence

import h11
import trio

from protocol.headers import Header
from protocol.upstream_url import UpstreamAddress

RECEIVE_SIZE = 256 * 1024  # bytes asked of the kernel per read
MAX_HEAD_SIZE = 64 * 1024  # an upstream response head larger than this is refused
IDLE_PER_ADDRESS = 64  # idle keep-alive connections kept per upstream address


class UpstreamFailure(Exception):
    """The upstream connection failed. ``connect`` tells a connect failure from a later one;
    ``responded`` tells whether any byte of the response had arrived."""

    def __init__(self, message: str, *, connect: bool = False, responded: bool = False) -> None:
        super().__init__(message)
        self.connect = connect
        self.responded = responded


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno, str(exc.errno)) + f" ({exc.strerror})"
    return str(exc) or type(exc).__name__


class UpstreamConnection:
    """One HTTP/1.1 connection to a model server."""

    __slots__ = ("_eom", "_responded", "address", "h11", "reused", "stream")

    def __init__(self, stream: trio.SocketStream, address: UpstreamAddress) -> None:
        self.stream = stream
        self.address = address
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_SIZE)
        self.reused = False
        self._eom = False
        self._responded = False

    def __repr__(self) -> str:
        return (f"UpstreamConnection({self.address.key}, reused={self.reused}, "
                f"state={self.h11.our_state}/{self.h11.their_state})")

    @property
    def responded(self) -> bool:
        return self._responded

    async def send_request(self, method: bytes, target: bytes, headers: Sequence[Header],
                           body: bytes) -> None:
        h = self.h11
        data = h.send(h11.Request(method=method, target=target, headers=list(headers)))
        assert data is not None
        if body:
            data += h.send(h11.Data(data=body)) or b""
        data += h.send(h11.EndOfMessage()) or b""
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise UpstreamFailure(f"sending the request failed: {_describe(exc)}") from None

    async def _read(self) -> None:
        try:
            data = await self.stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise UpstreamFailure(f"connection lost: {_describe(exc)}",
                                  responded=self._responded) from None
        if data:
            self._responded = True
        self.h11.receive_data(data)

    def _next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        try:
            return self.h11.next_event()
        except h11.RemoteProtocolError as exc:
            if not self._responded or self.h11.their_state is h11.SEND_RESPONSE:
                what = "closed the connection before answering" if not self._responded \
                    else f"sent an invalid response head: {exc}"
            else:
                what = f"broke the response: {exc}"
            raise UpstreamFailure(f"upstream {what}", responded=self._responded) from None

    async def receive_head(self) -> h11.Response:
        while True:
            event = self._next_event()
            if event is h11.NEED_DATA:
                await self._read()
                continue
            if isinstance(event, h11.Response):
                return event
            if isinstance(event, h11.InformationalResponse):
                continue  # 100 Continue and friends are not relayed
            if isinstance(event, h11.ConnectionClosed):
                raise UpstreamFailure("upstream closed the connection before answering",
                                      responded=self._responded)
            raise UpstreamFailure(f"unexpected upstream event {type(event).__name__}",
                                  responded=True)

    async def receive_parts(self) -> list[bytes] | None:
        """The body bytes available after at most one read, as the upstream's own chunks;
        None once the response is complete."""
        if self._eom:
            return None
        parts: list[bytes] = []
        while True:
            event = self._next_event()
            if event is h11.NEED_DATA:
                if parts:
                    return parts
                await self._read()
                continue
            if type(event) is h11.Data:
                parts.append(bytes(event.data))
                continue
            if isinstance(event, h11.EndOfMessage):
                self._eom = True
                return parts or None
            raise UpstreamFailure(f"unexpected upstream event {type(event).__name__}",
                                  responded=True)

    async def receive_body(self, cap: int) -> bytes:
        """The rest of the body, whole; refuses bodies larger than ``cap``."""
        chunks: list[bytes] = []
        size = 0
        while (parts := await self.receive_parts()) is not None:
            for part in parts:
                size += len(part)
                chunks.append(part)
            if size > cap:
                raise UpstreamFailure(f"upstream response body is over {cap} bytes",
                                      responded=True)
        return b"".join(chunks)

    @property
    def reusable(self) -> bool:
        return self._eom and self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE

    def close(self) -> None:
        """Close at once (synchronous, so it is safe in cancelled and finally blocks)."""
        self.stream.socket.close()

    def looks_alive(self) -> bool:
        """False when an idle connection has been closed or has unsolicited bytes."""
        # A non-blocking peek through a borrowed stdlib socket (trio's recv is async).
        probe = socket.socket(fileno=self.stream.socket.fileno())
        try:
            data = probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True
        except OSError:
            return False
        finally:
            probe.detach()
        del data  # EOF (b"") or bytes nobody asked for: either way the connection is spent
        return False


class UpstreamPool:
    """Idle keep-alive connections per upstream address (most recently used first)."""

    def __init__(self) -> None:
        self._idle: dict[str, deque[UpstreamConnection]] = {}
        self.connects = 0

    def __repr__(self) -> str:
        idle = sum(len(q) for q in self._idle.values())
        return f"UpstreamPool(addresses={len(self._idle)}, idle={idle}, connects={self.connects})"

    async def connect(self, address: UpstreamAddress) -> UpstreamConnection:
        """A fresh connection. Raises UpstreamFailure(connect=True) when it cannot be made."""
        try:
            if address.unix_path is not None:
                stream = await trio.open_unix_socket(address.unix_path)
            else:
                assert address.host is not None
                assert address.port is not None
                stream = await trio.open_tcp_stream(address.host, address.port)
        except OSError as exc:
            raise UpstreamFailure(f"cannot connect to {address.key}: {_describe(exc)}",
                                  connect=True) from None
        self.connects += 1
        return UpstreamConnection(stream, address)

    async def acquire(self, address: UpstreamAddress) -> UpstreamConnection:
        queue = self._idle.get(address.key)
        while queue:
            conn = queue.pop()
            if conn.looks_alive():
                return conn
            conn.close()
        return await self.connect(address)

    def release(self, conn: UpstreamConnection) -> None:
        """Keep a connection whose exchange finished cleanly; close anything else."""
        if not conn.reusable:
            conn.close()
            return
        conn.h11.start_next_cycle()
        conn._eom = False
        conn._responded = False
        conn.reused = True
        queue = self._idle.setdefault(conn.address.key, deque())
        queue.append(conn)
        while len(queue) > IDLE_PER_ADDRESS:
            queue.popleft().close()

    def close(self) -> None:
        for queue in self._idle.values():
            while queue:
                queue.pop().close()
        self._idle.clear()


async def exchange(
    pool: UpstreamPool,
    address: UpstreamAddress,
    method: bytes,
    target: bytes,
    headers: Sequence[Header],
    body: bytes,
    *,
    on_connecting: Callable[[], None] = lambda: None,
    on_connected: Callable[[], None] = lambda: None,
) -> tuple[UpstreamConnection, h11.Response]:
    """Send one request and receive the response head.

    A pooled connection may have been closed by the server while idle (llama.cpp closes after
    every streamed answer), so a failure on a reused connection before any response byte is
    retried once on a fresh one; that is not an upstream failure. The callbacks let the caller
    move its deadline between the connect phase and the wait for the answer. The returned
    connection is the caller's: release it to the pool or close it.
    """
    on_connecting()
    conn = await pool.acquire(address)
    for attempt in (1, 2):
        on_connected()
        try:
            await conn.send_request(method, target, headers, body)
            return conn, await conn.receive_head()
        except UpstreamFailure as failure:
            conn.close()
            if attempt == 2 or not conn.reused or failure.responded:
                raise
        except BaseException:
            conn.close()
            raise
        on_connecting()
        conn = await pool.connect(address)
    raise AssertionError("unreachable")


async def fetch(
    pool: UpstreamPool,
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
    conn, head = await exchange(pool, address, b"GET", address.target(path), headers, b"")
    try:
        body = await conn.receive_body(cap)
    except BaseException:
        conn.close()
        raise
    pool.release(conn)
    return head.status_code, body
