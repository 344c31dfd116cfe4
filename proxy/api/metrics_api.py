"""``GET /metrics`` (SPEC §9.2): the Prometheus text exposition of :mod:`proxy.observe.metrics`."""

from __future__ import annotations

from typing import Any

from proxy.api.call import Body, Call
from proxy.observe.metrics import CONTENT_TYPE


def scrape(call: Call) -> tuple[int, Any]:
    return 200, Body(CONTENT_TYPE, call.ctx.metrics.render())
