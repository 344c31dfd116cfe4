"""One client connection: the h11 request parser, keep-alive, the client-side deadlines, and
the watch for a client that goes away while its request is answered (SPEC §6, §6.1).

The connection reads; each request is answered by an :class:`~proxy.exchange.Exchange`
that writes to the connection's :class:`~proxy.downstream.Downstream`. The connection owns
the request's :class:`~proxy.deadline.RequestScope` and cancels it when the client closes.

An endpoint may take the connection over (the events WebSocket): the exchange raises
:class:`~proxy.exchange.SwitchProtocols`, the reader stops, and the endpoint gets the socket
as a stream that first replays the request head and what was read after it
(:mod:`proxy.replay_stream`).

The connection reads and writes through its :class:`~proxy.link.wire.Wire`, made by its
listener (:mod:`proxy.link.listener`): the socket's own, or TLS after the node listener's
handshake (SPEC §16); which one it is, the connection does not ask.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import h11
import trio

from protocol.errors import (
    SluiceError,
    bad_request,
    headers_too_large,
    internal,
    payload_too_large,
    request_timeout,
    version_not_supported,
)
from protocol.headers import REQUEST_ID, Header, header_value
from protocol.http1 import build_request_head
from proxy.context import GatewayContext
from proxy.deadline import RequestScope
from proxy.downstream import Downstream
from proxy.errors import ClientGone, CloseQuietly
from proxy.exchange import Exchange, SwitchProtocols
from proxy.replay_stream import ReplayStream

if TYPE_CHECKING:
    from collections.abc import Callable

    from proxy.link.listener import Peer
    from proxy.link.wire import Wire

log = logging.getLogger("sluice.connection")

HEAD_TIMEOUT = 10.0  # the whole request head must arrive within this
BODY_GAP_TIMEOUT = 30.0  # longest pause allowed while a request body arrives
IDLE_TIMEOUT = 60.0  # an idle keep-alive connection is closed after this
MAX_HEAD_SIZE = 16 * 1024  # larger request heads get 431
MAX_HEADER_LINES = 100  # more header lines get 431
RECEIVE_SIZE = 64 * 1024  # bytes asked of the kernel per read
READ_AHEAD_CAP = 1024 * 1024  # pipelined bytes buffered while a request is answered

_HEAD_TOO_LARGE = f"request head is larger than {MAX_HEAD_SIZE // 1024} KiB"


def _parser() -> h11.Connection:
    return h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_SIZE)


def _describe(exc: h11.RemoteProtocolError) -> str:
    """h11's message without the bytes it quotes (a header value may be a secret)."""
    text = str(exc)
    for quote in ("bytearray(", "b'", 'b"', "'", '"'):
        cut = text.find(quote)
        if cut >= 0:
            text = text[:cut]
    return text.rstrip(" :") or "unreadable request"


class ClientConnection:
    def __init__(self, wire: Wire, ctx: GatewayContext, peer: Peer) -> None:
        self.wire = wire
        self.ctx = ctx
        self.peer = peer  # let in by its listener (proxy.link.listener)
        self.h11 = _parser()  # parses requests only; responses are written by the Downstream
        self.out = Downstream(wire, lambda: ctx.clients.draining)
        self.scope = RequestScope()  # the request in flight; cancelled if the client leaves
        self.gone = False  # the client closed its side
        self.requests = 0
        self._unread = 0  # bytes the reader fed since the exchange last asked for more
        self._waiter: trio.Event | None = None  # set by the reader when it fed h11
        self._idle_over = False  # its wait for a next request was ended (end_idle)
        self._body_taken: int | None = None  # body bytes read_body took past h11 (see there)
        self.method = b""  # the current request's
        self._coded = False  # it has a Transfer-Encoding (its body is not framed by length)
        self._resume: trio.Event | None = None  # set when a paused reader may read again
        self._reading = trio.CancelScope()  # the reader's; cancelled for a protocol switch
        self._reader_done = trio.Event()
        # The current request's headers as a plain list (h11's Headers is a Sequence whose
        # every iteration step is a method call; the hot path reads them about ten times).
        self.headers: list[Header] = []

    def __repr__(self) -> str:
        return (f"ClientConnection({self.peer.listener.name}, requests={self.requests}, "
                f"request={self.h11.their_state}, {self.out!r}, gone={self.gone})")

    # ----------------------------------------------------------------- the loop

    async def run(self) -> None:
        try:
            switch = None
            async with trio.open_nursery() as nursery:  # one nursery per connection
                nursery.start_soon(self._reader)
                try:
                    switch = await self._serve()
                finally:
                    nursery.cancel_scope.cancel()
            if switch is not None:
                await self._switch_protocols(switch)
        finally:
            self.wire.close()  # over TLS, a close_notify first when the socket takes it

    async def _serve(self) -> SwitchProtocols | None:
        """Answer requests until the connection must end; a protocol switch is returned
        (with the reader stopped) for :meth:`_switch_protocols`."""
        try:
            while True:
                try:
                    await Exchange(self.ctx, self, self.out, self.scope, self.peer).run()
                except SwitchProtocols as switch:
                    self._reading.cancel()
                    await self._reader_done.wait()
                    return None if self.gone else switch
                if not self._reusable():
                    return None
                self._next_cycle()
        except (CloseQuietly, ClientGone):
            pass
        except Exception:
            log.exception("connection handler failed")
            if not self.out.response.started and not self.gone:
                with trio.move_on_after(1):
                    try:
                        await self.out.send_error(internal("internal gateway error"))
                    except ClientGone:
                        pass
        return None

    async def _switch_protocols(self, switch: SwitchProtocols) -> None:
        """Hand the socket to the endpoint that took the connection over: a stream that
        replays the request head and the bytes read after it, then reads the socket."""
        data, closed = self.h11.trailing_data
        head = build_request_head(switch.method, switch.target, self.headers)
        stream = ReplayStream(self.wire.stream(), head + data, eof=closed)
        request_id = self.out.response.request_id
        headers = [] if request_id is None else [(REQUEST_ID, request_id)]
        try:
            await switch.takeover.run(stream, headers)
        except Exception:
            log.exception("%r failed", switch.takeover)

    def _reusable(self) -> bool:
        return (self.out.response.reusable and not self.gone and not self.out.gone
                and not self.ctx.clients.draining
                and (self._body_taken is not None or self.h11.their_state is h11.DONE))

    def _next_cycle(self) -> None:
        """A fresh parser for the next request, holding the bytes already read after this
        one (pipelining). Cheaper than h11's own cycle, which would need every response
        byte to go through it."""
        data, closed = self.h11.trailing_data
        if self._body_taken:  # read_body took the body from there, past h11
            data = data[self._body_taken:]
        self._body_taken = None
        self.h11 = _parser()
        if data:
            self.h11.receive_data(data)
        if closed:
            self.h11.receive_data(b"")
        self.scope = RequestScope()

    # ----------------------------------------------------------------- reading

    async def _reader(self) -> None:
        """The connection's only reader: feeds h11 as bytes arrive, so a client that closes
        is noticed at once whatever the request is waiting for (its scope is cancelled), and
        pipelined requests are buffered (up to READ_AHEAD_CAP) while one is answered.
        Stopped (``_reading``) when the connection switches protocols."""
        try:
            with self._reading:
                await self._read()
        finally:
            self._reader_done.set()

    async def _read(self) -> None:
        drained = False  # the last read took all there was: the client sends next after our answer
        while True:
            if self._unread > READ_AHEAD_CAP:
                self._resume = trio.Event()
                await self._resume.wait()
                continue
            try:
                data = await self.wire.recv(RECEIVE_SIZE, drained)
            except (trio.ClosedResourceError, OSError):
                data = b""
            drained = len(data) < RECEIVE_SIZE
            self.h11.receive_data(data)
            self._unread += len(data)
            waiter, self._waiter = self._waiter, None
            if waiter is not None:
                waiter.set()
            if not data:
                self.gone = True
                self.scope.cancel()
                return
            del data  # h11 holds a copy: the wait for the next read keeps no request bytes

    def end_idle(self) -> None:
        """The wait for the next request is over (Clients.close_idle, or a drain)."""
        self._idle_over = True
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.set()

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

    def _unreadable(self, exc: h11.RemoteProtocolError) -> SluiceError:
        """h11's refusal as our error (400 or 431); a client already gone gets nothing."""
        if self.gone:
            raise CloseQuietly from None
        if exc.error_status_hint == 431:
            return headers_too_large(_HEAD_TOO_LARGE)
        return bad_request(f"malformed HTTP request: {_describe(exc)}", code="bad_http_request")

    async def read_head(self) -> h11.Request:
        """The next request's head. Raises CloseQuietly (EOF, idle, drain) or SluiceError."""
        try:
            event = await self._next_head()
        except h11.RemoteProtocolError as exc:
            raise self._unreadable(exc) from None
        self.requests += 1
        if event.http_version not in (b"1.1", b"1.0"):
            raise version_not_supported(event.http_version.decode("ascii", "replace"))
        self.method = event.method
        self.headers = headers = list(event.headers)
        if len(headers) > MAX_HEADER_LINES:
            raise headers_too_large(f"request has more than {MAX_HEADER_LINES} header lines")
        # h11 bounds only heads that arrive in pieces; measure one that came whole too.
        size = len(event.method) + len(event.target) + 12
        for name, value in headers:
            size += len(name) + len(value) + 4
        if size > MAX_HEAD_SIZE:
            raise headers_too_large(_HEAD_TOO_LARGE)
        self._coded = header_value(headers, b"transfer-encoding") is not None
        if self._coded:
            if header_value(headers, b"content-length") is not None:
                raise bad_request("a request must not carry both Transfer-Encoding and "
                                  "Content-Length", code="bad_http_request")
            if event.http_version == b"1.0":  # RFC 9112 §6.1: its framing is faulty
                raise bad_request("an HTTP/1.0 request must not carry Transfer-Encoding",
                                  code="bad_http_request")
        return event

    async def _next_head(self) -> h11.Request:
        event = self.h11.next_event()
        if event is h11.NEED_DATA:
            # Idle until the first byte of the next request; Clients.close_idle ends this
            # wait after IDLE_TIMEOUT, and a drain at once.
            clients = self.ctx.clients
            if clients.draining:
                raise CloseQuietly
            clients.wait_idle(self)
            try:
                await self._receive()
            finally:
                clients.busy(self)
            if self._idle_over:
                raise CloseQuietly
            event = self.h11.next_event()
        if event is h11.NEED_DATA:  # the head came in pieces: it has HEAD_TIMEOUT in all
            with trio.move_on_after(HEAD_TIMEOUT) as head_scope:
                while event is h11.NEED_DATA:
                    await self._receive()
                    event = self.h11.next_event()
            if head_scope.cancelled_caught:
                raise request_timeout(
                    f"the request head did not arrive within {HEAD_TIMEOUT:g}s")
        if isinstance(event, h11.ConnectionClosed) or (self.gone and event is h11.NEED_DATA):
            raise CloseQuietly
        if not isinstance(event, h11.Request):  # pragma: no cover - h11 yields nothing else
            raise bad_request("expected a request", code="bad_http_request")
        return event

    def _may_switch(self) -> bool:
        """The request asks to switch protocols (Upgrade, or CONNECT): h11 then treats
        what follows its body as another protocol's."""
        return (self.method == b"CONNECT" or header_value(self.headers, b"upgrade") is not None
                or self.h11.their_state is not h11.SEND_BODY)

    def _fed(self, feed: Callable[[bytes], None], data: bytes) -> None:
        try:
            feed(data)
        except SluiceError:
            self.out.response.close_after()  # the rest of the body is never read
            raise

    async def read_body(self, limit: int, feed: Callable[[bytes], None] | None = None
                        ) -> bytes:
        """The current request's body, at most ``limit`` bytes (413 beyond). ``feed``, when
        given, is handed each piece as it arrives (a form's reader, SPEC §17.2); what it
        raises ends the read (the connection closes after the answer)."""
        length = header_value(self.headers, b"content-length")
        size = None if length is None else int(length)  # h11 has checked it is a number
        if size is not None and size > limit:
            raise payload_too_large(limit)
        if size is None and not self._coded:
            size = 0  # RFC 9112 §6.3: no Content-Length, no Transfer-Encoding: no body
        if size is not None and not self._may_switch():
            # The usual request: its whole body came with its head. h11 has framed it (the
            # first ``size`` bytes after the head); taking them from its buffer saves its
            # Data and EndOfMessage events, most of the cost of a small request's parse.
            # The next request's parser starts after them (_next_cycle). Not for a request
            # that may switch protocols: h11 takes what follows it for another protocol's.
            data, _ = self.h11.trailing_data
            if len(data) >= size:
                self._body_taken = size
                whole = data[:size]
                if feed is not None:
                    self._fed(feed, whole)
                return whole
        chunks: list[bytes] = []
        size = 0
        try:
            while True:
                event = self.h11.next_event()
                if event is h11.NEED_DATA:
                    if self.h11.they_are_waiting_for_100_continue:
                        await self.out.send_continue()
                    with trio.move_on_after(BODY_GAP_TIMEOUT) as gap:
                        await self._receive()
                    if gap.cancelled_caught:
                        raise request_timeout("the request body paused for more than "
                                              f"{BODY_GAP_TIMEOUT:g}s")
                    continue
                if type(event) is h11.Data:
                    size += len(event.data)
                    if size > limit:
                        raise payload_too_large(limit)
                    chunk = bytes(event.data)
                    chunks.append(chunk)
                    if feed is not None:
                        self._fed(feed, chunk)
                    continue
                if isinstance(event, h11.EndOfMessage):
                    if self.h11.their_state is not h11.DONE:  # it might switch protocol
                        # CONNECT or an Upgrade request: what follows may be another
                        # protocol, never read as a request. Answer, then close.
                        self.out.response.close_after()
                    return b"".join(chunks)
                raise CloseQuietly  # ConnectionClosed mid-body: the client is gone
        except h11.RemoteProtocolError as exc:
            raise self._unreadable(exc) from None
