"""``GET /api/v1/requests`` (SPEC §9.1): the request log, newest first, filtered."""

from __future__ import annotations

from typing import Any

from protocol.errors import bad_request
from proxy.api.call import Call
from proxy.observe.request_log import MAX_LIMIT

FILTERS = ("limit", "model", "servedBy")


def list_requests(call: Call) -> tuple[int, Any]:
    """``?limit=N&model=M&servedBy=S``; an unknown parameter or a bad limit is a 400 naming
    it (so a typo never silently returns everything)."""
    params = call.params()
    for name in params:
        if name not in FILTERS:
            raise bad_request(f"unknown query parameter {name!r}; known: "
                              f"{', '.join(FILTERS)}", param=name)
    limit: int | None = None
    if "limit" in params:
        text = params["limit"]
        if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
            raise bad_request(f"limit must be a whole number from 1 to {MAX_LIMIT}",
                              param="limit")
        limit = int(text)
    entries = call.ctx.request_log.query(limit=limit, model=params.get("model"),
                                         served_by=params.get("servedBy"))
    return 200, {"requests": entries}
