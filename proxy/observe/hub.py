"""The one in-process feed of what happens in the gateway (SPEC §9).

Owners of state publish here: the settle step of every request (a
:class:`~protocol.request_record.RequestRecord`), and the owners of node, circuit, settings,
notification and local-model state (a JSON-ready dict). The request log, the metrics and the
events WebSocket read from here and from nowhere else.

Publishing is a synchronous call of each subscriber of that event type (no task, no queue:
a subscriber that needs one keeps its own, bounded). With nobody subscribed to a type, a
publication is one dict lookup; :meth:`Hub.wants` lets a publisher skip building a payload
nobody will read.

The hot path hands its work over instead: a reader with batched work (the report phase of
requests, :mod:`proxy.observe.reports`) registers a flusher (:meth:`Hub.add_flusher`) and
wakes the hub (:meth:`Hub.wake`); :meth:`Hub.run` runs the flushers at most
:data:`BATCH_DELAY` later, where a tight loop over many requests costs a fraction of what
the same work costs done between two requests (cold caches). Every drain runs the flushers
first, before any later publication and before any reader answers (:meth:`Hub.drain`), so
order and answers stay exact.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import trio

from proxy.timestamps import wall

log = logging.getLogger("sluice.observe")

Callback = Callable[[str, float, Any], None]
"""``callback(type, at, data)``: ``at`` is the wall-clock time (seconds since the epoch)."""

# The event types of SPEC §9.3 (``hello`` and ``resync`` are made per subscriber).
TYPES = ("node", "circuit", "settings", "notification", "request", "stats", "model",
         "pairing", "discovered", "queue")


BATCH_DELAY = 0.05  # seconds batched work (a flusher's) may wait


class Hub:
    __slots__ = ("_by_type", "_flushers", "_wake")

    def __init__(self) -> None:
        self._by_type: dict[str, list[Callback]] = {}
        self._flushers: list[Callable[[], None]] = []  # run first by every drain
        self._wake: trio.Event | None = None

    def __repr__(self) -> str:
        counts = {t: len(c) for t, c in self._by_type.items() if c}
        return f"Hub({counts})"

    def subscribe(self, callback: Callback, types: Iterable[str] = TYPES) -> Callable[[], None]:
        """Call ``callback`` for every publication of one of ``types``; returns the
        unsubscriber."""
        chosen = tuple(types)
        for kind in chosen:
            self._by_type.setdefault(kind, []).append(callback)

        def unsubscribe() -> None:
            for kind in chosen:
                callbacks = self._by_type.get(kind, [])
                if callback in callbacks:
                    callbacks.remove(callback)

        return unsubscribe

    def wants(self, kind: str) -> bool:
        """Somebody reads events of this type."""
        return bool(self._by_type.get(kind))

    def publish(self, kind: str, data: Any) -> None:
        """Hand ``data`` to every subscriber of ``kind`` now (after the batched work). A
        subscriber that raises is logged and does not stop the others (nor the publisher:
        the gateway goes on serving)."""
        self.drain()
        if self._by_type.get(kind):
            self._deliver(kind, wall(), data)

    def deliver(self, kind: str, at: float, data: Any) -> None:
        """Like :meth:`publish`, for a flusher: without draining first, with its own
        ``at`` (when it happened)."""
        if self._by_type.get(kind):
            self._deliver(kind, at, data)

    def wake(self) -> None:
        """A flusher has work waiting for the next batch."""
        if self._wake is not None:
            self._wake.set()

    def add_flusher(self, flush: Callable[[], None]) -> None:
        """Run ``flush`` in every drain (a reader's own batched work)."""
        self._flushers.append(flush)

    def drain(self) -> None:
        """Do all the batched work, in order, now."""
        for flush in self._flushers:
            try:
                flush()
            except Exception:
                log.exception("an observer's flush failed")

    def _deliver(self, kind: str, at: float, data: Any) -> None:
        for callback in tuple(self._by_type[kind]):
            try:
                callback(kind, at, data)
            except Exception:
                log.exception("an observer of %r events failed", kind)

    async def run(self) -> None:
        """Deliver the batches, until cancelled (then the last one)."""
        try:
            while True:
                self._wake = trio.Event()
                await self._wake.wait()
                await trio.sleep(BATCH_DELAY)
                self.drain()
        finally:
            self._wake = None
            self.drain()


class RequestReader:
    """A reader of the hub's ``request`` events (the request log, the metrics): it gets
    each :class:`~protocol.request_record.RequestRecord` in :meth:`_on_request` between
    :meth:`attach` and :meth:`detach`; :meth:`catch_up` before it answers anything."""

    __slots__ = ("_hub", "_unsubscribe")

    def __init__(self) -> None:
        self._unsubscribe: Callable[[], None] | None = None
        self._hub: Hub | None = None

    def attach(self, hub: Hub) -> None:
        """Read the hub's ``request`` events from now on."""
        self._hub = hub
        self._unsubscribe = hub.subscribe(self._on_request, ("request",))

    def detach(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._hub = None

    def catch_up(self) -> None:
        """Take in the requests whose records wait for their batch."""
        if self._hub is not None:
            self._hub.drain()

    def _on_request(self, kind: str, at: float, record: Any) -> None:
        raise NotImplementedError
