"""The process figures of ``GET /metrics`` (SPEC §9.2): CPU seconds, resident memory, open
files and start time, as prometheus_client's :class:`~prometheus_client.ProcessCollector`
reads them from /proc and its ``generate_latest`` writes them; only SPEC's four names.

Imported by the first scrape (:class:`proxy.observe.metrics.Metrics`), not at start.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.metrics_core import Metric

NAMES = frozenset({"process_cpu_seconds", "process_resident_memory_bytes",
                   "process_open_fds", "process_start_time_seconds"})


class ProcessFigures:
    """The exposition text of the process figures, made anew at each call: its own
    registry holds this object as the one collector, which cuts prometheus_client's
    process collector to :data:`NAMES`."""

    def __init__(self) -> None:
        self._inner = ProcessCollector(registry=None)
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(self)  # a collector: it has collect()

    def __repr__(self) -> str:
        return "ProcessFigures()"

    def collect(self) -> Iterator[Metric]:
        return (m for m in self._inner.collect() if m.name in NAMES)

    def text(self) -> bytes:
        return generate_latest(self._registry)
