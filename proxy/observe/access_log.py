"""The access log (SPEC §9.1): one INFO line per request on the ``sluice.access`` logger —
id, method, path, model, status, served by, time to first byte, duration, outcome; never a
header value, a query string or a body.

Through the logging machinery a line costs tens of µs in a busy gateway (a record object,
handler calls, a formatter), more than the rest of a small request's bookkeeping. So when
``sluice serve`` set up its log (:mod:`proxy.logsetup`), the line is made here, in the
log's own format, and handed straight to its buffered stderr (``sink``); otherwise (the
gateway run in-process, e.g. by tests) it goes through ``logging`` as any other record.
Either way the ``sluice.access`` logger's level decides whether it is written. A gateway
writes its lines in the hub's batches (:mod:`proxy.observe.reports`), not between two
requests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("sluice.access")

_MESSAGE = "%s %s %s model=%s status=%d served_by=%s ttfb=%s duration=%.1fms outcome=%s"


class AccessLog:
    __slots__ = ("_second", "_sink", "_stamp")

    def __init__(self, sink: Callable[[str], None] | None = None) -> None:
        self._sink = sink
        self._second = -1
        self._stamp = ""

    def __repr__(self) -> str:
        return f"AccessLog({'direct' if self._sink else 'logging'})"

    @staticmethod
    def enabled() -> bool:
        """The lines are written (the ``sluice.access`` logger's level)."""
        return log.isEnabledFor(logging.INFO)

    def write_batch(self, lines: list[tuple[float, tuple[Any, ...]]]) -> None:
        """Lines, in one write: each ``(at, (request_id, method, path, model, status,
        served_by, ttfb, duration, outcome))``, ``at`` wall-clock, ``ttfb`` and
        ``duration`` in seconds."""
        if self._sink is not None:
            self._sink("".join([self._line(at, args) for at, args in lines]))
            return
        for at, args in lines:
            self._emit(at, args)

    def _emit(self, at: float, args: tuple[Any, ...]) -> None:
        if self._sink is None:
            log.info(_MESSAGE, *_values(args))
        else:
            self._sink(self._line(at, args))

    def _line(self, at: float, args: tuple[Any, ...]) -> str:
        """The line as the log's formatter (proxy.logsetup) would make it."""
        second = int(at)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        return (f"{self._stamp},{int((at - second) * 1000):03d} INFO sluice.access: "
                + _MESSAGE % _values(args) + "\n")


def _values(args: tuple[Any, ...]) -> tuple[Any, ...]:
    rid, method, path, model, status, served_by, ttfb, duration, outcome = args
    return (rid, method, path, model or "-", status, served_by or "-",
            "-" if ttfb is None else f"{ttfb * 1000:.1f}ms", duration * 1000, outcome)
