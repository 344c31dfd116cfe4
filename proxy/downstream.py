"""The write side of one client connection: what the exchange and the relay send.

A :class:`Downstream` sends the bytes that the request's :class:`protocol.response.Response`
produces through the connection's :class:`~proxy.link.wire.Wire` (the socket's own, or the
node listener's TLS, SPEC §16); a failed send marks the client gone
and raises :class:`~proxy.errors.ClientGone` (after a failed send nothing more can be sent:
a partial write cannot be known).

:class:`AnswerSink` declares the whole interface the relay sees of what it writes to: head,
body, end, a whole answer, an error event, the client's answer state and whether the gateway
is draining. A :class:`Downstream` is one; :class:`proxy.ollama_out.OllamaOut` is the other
(it writes Ollama's answer to the client's Downstream in place of the model server's).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import trio

from protocol.errors import SluiceError
from protocol.headers import Header
from protocol.response import Response
from proxy.errors import ClientGone

if TYPE_CHECKING:
    from proxy.link.wire import Wire

WRITE_TIMEOUT = 60.0  # a client that takes no byte of a whole answer for this is gone


class AnswerSink(Protocol):
    """What :class:`proxy.relay.Relay` writes an upstream's answer to, and all it uses of it
    (see the module). Body bytes are framed by the caller with :meth:`frame`."""

    @property
    def response(self) -> Response:
        """The state of the client's answer: whether anything was sent, ended, broke."""

    @property
    def chunked(self) -> bool:
        """A chunked upstream body may be handed over with its own chunk framing."""

    @property
    def closing(self) -> bool:
        """The gateway is draining."""

    def frame(self, data: bytes) -> bytes:
        """Payload bytes framed as :meth:`send_body` takes them."""

    async def send_whole(self, status: int, headers: list[Header], body: bytes,
                         reason: bytes = b"") -> None:
        """A whole answer (a body with its length)."""

    async def send_head(self, status: int, headers: list[Header], reason: bytes, body: bytes,
                        *, end: bool, on_block: Callable[[], None] | None = None) -> None:
        """A streamed answer's head with its first body bytes; ``end``: they are all."""

    async def send_body(self, data: bytes, on_block: Callable[[], None] | None = None) -> None:
        """More body bytes of a streamed answer."""

    async def end(self, data: bytes = b"", on_block: Callable[[], None] | None = None) -> None:
        """The last body bytes and the end of a streamed answer."""

    async def error_event(self, err: SluiceError, *, at_boundary: bool) -> None:
        """After the head: the answer cannot be completed; say so if the format can, and
        end it broken."""


class Downstream:
    """See the module docstring. ``closing()`` says whether the gateway is draining (every
    answer then ends its connection)."""

    __slots__ = ("_closing", "bytes_sent", "error_code", "first_at", "gone", "response",
                 "wire")

    def __init__(self, wire: Wire, closing: Callable[[], bool]) -> None:
        self.wire = wire
        self.gone = False
        self.response = Response()  # replaced for each request (:meth:`begin`)
        self._closing = closing
        self.first_at: float | None = None  # when the answer's first bytes were sent
        self.bytes_sent = 0  # bytes of the answer sent
        self.error_code: str | None = None  # the OpenAI error code the client was sent

    def begin(self, response: Response) -> None:
        """A new request: its answer's state, and fresh figures for the request log."""
        self.response = response
        self.first_at = None
        self.bytes_sent = 0
        self.error_code = None

    def __repr__(self) -> str:
        return f"Downstream(fd={self.wire.fd}, {self.response!r}, gone={self.gone})"

    @property
    def closing(self) -> bool:
        """The gateway is draining."""
        return self._closing()

    @property
    def chunked(self) -> bool:
        """A streamed body goes out chunk-framed: a chunked upstream body may pass as is."""
        return self.response.chunked

    def frame(self, data: bytes) -> bytes:
        return self.response.frame(data)

    async def _send(self, data: bytes, on_block: Callable[[], None] | None = None,
                    stall: float | None = None) -> None:
        if self.first_at is None:
            self.first_at = trio.current_time()
        self.bytes_sent += len(data)
        try:
            await self.wire.send_all(data, on_block, stall)
        except (trio.ClosedResourceError, OSError):  # TimeoutError too: a stalled client
            self.gone = True
            self.response.broken()
            raise ClientGone from None
        except BaseException:  # cancelled while the kernel was full: a part may be out
            self.response.broken()
            raise

    async def send_continue(self) -> None:
        """``100 Continue`` (once per request, before the answer)."""
        data = self.response.interim_continue()
        if data:
            first_at = self.first_at
            await self._send(data)
            self.first_at, self.bytes_sent = first_at, 0  # not part of the answer

    async def send_whole(self, status: int, headers: list[Header], body: bytes,
                         reason: bytes = b"", *, cors: Sequence[Header] = ()) -> None:
        """A whole answer; ``cors``: more access-control headers for an allowed Origin. A
        client that takes no byte of it for WRITE_TIMEOUT (one that pipelines and never
        reads) is treated as gone, so it cannot hold its connection forever."""
        await self._send(self.response.whole(status, headers, body, reason, cors=cors,
                                             closing=self._closing()), stall=WRITE_TIMEOUT)

    async def send_json(self, status: int, payload: Any) -> None:
        body = json.dumps(payload, separators=(",", ":")).encode()
        await self.send_whole(status, [(b"content-type", b"application/json")], body)

    async def send_error(self, err: SluiceError) -> None:
        """The error as an answer; when the answer has already started (or the client is
        gone) nothing can be said: the connection just ends."""
        if self.gone or self.response.started:
            self.response.broken()
            return
        headers = [(b"content-type", b"application/json"), *err.headers]
        self.error_code = err.code
        await self.send_whole(err.status, headers, err.body(self.response.family))

    async def send_head(self, status: int, headers: list[Header], reason: bytes, body: bytes,
                        *, end: bool, on_block: Callable[[], None] | None = None) -> None:
        """The head of a streamed answer with its first body bytes (framed by the caller),
        in one write; ``end``: they are the whole body."""
        data = self.response.head(status, headers, reason, closing=self._closing()) + body
        if end:
            data += self.response.end()
        await self._send(data, on_block)

    async def send_body(self, data: bytes, on_block: Callable[[], None] | None = None) -> None:
        """More body bytes of a streamed answer (framed by the caller)."""
        await self._send(data, on_block)

    async def end(self, data: bytes = b"", on_block: Callable[[], None] | None = None) -> None:
        """The last body bytes (framed by the caller) and the end of the body."""
        await self._send(data + self.response.end(), on_block)

    async def send_broken(self, data: bytes, code: str | None) -> None:
        """After the head: the last bytes of an answer that cannot be completed (framed
        here; e.g. an Ollama stream's error line), then the connection ends without the
        final chunk."""
        self.error_code = code
        framed = self.response.frame(data) if data else b""
        self.response.broken()
        if framed:
            await self._send(framed)

    async def error_event(self, err: SluiceError, *, at_boundary: bool) -> None:
        """After the head: one SSE error event, then the connection ends without the final
        chunk, so the client can tell the answer is incomplete."""
        self.error_code = err.code
        await self._send(self.response.error_event(err, at_boundary=at_boundary))
