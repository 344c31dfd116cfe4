"""The queue's metrics (SPEC §18): ``sluice_queue_waiting{model,priority}`` (a gauge, read
from the :class:`~proxy.routing.scheduler.Scheduler` at scrape time),
``sluice_queue_wait_seconds{model,priority}`` (a histogram of the wait of every request that
took a ticket, fed from its request record) and ``sluice_queue_rejected_total{model,
reason}`` (``queue_full``, ``queue_timeout``: the error codes it answered). Written by
:class:`proxy.observe.metrics.Metrics` with its own label rules."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import TYPE_CHECKING

from protocol.queue_order import CLASSES
from proxy.observe.exposition import Exposition, bucket_labels, label_set
from proxy.observe.reports import QUEUE_ERRORS

if TYPE_CHECKING:
    from protocol.request_record import RequestRecord
    from proxy.routing.scheduler import Scheduler

# From no wait to timeouts.request.queue's limit (1h).
WAIT_BUCKETS: tuple[float, ...] = (
    0.001, 0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
_WAIT_LES = bucket_labels(WAIT_BUCKETS)


class QueueFigures:
    """The counted part, and the scrape of all three."""

    __slots__ = ("_rejected", "_waits")

    def __init__(self) -> None:
        self._waits: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
        self._rejected: dict[tuple[str, str], int] = {}

    def __repr__(self) -> str:
        return f"QueueFigures({len(self._waits)} series)"

    def add(self, record: RequestRecord, model: str) -> None:
        """One finished request (``model``: its label)."""
        priority = record.priority
        if priority is None or record.queue is None:
            return  # it took no ticket (the queue off, or not a model's request)
        series = self._waits.get((model, priority))
        if series is None:
            series = self._waits[model, priority] = ([0] * len(_WAIT_LES), [0.0])
        series[0][bisect_left(WAIT_BUCKETS, record.queue)] += 1
        series[1][0] += record.queue
        if record.error in QUEUE_ERRORS:
            key = (model, record.error)
            self._rejected[key] = self._rejected.get(key, 0) + 1

    def render(self, out: Exposition, scheduler: Scheduler | None,
               label: Callable[[str], str]) -> None:
        out.family("sluice_queue_waiting", "gauge",
                   "Requests waiting in the queue for a free slot now.")
        if scheduler is not None:
            for model, counts in sorted(scheduler.waiting().items()):
                for priority in CLASSES:
                    out.sample("sluice_queue_waiting", label_set(
                        ("model", label(model)), ("priority", priority)), counts[priority])
        out.family("sluice_queue_wait_seconds", "histogram",
                   "Time requests waited in the queue before they were sent or refused.")
        for (model, priority), (buckets, total) in sorted(self._waits.items()):
            out.histogram("sluice_queue_wait_seconds",
                          label_set(("model", model), ("priority", priority)), _WAIT_LES,
                          buckets, total[0])
        out.family("sluice_queue_rejected_total", "counter",
                   "Requests the queue refused: queue_full (429) or queue_timeout (504).")
        for (model, reason), count in sorted(self._rejected.items()):
            out.sample("sluice_queue_rejected_total",
                       label_set(("model", model), ("reason", reason)), count)
