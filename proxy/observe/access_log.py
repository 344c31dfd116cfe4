"""The access log (SPEC §9.1): one INFO line per request on the ``sluice.access`` logger —
id, method, path, model, status, served by, time to first byte, duration, outcome; never a
header value, a query string or a body.

Through the logging machinery a line costs tens of µs in a busy gateway (a record object,
handler calls, a formatter), more than the rest of a small request's bookkeeping. So when
``sluice serve`` set up its log (:mod:`proxy.logsetup`), the line is made here, in the
log's own format, and handed straight to its buffered stderr (``sink``); otherwise (the
gateway run in-process, e.g. by tests) it goes through ``logging`` as any other record.
Either way the ``sluice.access`` logger's level decides whether it is written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

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

    def write(self, request_id: str, method: str, path: str, model: str | None, status: int,
              served_by: str | None, ttfb: float | None, duration: float,
              outcome: str) -> None:
        """One request's line (``ttfb`` and ``duration`` in seconds)."""
        if not log.isEnabledFor(logging.INFO):
            return
        args = (request_id, method, path, model or "-", status, served_by or "-",
                "-" if ttfb is None else f"{ttfb * 1000:.1f}ms", duration * 1000, outcome)
        sink = self._sink
        if sink is None:
            log.info(_MESSAGE, *args)
            return
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        sink(f"{self._stamp},{int((now - second) * 1000):03d} INFO sluice.access: "
             + _MESSAGE % args + "\n")
