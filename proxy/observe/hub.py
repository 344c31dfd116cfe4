"""The one in-process feed of what happens in the gateway (SPEC §9).

Owners of state publish here: the settle step of every request (a
:class:`~protocol.request_record.RequestRecord`), and the owners of node, circuit, settings,
notification and local-model state (a JSON-ready dict). The request log, the metrics and the
events WebSocket read from here and from nowhere else.

Publishing is a synchronous call of each subscriber of that event type (no task, no queue:
a subscriber that needs one keeps its own, bounded). With nobody subscribed to a type, a
publication is one dict lookup; :meth:`Hub.wants` lets a publisher skip building a payload
nobody will read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger("sluice.observe")

Callback = Callable[[str, float, Any], None]
"""``callback(type, at, data)``: ``at`` is the wall-clock time (seconds since the epoch)."""

# The event types of SPEC §9.3 (``hello`` and ``resync`` are made per subscriber).
TYPES = ("node", "circuit", "settings", "notification", "request", "stats", "model")


class Hub:
    __slots__ = ("_by_type",)

    def __init__(self) -> None:
        self._by_type: dict[str, list[Callback]] = {}

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
        """Hand ``data`` to every subscriber of ``kind``. A subscriber that raises is logged
        and does not stop the others (nor the publisher: the gateway goes on serving)."""
        callbacks = self._by_type.get(kind)
        if not callbacks:
            return
        at = time.time()
        for callback in tuple(callbacks):
            try:
                callback(kind, at, data)
            except Exception:
                log.exception("an observer of %r events failed", kind)


class RequestReader:
    """A reader of the hub's ``request`` events (the request log, the metrics): it gets
    each :class:`~protocol.request_record.RequestRecord` in :meth:`_on_request` between
    :meth:`attach` and :meth:`detach`."""

    __slots__ = ("_unsubscribe",)

    def __init__(self) -> None:
        self._unsubscribe: Callable[[], None] | None = None

    def attach(self, hub: Hub) -> None:
        """Read the hub's ``request`` events from now on."""
        self._unsubscribe = hub.subscribe(self._on_request, ("request",))

    def detach(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def _on_request(self, kind: str, at: float, record: Any) -> None:
        raise NotImplementedError
