"""One connection to an upstream: a lean HTTP/1.1 client (:mod:`protocol.http1`) on trio
sockets. The pool of idle ones and the request exchange are in :mod:`proxy.upstream.pool`.

Timeouts belong to the caller (cancel scopes around these calls). Every OS and protocol failure
is translated here, once, into a :class:`UpstreamFailure` that says whether any response
byte had arrived, because only a failure before that may be retried on a fresh connection.
"""

from __future__ import annotations

import errno
import ssl
from collections.abc import Sequence

import trio

from protocol.headers import Header
from protocol.http1 import (
    ChunkedScanner,
    ProtocolError,
    ResponseHead,
    build_request_head,
    parse_response_head,
)
from protocol.upstream_url import UpstreamAddress
from proxy.link.wire import Wire

RECEIVE_SIZE = 64 * 1024  # bytes asked of the kernel per read
MAX_HEAD_SIZE = 64 * 1024  # an upstream response head larger than this is refused


class UpstreamFailure(Exception):
    """The upstream connection failed. ``connect`` tells a connect failure from a later one;
    ``responded`` tells whether any byte of the response had arrived; ``lost_before_body``
    that the connection ended (closed or reset) before any byte of the response body."""

    def __init__(self, message: str, *, connect: bool = False, responded: bool = False,
                 lost_before_body: bool = False) -> None:
        super().__init__(message)
        self.connect = connect
        self.responded = responded
        self.lost_before_body = lost_before_body

    @property
    def connection_error(self) -> bool:
        """SPEC §7.4: refused, reset or closed before the first body byte (also after a 200
        head) is a connection error; anything else is a broken answer."""
        return self.connect or not self.responded or self.lost_before_body


def describe(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):  # its errno is OpenSSL's, not the kernel's
        return f"TLS: {exc.reason or type(exc).__name__}"
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno, str(exc.errno)) + f" ({exc.strerror})"
    return str(exc) or type(exc).__name__


class UpstreamConnection:
    """One HTTP/1.1 connection to a model server or node, spoken with
    :mod:`protocol.http1` over its :class:`~proxy.link.wire.Wire`: the socket's own, or
    TLS for a pinned link (SPEC §16)."""

    __slots__ = ("_buffer", "_drained", "_eof", "_length_left", "_mode", "_pending", "_responded",
                 "_scanner", "address", "after_stream", "body_started", "head", "idle_limit",
                 "idle_since", "reused", "wire")

    def __init__(self, wire: Wire, address: UpstreamAddress) -> None:
        self.wire = wire
        self.address = address
        self.reused = False
        self.after_stream = False  # the last answer on it was streamed (chunked)
        self.idle_since = 0.0  # when the pool took it back (trio time)
        self.idle_limit = 0.0  # seconds it may idle in the pool and still be reused
        self._start()

    def _start(self) -> None:
        self.head: ResponseHead | None = None
        self._buffer = b""  # received bytes not yet handed out
        self._eof = False
        self._drained = False  # the last read took all there was
        self._responded = False
        self.body_started = False  # a byte of the response body has arrived
        self._mode = _NO_BODY
        self._length_left = 0
        self._scanner: ChunkedScanner | None = None
        self._pending: UpstreamFailure | None = None  # raised after the good bytes before it

    def __repr__(self) -> str:
        return (f"UpstreamConnection({self.address.key}, reused={self.reused}, "
                f"head={self.head!r})")

    @property
    def responded(self) -> bool:
        return self._responded

    async def send_request(self, method: bytes, target: bytes, headers: Sequence[Header],
                           body: bytes) -> None:
        data = build_request_head(method, target, list(headers))
        self._drained = True  # the answer cannot be there before the request is
        try:
            await self.wire.send_all(data + body if body else data)
        except (trio.ClosedResourceError, OSError) as exc:
            raise UpstreamFailure(f"sending the request failed: {describe(exc)}") from None

    async def _read(self) -> bytes:
        try:
            data = await self.wire.recv(RECEIVE_SIZE, self._drained)
        except (trio.ClosedResourceError, OSError) as exc:
            raise UpstreamFailure(f"connection lost: {describe(exc)}",
                                  responded=self._responded,
                                  lost_before_body=not self.body_started) from None
        # A read that took less than it asked for took all there was: the next bytes come
        # later (the model's next tokens), so the next read waits before it tries.
        self._drained = len(data) < RECEIVE_SIZE
        if data:
            self._responded = True
        else:
            self._eof = True
        return data

    async def receive_head(self, *, request_method: bytes = b"POST") -> ResponseHead:
        buffer = self._buffer
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD_SIZE:
                    raise UpstreamFailure("upstream response head is too large", responded=True)
                data = await self._read()
                if not data:
                    what = "closed the connection before answering" if not buffer \
                        else "closed the connection in the middle of the response head"
                    raise UpstreamFailure(f"upstream {what}", responded=self._responded)
                buffer += data
                continue
            try:
                head = parse_response_head(buffer[:end], request_method=request_method)
            except ProtocolError as exc:
                raise UpstreamFailure(f"upstream sent an invalid response head: {exc}",
                                      responded=True) from None
            buffer = buffer[end + 4:]
            if 100 <= head.status_code < 200:
                continue  # 100 Continue and friends are not relayed
            self._buffer = buffer
            self.head = head
            if head.chunked:
                self._mode = _CHUNKED
                self._scanner = ChunkedScanner()
            elif head.content_length is not None:
                self._mode = _LENGTH if head.content_length else _NO_BODY
                self._length_left = head.content_length
            else:
                self._mode = _UNTIL_CLOSE
            return head

    async def _next_data(self) -> bytes:
        if self._buffer:
            data, self._buffer = self._buffer, b""
            self.body_started = True
            return data
        data = await self._read()
        if not data and self._mode != _UNTIL_CLOSE:
            where = "in the middle of the body" if self.body_started else "after the head"
            raise UpstreamFailure(f"upstream closed the connection {where}",
                                  responded=True, lost_before_body=not self.body_started)
        self.body_started = self.body_started or bool(data)
        return data

    def body_done(self) -> bool:
        """The whole response body has been received."""
        return self._mode == _NO_BODY

    @property
    def tail(self) -> bytes:
        """The last few payload bytes of a chunked body (for an SSE boundary check)."""
        return self._scanner.tail if self._scanner is not None else b""

    async def receive_chunked_raw(self) -> bytes:
        """Chunked bodies only: the bytes of the next read that belong to data chunks, with
        their framing, to forward verbatim (b"" when a read held none); ``body_done()`` is
        True once the terminating chunk was seen (it is not returned)."""
        scanner = self._scanner
        assert scanner is not None
        if self._pending is not None:
            raise self._pending
        data = await self._next_data()
        try:
            out = scanner.feed(data)
        except ProtocolError as exc:
            failure = UpstreamFailure(f"upstream broke the chunked body: {exc}", responded=True)
            if not exc.forward:
                raise failure from None
            # The whole chunks that came before the break in this read are relayed first.
            self._pending = failure
            return exc.forward
        if scanner.done:
            self._mode = _NO_BODY
            self._buffer = scanner.leftover
        return out

    async def receive_payload(self) -> bytes | None:
        """The body bytes of the next read, decoded; None once the body is complete."""
        mode = self._mode
        if mode == _NO_BODY:
            return None
        if mode == _CHUNKED:
            scanner = self._scanner
            assert scanner is not None
            scanner.collect = True
            await self.receive_chunked_raw()
            parts, scanner.parts = scanner.parts, []
            return b"".join(parts)
        data = await self._next_data()
        if mode == _UNTIL_CLOSE:
            if not data:
                self._mode = _NO_BODY
                return None
            return data
        if len(data) >= self._length_left:
            data, self._buffer = data[:self._length_left], data[self._length_left:]
            self._mode = _NO_BODY
        else:
            self._length_left -= len(data)
        return data

    async def receive_body(self, cap: int) -> bytes:
        """The rest of the body, whole; refuses bodies larger than ``cap``."""
        chunks: list[bytes] = []
        size = 0
        while (part := await self.receive_payload()) is not None:
            size += len(part)
            chunks.append(part)
            if size > cap:
                raise UpstreamFailure(f"upstream response body is over {cap} bytes",
                                      responded=True)
        return b"".join(chunks)

    @property
    def reusable(self) -> bool:
        return (self._mode == _NO_BODY and self.head is not None and self.head.keep_alive
                and not self._buffer and not self._eof)

    def close(self) -> None:
        """Close at once (synchronous, so it is safe in cancelled and finally blocks)."""
        self.wire.close()

    @property
    def streamed(self) -> bool:
        """The current answer's body is chunked (a stream, as llama.cpp sends them)."""
        return self.head is not None and self.head.chunked

    def recycle(self) -> None:
        """Ready for the next exchange on the same connection (the pool's, once released)."""
        self.after_stream = self.streamed
        self._start()
        self.reused = True

    def looks_alive(self) -> bool:
        """False when an idle connection has been closed, reset or has unsolicited bytes:
        anything readable on an idle connection (EOF included) means it is spent; over TLS,
        records without data (a session ticket) do not count."""
        return self.wire.looks_alive()


_NO_BODY, _LENGTH, _CHUNKED, _UNTIL_CLOSE = range(4)
