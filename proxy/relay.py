"""The streaming pipe between one client request and one upstream answer (SPEC §6).

States are an enum with one table of legal moves. The response is committed to the client
together with the first body chunk; before that every failure becomes an OpenAI-shaped
error response, after it one SSE error event followed by closing the connection.
"""

from __future__ import annotations

import enum
import json
import logging
from functools import partial
from typing import TYPE_CHECKING

import h11
import trio

from protocol.errors import (
    SluiceError,
    upstream_bad_response,
    upstream_timeout,
    upstream_unreachable,
)
from protocol.headers import (
    downstream_response_headers,
    is_event_stream,
    upstream_request_headers,
)
from protocol.http1 import ResponseHead
from protocol.request_info import RequestInfo, request_path, total_timeout
from protocol.sse import TAIL, ends_event
from proxy.errors import ClientGone
from proxy.routing.router import Outcome
from proxy.sockio import Fairness
from proxy.upstream import UpstreamConnection, UpstreamFailure, exchange

if TYPE_CHECKING:
    from proxy.connection import ClientConnection
    from proxy.routing.router import Plan

log = logging.getLogger("sluice.relay")

MAX_WHOLE_BODY = 256 * 1024 * 1024  # a non-streamed answer larger than this is refused


class RelayState(enum.Enum):
    WAITING = "waiting"  # nothing sent to the client yet
    COMMITTED = "committed"  # status line, headers and the first chunk are out
    DONE = "done"
    ABORTED = "aborted"


MOVES: dict[RelayState, frozenset[RelayState]] = {
    RelayState.WAITING: frozenset({RelayState.COMMITTED, RelayState.DONE, RelayState.ABORTED}),
    RelayState.COMMITTED: frozenset({RelayState.DONE, RelayState.ABORTED}),
    RelayState.DONE: frozenset(),
    RelayState.ABORTED: frozenset(),
}


class Deadline:
    """One cancel scope for the whole exchange, moved between phases; remembers which
    configured limit it stands for, so a timeout can name it."""

    __slots__ = ("_answer", "_connect", "limit", "scope", "seconds", "total_at", "total_limit",
                 "total_seconds")

    def __init__(self, scope: trio.CancelScope, total_at: float, total_limit: str,
                 total_seconds: float, *, connect: float, answer: tuple[float, str]) -> None:
        self.scope = scope
        self.total_at = total_at
        self.total_limit = total_limit
        self.total_seconds = total_seconds
        self.limit = total_limit
        self.seconds = total_seconds
        # The limits of the connect phase and of the wait for the response head. The scope's
        # deadline is first set by connecting() or connected(), before any await: each
        # change costs a couple of microseconds, and a pooled connection skips one.
        self._connect = connect
        self._answer = answer

    def connecting(self) -> None:
        self.within(self._connect, "timeouts.connection")

    def connected(self) -> None:
        self.within(*self._answer)

    def within(self, seconds: float, limit: str) -> None:
        """Bound the next phase by ``seconds`` from now (never past the total)."""
        at = trio.current_time() + seconds
        if at < self.total_at:
            self.scope.deadline = at
            self.limit = limit
            self.seconds = seconds
        else:
            self.scope.deadline = self.total_at
            self.limit = self.total_limit
            self.seconds = self.total_seconds

    def to_total(self) -> None:
        self.scope.deadline = self.total_at
        self.limit = self.total_limit
        self.seconds = self.total_seconds

    def error(self, what: str) -> SluiceError:
        return upstream_timeout(f"{what} within {self.limit} ({self.seconds:g}s)")


class Relay:
    """Runs one request to its upstream (failing over once to another node when the plan
    allows) and writes the answer to the client."""

    def __init__(self, client: ClientConnection, plan: Plan, request: h11.Request,
                 body: bytes, info: RequestInfo) -> None:
        self.client = client
        self.plan = plan
        self.request = request
        self.body = body
        self.info = info
        self.state = RelayState.WAITING
        self.status = 0  # the status relayed to the client
        self._tail = b""  # last payload bytes sent, when not passing chunked framing through
        self._conn: UpstreamConnection | None = None
        self._interrupted = False  # cancelled from outside (shutdown)

    def __repr__(self) -> str:
        return f"Relay({self.plan!r}, {self.info!r}, state={self.state.value})"

    def _move(self, new: RelayState) -> None:
        if new not in MOVES[self.state]:
            raise AssertionError(f"illegal relay move {self.state.value} -> {new.value}")
        self.state = new

    async def run(self) -> None:
        """Relay the exchange. Raises SluiceError only while nothing was sent (WAITING)."""
        try:
            await self._run()
        except UpstreamFailure as failure:
            if failure.connect:
                err = upstream_unreachable(str(failure))
            elif failure.responded:
                err = upstream_bad_response(str(failure))
            else:
                err = upstream_unreachable(str(failure))
            await self._fail(err)
        except _Timeout as timeout:
            await self._fail(timeout.error)
        except trio.Cancelled:
            self._interrupted = True
            raise
        finally:
            conn = self._conn
            if conn is not None:
                self._conn = None
                if self.state is RelayState.DONE:
                    self.client.ctx.pool.release(conn)
                else:
                    conn.close()
            self._settle()

    def _settle(self) -> None:
        """Record the outcome of the last attempt (see proxy.routing.router)."""
        attempt = self.plan.attempt
        if attempt.finished:
            return
        if self.state is RelayState.DONE:
            status = self.status
            outcome = (Outcome.SUCCESS if status < 400 else
                       Outcome.REFUSED if status < 500 else Outcome.FAILURE)
        elif self.client.gone or self._interrupted:
            outcome = Outcome.ABORTED
        else:
            outcome = Outcome.FAILURE
        attempt.finish(outcome, trio.current_time())

    def _fail_over(self, why: str) -> bool:
        """Before anything reached the client: try the next node, if the plan has one."""
        plan = self.plan
        if not plan.may_fail_over:
            return False
        failed = plan.upstream.served_by
        if not plan.alternate(trio.current_time()):
            return False
        # A 5xx failover re-runs a request the first node may have worked on: say so.
        log.warning("failover: %s failed (%s); %s %s sent again to %s", failed.decode(), why,
                    self.request.method.decode("latin-1"), request_path(self.request.target),
                    plan.upstream.served_by.decode())
        conn = self._conn
        if conn is not None:
            self._conn = None
            conn.close()
        self._tail = b""
        return True

    async def _run(self) -> None:
        timeouts = self.client.ctx.config.timeouts
        info = self.info
        total, total_limit = total_timeout(timeouts, info)
        total_at = trio.current_time() + total
        if info.stream:  # the wait for the answer's head
            answer = (timeouts.request.streaming.first_byte,
                      "timeouts.request.streaming.first_byte")
        else:
            answer = (total, total_limit)
        plan = self.plan
        while True:
            upstream = plan.upstream
            address = upstream.address
            if address is None:  # a managed server that died a moment ago
                raise UpstreamFailure("the model server is restarting", connect=True)
            with trio.CancelScope() as scope:
                # One scope per attempt, all with the same total: its deadline moves between
                # the limits, and the connection's reader cancels it if the client leaves.
                self.client.request_scope = scope
                deadline = Deadline(scope, total_at, total_limit, total,
                                    connect=timeouts.connection, answer=answer)

                headers = upstream_request_headers(
                    self.client.headers, authority=address.authority,
                    body_length=len(self.body), api_key=upstream.api_key,
                    forwarded_by=upstream.forwarded_by)
                try:
                    conn, head = await exchange(
                        self.client.ctx.pool, address, self.request.method,
                        address.target(self.request.target), headers, self.body,
                        on_connecting=deadline.connecting, on_connected=deadline.connected)
                except UpstreamFailure as failure:
                    if self._fail_over(str(failure)):
                        continue
                    raise
                plan.attempt.answered(trio.current_time())
                self._conn = conn
                if head.status_code >= 500 and self._fail_over(
                        f"it answered {head.status_code}"):
                    continue
                try:
                    if is_event_stream(head.headers) or (
                            info.stream and head.content_length is None):
                        await self._relay_stream(conn, head, deadline)
                    else:
                        await self._relay_whole(conn, head)
                except UpstreamFailure as failure:
                    # Closed before the first body byte reached the client: a connection error.
                    if self.state is RelayState.WAITING and self._fail_over(str(failure)):
                        continue
                    raise
                return
            # Only reached when the scope was cancelled: by the client leaving, or a deadline.
            if self.client.gone:
                raise ClientGone
            if deadline.limit == "timeouts.connection":
                if self._fail_over("it did not accept the connection within "
                                   f"timeouts.connection ({timeouts.connection:g}s)"):
                    continue
                raise _Timeout(deadline.error("could not connect to the upstream"))
            phase = ("the upstream sent nothing" if self.state is RelayState.WAITING
                     else "the upstream stalled")
            raise _Timeout(deadline.error(phase))

    async def _relay_whole(self, conn: UpstreamConnection, head: ResponseHead) -> None:
        body = await conn.receive_body(MAX_WHOLE_BODY)
        headers = downstream_response_headers(head.headers, served_by=self.plan.upstream.served_by)
        self.status = head.status_code
        await self.client.send_whole(head.status_code, headers, body, reason=head.reason)
        self._move(RelayState.DONE)

    async def _relay_stream(self, conn: UpstreamConnection, head: ResponseHead,
                            deadline: Deadline) -> None:
        """Forward the body as it arrives. A chunked upstream body going to an HTTP/1.1
        client is forwarded with its own chunk framing, untouched; otherwise each read's
        payload becomes one chunk (or raw bytes for an HTTP/1.0 client)."""
        client = self.client
        passthrough = head.chunked and client.chunked
        receive = conn.receive_chunked_raw if passthrough else partial(self._framed_payload, conn)
        headers = downstream_response_headers(head.headers, served_by=self.plan.upstream.served_by)
        out = b""
        while not out and not conn.body_done():
            out = await receive()
        self.status = head.status_code
        out = client.response_head(head.status_code, headers, reason=head.reason) + out
        if conn.body_done():
            await client.send(out + client.end_of_body())
            self._move(RelayState.DONE)
            return
        stream = self.info.stream
        await client.send(out, deadline.to_total if stream else None)
        self._move(RelayState.COMMITTED)
        gap = client.ctx.config.timeouts.request.streaming.chunk_interval
        fairness = Fairness()
        while True:
            await fairness.tick()
            if stream:
                deadline.within(gap, "timeouts.request.streaming.chunk_interval")
            out = await receive()
            if conn.body_done():
                await client.send(out + client.end_of_body())
                self._move(RelayState.DONE)
                return
            if out:
                # The gap limit is the upstream's: while a slow client makes us wait, only the
                # total applies.
                await client.send(out, deadline.to_total if stream else None)

    async def _framed_payload(self, conn: UpstreamConnection) -> bytes:
        part = await conn.receive_payload()
        if not part:
            return b""
        self._tail = (self._tail + part[-TAIL:])[-TAIL:]
        return self.client.frame(part)

    @property
    def at_event_boundary(self) -> bool:
        conn = self._conn
        tail = conn.tail if conn is not None and conn.tail else self._tail
        return ends_event(tail)

    async def _fail(self, err: SluiceError) -> None:
        if self.state is RelayState.WAITING:
            self._move(RelayState.ABORTED)
            raise err
        if self.state is RelayState.COMMITTED:
            self._move(RelayState.ABORTED)
            await self.client.send_error_event(err, at_boundary=self.at_event_boundary)
            return
        raise AssertionError(f"relay failure in state {self.state.value}")  # pragma: no cover


class _Timeout(Exception):
    def __init__(self, error: SluiceError) -> None:
        super().__init__(error.message)
        self.error = error


def error_event(err: SluiceError, at_boundary: bool) -> bytes:
    """One SSE event carrying the error, on a fresh event boundary."""
    prefix = b"" if at_boundary else b"\n\n"
    payload = json.dumps({"error": err.to_dict()}, separators=(",", ":")).encode()
    return prefix + b"data: " + payload + b"\n\n"
