"""The streaming pipe between one client request and one upstream answer (SPEC §6).

The answer is committed to the client with the first body chunk; before that a failure is an
error response in the request family's shape (raised for the exchange to send), after it one
error event in that shape and the connection closes. The relay writes only to an AnswerSink
(the client's Downstream, or an OllamaOut or TranslatedOut writing another API's answer) and
keeps no client-side state: the request's :class:`protocol.response.Response` says whether
anything was sent.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from math import inf
from typing import TYPE_CHECKING

import trio

from protocol.errors import (
    SluiceError,
    shutting_down,
    upstream_bad_response,
    upstream_timeout,
    upstream_unreachable,
)
from protocol.headers import (
    Header,
    downstream_response_headers,
    is_event_stream,
    upstream_request_headers,
)
from protocol.http1 import ResponseHead
from protocol.request_info import RequestInfo, total_timeout
from protocol.request_record import reused_tokens
from protocol.response import State
from protocol.sse import TAIL, SseObserver, ends_event
from proxy.deadline import FIRST_BYTE_LIMIT, Deadline, GapWatch, RequestScope
from proxy.errors import ClientGone
from proxy.link.sockio import Fairness
from proxy.upstream.connection import UpstreamConnection, UpstreamFailure
from proxy.upstream.pool import ConnectionPool, exchange

if TYPE_CHECKING:
    from protocol.config import TimeoutsConfig
    from proxy.downstream import AnswerSink
    from proxy.routing.router import Plan

log = logging.getLogger("sluice.relay")

MAX_WHOLE_BODY = 256 * 1024 * 1024  # a non-streamed answer larger than this is refused
CHUNK_LIMIT = "timeouts.request.streaming.chunk_interval"


class Relay:
    """Runs one request to its upstream (failing over once to another node when the plan
    allows) and writes the answer to ``out``. ``path`` is for the failover log only;
    ``on_answer(relay)`` runs when the answer was read whole, before its end is relayed."""

    def __init__(self, plan: Plan, method: bytes, target: bytes, path: str,
                 headers: list[Header], body: bytes, info: RequestInfo, *, out: AnswerSink,
                 scope: RequestScope, connections: ConnectionPool, timeouts: TimeoutsConfig,
                 on_answer: Callable[[Relay], None] | None = None,
                 missing: Callable[[Relay], bool] | None = None) -> None:
        self.plan = plan
        self.method = method
        self.target = target
        self.path = path
        self.headers = headers
        self.body = body
        self.info = info
        self.out = out
        self.scope = scope
        self.connections = connections
        self.timeouts = timeouts
        self.on_answer = on_answer
        self.missing = missing  # SPEC §17.1's safety net (proxy.translated.Way.missing)
        self.status = 0  # the status relayed to the client
        self.interrupted = False  # cancelled from outside (shutdown)
        self.observer: SseObserver | None = None  # an SSE answer's events and usage
        self.usage_in: bytes | None = None  # a whole answer's body, for its usage object
        self.first_event_at: float | None = None  # an SSE answer's first data event (ttft)
        self._tail = b""  # last payload bytes sent, when not passing chunked framing through
        self._conn: UpstreamConnection | None = None

    def __repr__(self) -> str:
        return f"Relay({self.plan!r}, {self.info!r}, {self.out.response!r})"

    def cached_tokens(self) -> int | None:
        """The prompt tokens the upstream says it reused (SPEC §15); parsed on demand."""
        return reused_tokens(self.observer, self.usage_in)

    @property
    def done(self) -> bool:
        """The whole answer reached the client."""
        return self.out.response.state is State.DONE

    @property
    def delivered(self) -> bool:
        """An SSE answer's last event (:attr:`SseObserver.ended`) was relayed: a client that
        leaves then (the OpenAI SDKs at ``[DONE]``, the Codex CLI at ``response.completed``,
        before the body's last chunk) got the whole answer."""
        observer = self.observer
        return (observer is not None and observer.ended
                and self.out.response.state is State.STREAMING)

    @property
    def unanswered(self) -> bool:
        """The client has nothing it would read as an answer: no byte, or (SSE) only
        keep-alive comments, ending on an event boundary; so the request may still fail over,
        the next node's stream going on after them."""
        response = self.out.response
        if not response.started:
            return True
        observer = self.observer
        return (response.state is State.STREAMING and observer is not None
                and not observer.events and self.at_event_boundary)

    async def run(self) -> None:
        """Relay the exchange. Raises SluiceError only while nothing was sent, ClientGone
        when the client left."""
        try:
            await self._run()
        except UpstreamFailure as failure:
            err = (upstream_unreachable if failure.connection_error
                   else upstream_bad_response)(str(failure))
            await self._fail(err)
        except _Timeout as timeout:
            await self._fail(timeout.error)
        except trio.Cancelled:
            self.interrupted = True
            if self.out.closing and self.out.response.state is State.STREAMING:
                # The drain deadline (SPEC: streams are cut with the SSE error event).
                with trio.CancelScope(shield=True, deadline=trio.current_time() + 1):
                    try:
                        await self.out.error_event(shutting_down(),
                                                   at_boundary=self.at_event_boundary)
                    except ClientGone:
                        pass
            raise
        finally:
            conn = self._conn
            if conn is not None:
                self._conn = None
                if self.done:
                    self.connections.release(conn)
                else:
                    conn.close()

    def _fail_over(self, why: str) -> bool:
        """Before the client got anything it would read (:attr:`unanswered`): the next node."""
        plan = self.plan
        if not plan.may_fail_over:
            return False
        failed = plan.upstream.served_by
        if not plan.alternate(trio.current_time()):
            return False
        # A 5xx failover re-runs a request the first node may have worked on: say so.
        log.warning("failover: %s failed (%s); %s %s sent again to %s", failed.decode(), why,
                    self.method.decode("latin-1"), self.path, plan.upstream.served_by.decode())
        conn = self._conn
        if conn is not None:
            self._conn = None
            conn.close()
        self._tail = b""
        return True

    async def _run(self) -> None:
        timeouts = self.timeouts
        info = self.info
        total, total_limit = total_timeout(timeouts, info)
        total_at = trio.current_time() + total
        if info.stream:  # the wait for the head, then for the first data event
            answer = (timeouts.request.streaming.first_byte, FIRST_BYTE_LIMIT)
        else:
            answer = (total, total_limit)
        plan = self.plan
        while True:
            upstream = plan.upstream
            address = upstream.address
            if address is None:  # a managed server that died a moment ago
                raise UpstreamFailure("the model server is restarting", connect=True)
            # One scope per attempt, all with the same total: its deadline moves between the
            # limits, and the connection cancels it if the client leaves.
            with self.scope.open() as scope:
                deadline = Deadline(scope, total_at, total_limit, total,
                                    connect=timeouts.connection, answer=answer)
                headers = upstream_request_headers(
                    self.headers, authority=address.authority, body_length=len(self.body),
                    api_key=upstream.api_key, forwarded_by=upstream.forwarded_by)
                try:
                    conn, head = await exchange(
                        self.connections, address, self.method, address.target(self.target),
                        headers, self.body, on_connecting=deadline.connecting,
                        on_connected=deadline.connected)
                except UpstreamFailure as failure:
                    if self._fail_over(str(failure)):
                        continue
                    raise
                if (self.missing is not None and head.status_code in (404, 405)
                        and not self.out.response.started and self.missing(self)):
                    conn.close()  # sent again translated: target, body and out switched
                    continue
                sse = is_event_stream(head.headers)
                if not sse or head.status_code >= 300:  # a stream's, at its first data event
                    plan.attempt.answered(trio.current_time())
                self._conn = conn
                if head.status_code >= 500 and self._fail_over(
                        f"it answered {head.status_code}"):
                    continue
                if self.out.response.started and (not sse or head.status_code >= 300):
                    # A failover after keep-alive comments: only a stream can go on with them.
                    kind = "an event stream" if sse else "a whole answer"
                    raise UpstreamFailure(
                        f"{upstream.served_by.decode()} answered {head.status_code} with {kind}"
                        ", which cannot follow the keep-alive comments already relayed",
                        responded=True)
                try:
                    if sse or (info.stream and head.content_length is None):
                        await self._relay_stream(conn, head, deadline)
                    else:
                        await self._relay_whole(conn, head)
                except UpstreamFailure as failure:
                    # Before the client got anything it would read (no byte, or only
                    # keep-alive comments): another node may still answer.
                    if self.unanswered and self._fail_over(str(failure)):
                        continue
                    raise
                return
            # Only reached when the scope was cancelled: by the client leaving, or a deadline.
            if self.scope.cancelled:
                raise ClientGone
            if deadline.connect_phase:
                if self._fail_over("it did not accept the connection within "
                                   f"timeouts.connection ({timeouts.connection:g}s)"):
                    continue
                raise _Timeout(deadline.error("could not connect to the upstream"))
            if not self.out.response.started:
                phase = "the upstream sent nothing"
            elif deadline.limit == FIRST_BYTE_LIMIT:
                phase = "the upstream sent no event with data"
            else:
                phase = "the upstream stalled"
            raise _Timeout(deadline.error(phase))

    async def _relay_whole(self, conn: UpstreamConnection, head: ResponseHead) -> None:
        body = await conn.receive_body(MAX_WHOLE_BODY)
        plan = self.plan
        headers = downstream_response_headers(head.headers, served_by=plan.upstream.served_by,
                                              affinity=plan.affinity_header)
        self.status = head.status_code
        if head.status_code < 300:
            self.usage_in = body
        if self.on_answer is not None:
            self.on_answer(self)
        await self.out.send_whole(head.status_code, headers, body, reason=head.reason)

    async def _relay_stream(self, conn: UpstreamConnection, head: ResponseHead,
                            deadline: Deadline) -> None:
        """Forward the body as it arrives. A chunked upstream body going to an HTTP/1.1
        client is forwarded with its own chunk framing, untouched; otherwise each read's
        payload becomes one chunk (or raw bytes for an HTTP/1.0 client).

        An SSE answer's keep-alive comments before its first data event are relayed as they
        come but are not its first byte for the time limits (SPEC §3.2): ``first_byte`` (a
        stream's; else the total) still bounds the wait for that event, and only from it
        on does ``chunk_interval`` bound the gaps. After a failover from a node that had
        sent only such comments, this node's stream goes on after them (no second head)."""
        out = self.out
        passthrough = head.chunked and out.chunked
        receive = conn.receive_chunked_raw if passthrough else partial(self._framed_payload, conn)
        resumed = out.response.started
        if not resumed:
            on_end = None if self.on_answer is None else partial(self.on_answer, self)
            self.observer = SseObserver(on_end) if is_event_stream(head.headers) else None
        observer = self.observer
        self.status = head.status_code
        data = b""
        while not data and not conn.body_done():
            data = await receive()
        if observer is not None:
            observer.see(data)
        # The gap limit is the upstream's: a slow client's wait counts against the total only.
        stream = self.info.stream
        on_block = deadline.to_total if stream else None
        end = conn.body_done()
        held = deadline.held()
        if resumed:
            await (out.end(data, on_block) if end else out.send_body(data, on_block))
        else:
            plan = self.plan
            headers = downstream_response_headers(head.headers,
                                                  served_by=plan.upstream.served_by,
                                                  affinity=plan.affinity_header)
            await out.send_head(head.status_code, headers, head.reason, data, end=end,
                                on_block=on_block)
        if observer is not None and observer.events:
            self._first_event()
        if end:
            return
        if observer is not None and not observer.events:
            deadline.resume(held)
            if not await self._comments(conn, receive, observer, deadline):
                return
        if stream:
            deadline.to_total()  # the gap between reads is watched by _relay_body
            await self._relay_body(conn, receive, observer,
                                   self.timeouts.request.streaming.chunk_interval)
        else:
            await self._relay_body(conn, receive, observer, inf)

    async def _comments(self, conn: UpstreamConnection, receive: Callable[[], Awaitable[bytes]],
                        observer: SseObserver, deadline: Deadline) -> bool:
        """Relay what comes before the first data event (keep-alive comments) under the
        attempt's deadline as it stands; False when the body ended first."""
        out = self.out
        while True:
            data = await receive()
            observer.see(data)
            if conn.body_done():
                await out.end(data, deadline.to_total)
                if observer.events:
                    self._first_event()
                return False
            if data:
                held = deadline.held()
                await out.send_body(data, deadline.to_total)
                deadline.resume(held)
            if observer.events:
                self._first_event()
                return True

    def _first_event(self) -> None:
        """The first data event was sent to the client: the time to first token (never
        before the first byte), and the upstream's answer time for the routing stats (a
        keep-alive comment is not an answer)."""
        now = trio.current_time()
        self.first_event_at = now
        if self.status < 300:  # else answered at its head
            self.plan.attempt.answered(now)

    async def _relay_body(self, conn: UpstreamConnection, receive: Callable[[], Awaitable[bytes]],
                          observer: SseObserver | None, gap: float) -> None:
        """The rest of the body, read by read. ``gap`` (a stream's chunk_interval, else inf)
        bounds each wait for the upstream's next bytes; raises _Timeout past it.

        The gap is watched without a deadline change per read, which at thousands of held
        streams is a good part of a chunk's cost: :class:`GapWatch`'s scope ends one gap
        after the read it was armed at; when that comes early (bytes came since), it is armed
        again from the latest read, so a stall still ends exactly one gap after it began."""
        out = self.out
        fairness = Fairness()
        watch = GapWatch(gap, trio.current_time())
        while True:
            with watch.scope:
                while True:
                    await fairness.tick()
                    data = await receive()
                    if observer is not None:
                        observer.see(data)
                    if conn.body_done():
                        await out.end(data, watch.on_block)
                        return
                    if data:
                        await out.send_body(data, watch.on_block)
                    watch.ready(trio.current_time())
            if not watch.rearm():
                raise _Timeout(upstream_timeout(
                    f"the upstream stalled within {CHUNK_LIMIT} ({gap:g}s)"))

    async def _framed_payload(self, conn: UpstreamConnection) -> bytes:
        part = await conn.receive_payload()
        if not part:
            return b""
        self._tail = (self._tail + part[-TAIL:])[-TAIL:]
        return self.out.frame(part)

    @property
    def at_event_boundary(self) -> bool:
        conn = self._conn
        tail = conn.tail if conn is not None and conn.tail else self._tail
        return ends_event(tail)

    async def _fail(self, err: SluiceError) -> None:
        state = self.out.response.state
        if state is State.IDLE:
            raise err
        if state is State.STREAMING:
            await self.out.error_event(err, at_boundary=self.at_event_boundary)
            return
        if state is State.BROKEN:  # cut in the middle of a write: nothing more can be said
            return
        raise AssertionError(f"relay failure with the answer {state.value}")  # pragma: no cover


class _Timeout(Exception):
    def __init__(self, error: SluiceError) -> None:
        super().__init__(error.message)
        self.error = error
