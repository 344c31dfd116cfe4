"""The report phase of a request (SPEC §9.1): its access-log line and, for the OpenAI API,
its :class:`~protocol.request_record.RequestRecord` on the hub.

Between two requests the exchange does one thing: :meth:`Reports.add` keeps the facts of
the moment it ended (the exchange itself, and what its connection's ``Downstream`` will
have forgotten by the next request). The line and the record are made from them in the
hub's next batch (:meth:`Reports.flush` is the hub's flusher, run first by every drain, so
a record reaches its readers before any later publication), where a tight loop over many
requests costs a fraction of the same work done between two of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import trio

from protocol.request_info import request_path
from protocol.request_record import RequestRecord

if TYPE_CHECKING:
    from proxy.observe.access_log import AccessLog
    from proxy.observe.hub import Hub

QUEUE_ERRORS = frozenset({"queue_full", "queue_timeout"})  # refused by the queue (SPEC §18)
BATCH_MAX = 512  # requests that make a batch go out at once


class Finished(Protocol):
    """What :meth:`Reports.add` reads of an exchange (:class:`proxy.exchange.Exchange`);
    none of it changes once the request has ended."""

    request: Any  # the h11.Request
    relay: Any  # the proxy.relay.Relay, or None when no upstream was asked
    outcome: str  # the request's, in the request log's words (decided by Exchange.decide)
    info: Any  # the protocol.request_info.RequestInfo of an OpenAI call, or None
    started: float  # trio clock
    wall: float  # the same moment, wall-clock
    peer: Any  # the proxy.exchange.Peer
    load_wait: float | None  # seconds it waited for a managed model's load, or None
    queue_ms: int | None  # ms it waited in the queue (SPEC §18), None when no model was asked
    priority: str | None  # its class in the queue, or None
    translation: Any  # the proxy.translated.Way of a Messages/Responses request, or None


class Reports:
    __slots__ = ("_access", "_hub", "_pending")

    def __init__(self, access: AccessLog, hub: Hub | None = None) -> None:
        self._access = access
        self._hub = hub
        self._pending: list[tuple[Any, ...]] = []
        if hub is not None:
            hub.add_flusher(self.flush)

    def __repr__(self) -> str:
        return f"Reports({len(self._pending)} waiting)"

    def add(self, exchange: Finished, response: Any, first_at: float | None, bytes_sent: int,
            error_code: str | None) -> None:
        """A request ended now, its outcome decided. ``response`` is its
        ``protocol.response.Response``; ``first_at`` (trio clock), ``bytes_sent`` and
        ``error_code`` are its ``Downstream``'s figures."""
        pending = self._pending
        pending.append((exchange, trio.current_time(), response, first_at, bytes_sent,
                        error_code))
        if self._hub is None:
            self.flush()
        elif len(pending) == 1:
            self._hub.wake()
        elif len(pending) >= BATCH_MAX:
            self._hub.drain()

    def flush(self) -> None:
        """Make and hand over the lines and records of the requests waiting."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        hub = self._hub if self._hub is not None and self._hub.wants("request") else None
        lines = self._access.enabled()
        written: list[tuple[float, tuple[Any, ...]]] = []
        for exchange, ended, response, first_at, bytes_sent, error_code in pending:
            request = exchange.request
            path = request_path(request.target)
            relay = exchange.relay
            served_by = None if relay is None else relay.plan.upstream.served_by.decode()
            status = response.status
            outcome = exchange.outcome
            started = exchange.started
            ttfb = None if first_at is None else max(first_at - started, 0.0)
            duration = max(ended - started, 0.0)
            at = exchange.wall + duration
            method = request.method.decode("latin-1")
            info = exchange.info
            model = None if info is None else info.model
            request_id = response.request_id.decode()
            if lines:
                written.append((at, (request_id, method, path, model, status, served_by, ttfb,
                                     duration, outcome)))
            if hub is not None and (info is not None or path.startswith("/v1/")):
                record = _record(exchange, request_id, method, path, model, served_by, status,
                                 outcome, ttfb, duration, bytes_sent, error_code)
                hub.deliver("request", at, record)
        if written:
            self._access.write_batch(written)


def _record(exchange: Finished, request_id: str, method: str, path: str, model: str | None,
            served_by: str | None, status: int, outcome: str, ttfb: float | None,
            duration: float, bytes_sent: int, error_code: str | None) -> RequestRecord:
    relay = exchange.relay
    attempts: tuple[tuple[str, str], ...] = ()
    failover = None
    events = None
    ttft = None
    usage_in: bytes | None = None
    usage_first: bytes | None = None
    timings_in: bytes | None = None
    affinity: str | None = None
    if relay is not None and served_by is not None:
        affinity = relay.plan.affinity
        attempts = ((served_by, outcome),)
        failed = relay.plan.failed
        if failed is not None:  # the first node tried failed (SPEC §7.4)
            failover = failed.fingerprint
            attempts = ((failed.served_by.decode(), "failure"), *attempts)
        observer = relay.observer
        if relay.first_event_at is not None:
            ttft = max(relay.first_event_at - exchange.started, 0.0)
        if observer is not None:
            events = observer.events
            usage_in = observer.usage_line
            if observer.first_usage_line != usage_in:
                usage_first = observer.first_usage_line
            timings_in = observer.timings_line
        else:
            usage_in = timings_in = relay.usage_in
    info = exchange.info
    queue_ms = exchange.queue_ms
    if queue_ms is None and info is not None:
        queue_ms = 0  # a model's request that never queued (the queue off)
    way = exchange.translation  # SPEC §17.1
    translated = None if way is None or not way.active else way.name
    return RequestRecord(
        id=request_id, started_at=exchange.wall, method=method, path=path, model=model,
        stream=bool(info is not None and info.stream),
        transport=exchange.peer.listener.transport,
        served_by=served_by, status=status, outcome=outcome, failover=failover, ttfb=ttfb,
        duration=duration, bytes_out=bytes_sent, events=events, usage=None, error=error_code,
        attempts=attempts, routed=relay is not None or error_code in QUEUE_ERRORS,
        usage_in=usage_in,
        usage_first=usage_first,
        load=exchange.load_wait, served_model=None if relay is None else relay.info.model,
        ttft=ttft, timings_in=timings_in, affinity=affinity,
        queue=None if queue_ms is None else queue_ms / 1000, priority=exchange.priority,
        translated=translated,
        usage_estimated=translated is not None and way.usage_estimated)

