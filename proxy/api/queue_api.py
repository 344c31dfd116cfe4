"""``GET /api/v1/queue`` (SPEC §18, admin: it names clients): each model's waiting
requests in serving order, its requests in flight and its slots."""

from __future__ import annotations

from typing import Any

from protocol.views import queue_view
from proxy.api.call import Call

PATH = "/api/v1/queue"


def show_queue(call: Call) -> tuple[int, Any]:
    return 200, queue_view(call.ctx.scheduler.snapshot())
