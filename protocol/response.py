"""The client side of one answer, sans-I/O: which bytes to write and what state that leaves.

:class:`Response` is made per request from the request's HTTP version and ``Connection``
header. Every method returns the bytes to send and moves the state by the one table
:data:`MOVES` (h11's habit): an illegal move is a bug and raises. The state answers the
questions the connection asks afterwards: has anything been sent (then an error can no
longer be an error response), may the connection carry another request.

States:

- ``IDLE`` — nothing of the final answer sent (an interim ``100 Continue`` may have been);
- ``STREAMING`` — the head is out, the body goes on (chunked, or until the connection ends);
- ``DONE`` — the whole answer is out;
- ``BROKEN`` — the answer can never be completed (an error after the head, a failed send,
  the client gone): the connection must end, and a chunked body gets no final chunk, so the
  client can tell it is incomplete.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from protocol.errors import Family, SluiceError
from protocol.headers import QUEUE_MS, REQUEST_ID, Header
from protocol.http1 import (
    CONTINUE,
    LAST_CHUNK,
    body_allowed,
    build_response_head,
    frame_chunk,
)
from protocol.rebinding import cors_headers
from protocol.sse import error_event

CLOSE: Header = (b"connection", b"close")


class State(enum.Enum):
    IDLE = "idle"
    STREAMING = "streaming"
    DONE = "done"
    BROKEN = "broken"


MOVES: dict[State, frozenset[State]] = {
    State.IDLE: frozenset({State.STREAMING, State.DONE, State.BROKEN}),
    State.STREAMING: frozenset({State.DONE, State.BROKEN}),
    State.DONE: frozenset({State.BROKEN}),  # a send of the last bytes failed
    State.BROKEN: frozenset(),
}


class Response:
    """The answer to one request (see the module docstring).

    ``chunked``: a streamed body goes out chunk-framed (an HTTP/1.1 client); for HTTP/1.0 it
    is sent as it is and ends with the connection. ``keep_alive``: the connection may carry
    another request after this answer — decided by the request, and turned off by
    :meth:`close_after` or a body that ends with the connection. ``cors_origin``: an allowed
    Origin the answer names (an upstream's own ``access-control-*`` headers never pass).
    """

    __slots__ = ("bodiless", "chunked", "continued", "cors_origin", "family", "keep_alive",
                 "queue_ms", "request_id", "state", "status")

    def __init__(self, *, http11: bool = True, keep_alive: bool = True,
                 cors_origin: bytes | None = None, request_id: bytes | None = None) -> None:
        self.state = State.IDLE
        self.status = 0  # the status of the head sent (0: none yet)
        self.request_id = request_id  # sent as x-sluice-request-id (SPEC §9.1)
        self.queue_ms: int | None = None  # sent as x-sluice-queue-ms once queued (SPEC §18)
        self.chunked = http11
        self.keep_alive = keep_alive and http11
        self.cors_origin = cors_origin
        self.continued = False  # 100 Continue sent
        self.bodiless = False  # the answer to a HEAD: its head says the length, no body follows
        self.family = Family.OPENAI  # the shape of our errors (the exchange sets it, §12)

    def __repr__(self) -> str:
        return (f"Response({self.state.value}, chunked={self.chunked}, "
                f"keep_alive={self.keep_alive})")

    def request_allows(self, *, http11: bool, keep_alive: bool, head: bool = False) -> None:
        """What the request, once its head is read, allows: chunked framing (HTTP/1.1),
        keeping the connection (HTTP/1.1 without ``Connection: close``), and a body (not
        for a HEAD request, RFC 9110 §9.3.2)."""
        self.chunked = http11
        self.keep_alive = keep_alive and http11
        self.bodiless = head

    def _move(self, new: State) -> None:
        if new not in MOVES[self.state]:
            raise AssertionError(f"illegal response move {self.state.value} -> {new.value}")
        self.state = new

    @property
    def started(self) -> bool:
        """Something of the final answer may have reached the client."""
        return self.state is not State.IDLE

    @property
    def reusable(self) -> bool:
        """The answer is complete and the connection may carry another request."""
        return self.state is State.DONE and self.keep_alive

    def close_after(self) -> None:
        """The connection ends after this answer (its head says so, if not sent yet)."""
        self.keep_alive = False

    def broken(self) -> None:
        """The answer cannot be completed: nothing more is sent, the connection ends."""
        if self.state is not State.BROKEN:
            self._move(State.BROKEN)
        self.keep_alive = False

    def interim_continue(self) -> bytes:
        """``100 Continue``, once per request, before the final answer; else b""."""
        if self.continued or self.state is not State.IDLE:
            return b""
        self.continued = True
        return CONTINUE

    def head(self, status: int, headers: list[Header], reason: bytes = b"", *,
             length: int | None = None, cors: Sequence[Header] = (),
             closing: bool = False) -> bytes:
        """The head of the answer: with ``length`` a Content-Length body (:meth:`whole`
        adds it), else a streamed one. ``closing``: the gateway is draining (the connection
        ends after this answer). ``headers`` is changed in place."""
        if closing:
            self.keep_alive = False
        self.status = status
        headers[:] = [h for h in headers if not h[0].startswith(b"access-control-")]
        if self.request_id is not None:
            headers.append((REQUEST_ID, self.request_id))
        if self.queue_ms is not None:
            headers.append((QUEUE_MS, str(self.queue_ms).encode()))
        if self.cors_origin is not None:
            headers += cors_headers(self.cors_origin)
            headers += cors
        if not body_allowed(status):
            self._move(State.DONE)
        elif length is not None:
            headers.append((b"content-length", b"%d" % length))
            self._move(State.STREAMING)
        else:
            if self.chunked:
                headers.append((b"transfer-encoding", b"chunked"))
            else:
                self.keep_alive = False  # the body ends when the connection does
            self._move(State.STREAMING)
        if not self.keep_alive:
            headers.append(CLOSE)
        return build_response_head(status, reason, headers)

    def whole(self, status: int, headers: list[Header], body: bytes, reason: bytes = b"", *,
              cors: Sequence[Header] = (), closing: bool = False) -> bytes:
        """A whole answer, head and body (only the head for a HEAD request)."""
        if not body_allowed(status):
            body = b""
        data = self.head(status, headers, reason, length=len(body), cors=cors, closing=closing)
        if self.state is State.STREAMING:
            self._move(State.DONE)
        return data + body if body and not self.bodiless else data

    def frame(self, data: bytes) -> bytes:
        """Body bytes of a streamed answer, framed for this client."""
        return frame_chunk(data) if self.chunked else data

    def end(self) -> bytes:
        """The end of a streamed body: the last chunk (nothing for HTTP/1.0)."""
        if self.state is State.DONE:  # a status without a body (204, 304)
            return b""
        self._move(State.DONE)
        return LAST_CHUNK if self.chunked else b""

    def error_event(self, err: SluiceError, *, at_boundary: bool) -> bytes:
        """After the head: one SSE error event; the answer is then broken (no last chunk)."""
        data = self.frame(error_event(err, at_boundary, self.family))
        self.broken()
        return data
