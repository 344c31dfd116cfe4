"""One client connection: the h11 server loop, keep-alive, client deadlines, and the
watch for a client that goes away while its request is being answered (SPEC §6, §6.1)."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import h11
import trio

from protocol.access import PREFLIGHT_METHODS, cors_headers, preflight_headers
from protocol.errors import (
    SluiceError,
    bad_request,
    headers_too_large,
    internal,
    payload_too_large,
    request_timeout,
    version_not_supported,
)
from protocol.headers import FORWARDED, Header, connection_tokens, header_value
from protocol.http1 import (
    CONTINUE,
    LAST_CHUNK,
    body_allowed,
    build_response_head,
    frame_chunk,
)
from protocol.request_info import parse_request_body, request_path
from proxy import auth, sockio
from proxy.api.routes import NEEDS_MODELS, Call, route
from proxy.context import GatewayContext
from proxy.errors import ClientGone
from proxy.relay import Relay, error_event

log = logging.getLogger("sluice.connection")

HEAD_TIMEOUT = 10.0  # the whole request head must arrive within this
BODY_GAP_TIMEOUT = 30.0  # longest pause allowed while a request body arrives
IDLE_TIMEOUT = 60.0  # an idle keep-alive connection is closed after this
MAX_HEAD_SIZE = 16 * 1024  # larger request heads get 431
MAX_HEADER_LINES = 100  # more header lines get 431
RECEIVE_SIZE = 64 * 1024  # bytes asked of the kernel per read
READ_AHEAD_CAP = 1024 * 1024  # pipelined bytes buffered while a request is answered
REFUSED_BODY_CAP = 64 * 1024  # a refused request's body read (to keep the connection) up to

_CLOSE = (b"connection", b"close")


def _parser() -> h11.Connection:
    return h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_SIZE)


def _small_body(headers: list[Header]) -> bool:
    """No body, or a Content-Length one of at most REFUSED_BODY_CAP bytes."""
    length = header_value(headers, b"content-length")
    if length is None:
        return header_value(headers, b"transfer-encoding") is None
    return int(length) <= REFUSED_BODY_CAP


def _describe(exc: h11.RemoteProtocolError) -> str:
    """h11's message without the bytes it quotes (a header value may be a secret)."""
    text = str(exc)
    for quote in ("bytearray(", "b'", 'b"', "'", '"'):
        cut = text.find(quote)
        if cut >= 0:
            text = text[:cut]
    return text.rstrip(" :") or "unreadable request"


class _Close(Exception):
    """End the connection quietly (EOF, idle timeout, drain)."""


class ClientConnection:
    def __init__(self, stream: trio.SocketStream, ctx: GatewayContext, *,
                 transport: str) -> None:
        self.stream = stream
        self.fd = stream.socket.fileno()
        self.ctx = ctx
        self.transport = transport
        self.h11 = _parser()  # parses requests only; responses are written by us
        # The answer to the current request: not yet started, its body's framing, finished.
        self.response_started = False
        self.response_done = False
        self.chunked = False  # the response body goes out in chunks (HTTP/1.1 client)
        self.keep_alive = True
        self.must_close = False
        self.gone = False
        self.requests = 0
        self._unread = 0  # bytes the reader fed since the handler last asked for more
        self._waiter: trio.Event | None = None  # set by the reader when it fed h11
        self._resume: trio.Event | None = None  # set when a paused reader may read again
        self.request_scope: trio.CancelScope | None = None  # cancelled if the client leaves
        self._continued = False  # 100 Continue sent for the current request
        self.loopback_peer = True  # a TCP peer on this machine (set in run)
        self.cors_origin: bytes | None = None  # the current request's allowed Origin
        # The current request's headers as a plain list (h11's Headers is a Sequence whose
        # every iteration step is a method call; the hot path reads them about ten times).
        self.headers: list[Header] = []

    def __repr__(self) -> str:
        return (f"ClientConnection({self.transport}, requests={self.requests}, "
                f"request={self.h11.their_state}, responded={self.response_done}, "
                f"gone={self.gone})")

    # ----------------------------------------------------------------- the loop

    async def run(self) -> None:
        try:
            if not self._peer_allowed():
                return
            async with trio.open_nursery() as nursery:  # one nursery per connection
                nursery.start_soon(self._reader)
                try:
                    await self._serve()
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True, deadline=trio.current_time() + 1):
                await self.stream.aclose()

    def _peer_allowed(self) -> bool:
        """Unix socket: the peer's uid must be ours or root. TCP: note whether the peer is
        on this machine (remote clients need an access key)."""
        sock = self.stream.socket
        try:
            if self.transport == "unix":
                return auth.unix_peer_allowed(sock)
            if self.transport == "tcp":
                self.loopback_peer = auth.peer_is_loopback(str(sock.getpeername()[0]))
        except OSError:  # the peer is already gone
            return False
        return True

    async def _serve(self) -> None:
        try:
            while await self._serve_one():
                self._next_cycle()
        except (_Close, ClientGone):
            pass
        except Exception:
            log.exception("connection handler failed")
            if not self.response_started and not self.gone:
                with trio.move_on_after(1):
                    try:
                        await self.send_error(internal("internal gateway error"))
                    except ClientGone:
                        pass

    async def _serve_one(self) -> bool:
        """Answer one request; True when the connection may carry another."""
        refusal: SluiceError | None = None
        try:
            request = await self._read_head()
            try:
                key_id = self._check_access(request)
                if key_id is not None:
                    await self.ctx.settings.key_used(key_id)
            except SluiceError as refused:
                if not _small_body(self.headers):  # refuse before a large body arrives, and close
                    raise
                refusal = refused  # read a small body first, so the connection can be kept
            body = await self._read_body(request)
        except h11.RemoteProtocolError as exc:
            if self.gone:
                raise _Close from None
            status = exc.error_status_hint
            err = headers_too_large("request head is larger than 16 KiB") if status == 431 \
                else bad_request(f"malformed HTTP request: {_describe(exc)}",
                                 code="bad_http_request")
            self.must_close = True
            await self.send_error(err)
            return False
        except SluiceError as err:
            self.must_close = True
            await self.send_error(err)
            return False
        self.requests += 1
        try:
            if refusal is not None:
                raise refusal
            await self._dispatch(request, body)
        except SluiceError as err:
            await self.send_error(err)
        if self.gone or self.must_close or self.ctx.draining or not self.keep_alive:
            return False
        return self.response_done and self.h11.their_state is h11.DONE

    def _next_cycle(self) -> None:
        """A fresh parser for the next request, holding the bytes already read after this
        one (pipelining). Cheaper than h11's own cycle, which would need every response
        byte to go through it."""
        data, closed = self.h11.trailing_data
        self.h11 = _parser()
        if data:
            self.h11.receive_data(data)
        if closed:
            self.h11.receive_data(b"")
        self.response_started = self.response_done = self.chunked = False
        self.cors_origin = None

    # ----------------------------------------------------------------- reading

    async def _reader(self) -> None:
        """The connection's only reader: feeds h11 as bytes arrive, so a client that closes
        is noticed at once whatever the request is waiting for (its scope is cancelled), and
        pipelined requests are buffered (up to READ_AHEAD_CAP) while one is answered."""
        while True:
            if self._unread > READ_AHEAD_CAP:
                self._resume = trio.Event()
                await self._resume.wait()
                continue
            try:
                data = await sockio.recv(self.fd, RECEIVE_SIZE)
            except (trio.ClosedResourceError, OSError):
                data = b""
            self.h11.receive_data(data)
            self._unread += len(data)
            waiter, self._waiter = self._waiter, None
            if waiter is not None:
                waiter.set()
            if not data:
                self.gone = True
                if self.request_scope is not None:
                    self.request_scope.cancel()
                return

    async def _receive(self) -> None:
        """Wait until the reader has fed h11 more bytes (or the end of the stream)."""
        if self.gone:
            return
        self._unread = 0
        resume, self._resume = self._resume, None
        if resume is not None:
            resume.set()
        self._waiter = waiter = trio.Event()
        await waiter.wait()

    async def _read_head(self) -> h11.Request:
        event = self.h11.next_event()
        if event is h11.NEED_DATA:
            # Idle until the first byte of the next request; a drain ends this wait.
            if self.ctx.draining:
                raise _Close
            with trio.move_on_after(IDLE_TIMEOUT) as idle:
                self.ctx.idle_scopes.add(idle)
                try:
                    await self._receive()
                finally:
                    self.ctx.idle_scopes.discard(idle)
            if idle.cancelled_caught:
                raise _Close
            event = self.h11.next_event()
        if event is h11.NEED_DATA:  # the head came in pieces: it has HEAD_TIMEOUT in all
            with trio.move_on_after(HEAD_TIMEOUT) as head_scope:
                while event is h11.NEED_DATA:
                    await self._receive()
                    event = self.h11.next_event()
            if head_scope.cancelled_caught:
                raise request_timeout("the request head did not arrive within 10s")
        if isinstance(event, h11.ConnectionClosed) or (self.gone and event is h11.NEED_DATA):
            raise _Close
        if not isinstance(event, h11.Request):  # pragma: no cover - h11 yields nothing else
            raise bad_request("expected a request", code="bad_http_request")
        if event.http_version not in (b"1.1", b"1.0"):
            raise version_not_supported(event.http_version.decode("ascii", "replace"))
        self.headers = headers = list(event.headers)
        if len(headers) > MAX_HEADER_LINES:
            raise headers_too_large(f"request has more than {MAX_HEADER_LINES} header lines")
        # h11 bounds only heads that arrive in pieces; measure one that came whole too.
        size = len(event.method) + len(event.target) + 12
        for name, value in headers:
            size += len(name) + len(value) + 4
        if size > MAX_HEAD_SIZE:
            raise headers_too_large("request head is larger than 16 KiB")
        if header_value(headers, b"transfer-encoding") is not None and \
                header_value(headers, b"content-length") is not None:
            raise bad_request("a request must not carry both Transfer-Encoding and "
                              "Content-Length", code="bad_http_request")
        # HTTP/1.1 keeps the connection unless told otherwise; HTTP/1.0 gets one answer.
        self.keep_alive = event.http_version == b"1.1" and \
            b"close" not in connection_tokens(headers)
        self.chunked = event.http_version == b"1.1"
        self._continued = False
        return event

    async def _read_body(self, request: h11.Request) -> bytes:
        limit = self.ctx.config.api.max_body_size
        length = header_value(self.headers, b"content-length")
        if length is not None and int(length) > limit:  # h11 has checked it is a number
            raise payload_too_large(limit)
        chunks: list[bytes] = []
        size = 0
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                if self.h11.they_are_waiting_for_100_continue and not self._continued:
                    self._continued = True
                    await self.send(CONTINUE)
                with trio.move_on_after(BODY_GAP_TIMEOUT) as gap:
                    await self._receive()
                if gap.cancelled_caught:
                    raise request_timeout("the request body paused for more than 30s")
                continue
            if type(event) is h11.Data:
                size += len(event.data)
                if size > limit:
                    raise payload_too_large(limit)
                chunks.append(bytes(event.data))
                continue
            if isinstance(event, h11.EndOfMessage):
                return b"".join(chunks)
            raise _Close  # ConnectionClosed mid-body: the client is gone

    # ----------------------------------------------------------------- dispatch

    def _check_access(self, request: h11.Request) -> str | None:
        """The DNS-rebinding guard, the admin token and access keys (SPEC §5): 401/403.
        Returns the id of the access key used, if any."""
        self.cors_origin = auth.guard(self.ctx, self.transport, self.headers)
        return auth.authorize(self.ctx, self.transport, self.loopback_peer, request.method,
                              request_path(request.target), self.headers)

    async def _dispatch(self, request: h11.Request, body: bytes) -> None:
        path = request_path(request.target)
        if request.method == b"OPTIONS":  # CORS preflight, on any path
            await self.send_whole(204, [(b"allow", PREFLIGHT_METHODS)], b"",
                                  cors=preflight_headers())
            return
        handler = route(request.method, path)  # raises 404 / 405
        if handler is not None:
            if handler in NEEDS_MODELS and not self.ctx.backends.ready.is_set():
                await self.ctx.backends.ready.wait()
            reply = handler(Call(self.ctx, request.method, path, body))
            if not isinstance(reply, tuple):  # an async handler
                reply = await reply
            status, payload = reply
            await self.send_json(status, payload)
            return
        info = parse_request_body(path, body)
        ctx = self.ctx
        backend = ctx.backends.holder_of(info.model)
        if backend is not None:  # local first (SPEC §7.1): the hot path asks nothing else
            plan = ctx.router.local_plan(backend)
        else:
            forwarded = header_value(self.headers, FORWARDED) is not None
            if not ctx.router.node_holds(info.model, forwarded=forwarded):
                # Right after start, or while a managed server starts: wait for the local one.
                backend = await ctx.backends.wait_for_holder(info.model)
            if backend is not None:
                plan = ctx.router.local_plan(backend)
            else:  # a network node, or 503
                plan = await ctx.router.forward_plan(info, forwarded=forwarded)
        await self.watched(Relay(self, plan, request, body, info).run)

    async def watched(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work``; if the client closes meanwhile, the reader cancels
        ``request_scope`` (which ``work`` sets) at once, and this raises ClientGone."""
        if self.gone:
            raise ClientGone
        try:
            await work()
        finally:
            self.request_scope = None
        if self.gone:
            raise ClientGone

    # ----------------------------------------------------------------- writing

    async def send(self, data: bytes, on_block: Callable[[], None] | None = None) -> None:
        try:
            await sockio.send_all(self.fd, data, on_block)
        except (trio.ClosedResourceError, OSError):
            self.gone = True
            raise ClientGone from None

    def response_head(self, status: int, headers: list[Header], reason: bytes = b"", *,
                      length: int | None = None, cors: Sequence[Header] = ()) -> bytes:
        """The head of our answer: with ``length`` a Content-Length body, else a streamed one
        (chunked for HTTP/1.1, until close for HTTP/1.0)."""
        self.response_started = True
        # CORS is the gateway's alone: an upstream's own access-control-* headers (llama.cpp
        # sends an empty Allow-Origin) never pass; an allowed Origin gets ours.
        headers[:] = [h for h in headers if not h[0].startswith(b"access-control-")]
        if self.cors_origin is not None:
            headers += cors_headers(self.cors_origin)
            headers += cors
        if not body_allowed(status):
            self.response_done = True
        elif length is not None:
            headers.append((b"content-length", b"%d" % length))
        elif self.chunked:
            headers.append((b"transfer-encoding", b"chunked"))
        else:
            self.keep_alive = False  # the body ends when the connection does
        if self.must_close or self.ctx.draining or not self.keep_alive:
            headers.append(_CLOSE)
        return build_response_head(status, reason, headers)

    def frame(self, data: bytes) -> bytes:
        """Body bytes of a streamed answer, framed for this client."""
        return frame_chunk(data) if self.chunked else data

    def end_of_body(self) -> bytes:
        self.response_done = True
        return LAST_CHUNK if self.chunked else b""

    async def send_whole(self, status: int, headers: list[Header], body: bytes,
                         reason: bytes = b"", *, cors: Sequence[Header] = ()) -> None:
        """A whole answer; ``cors``: more access-control headers for an allowed Origin."""
        if not body_allowed(status):
            body = b""
        data = self.response_head(status, headers, reason, length=len(body), cors=cors)
        self.response_done = True
        await self.send(data + body if body else data)

    async def send_json(self, status: int, payload: Any,
                        extra: Sequence[Header] = ()) -> None:
        body = json.dumps(payload, separators=(",", ":")).encode()
        headers = [(b"content-type", b"application/json"), *extra]
        await self.send_whole(status, headers, body)

    async def send_error(self, err: SluiceError) -> None:
        if self.gone or self.response_started:
            self.must_close = True
            return
        headers = [(b"content-type", b"application/json"), *err.headers]
        await self.send_whole(err.status, headers, err.body())

    async def send_error_event(self, err: SluiceError, *, at_boundary: bool) -> None:
        """After commit: one SSE error event, then the connection ends without the final
        chunk, so the client can tell the answer is incomplete."""
        self.must_close = True
        await self.send(self.frame(error_event(err, at_boundary)))
