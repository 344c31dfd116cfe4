"""One model-list probe (``GET /v1/models`` within a timeout), shared by the health checks
of local backends and of network nodes."""

from __future__ import annotations

from typing import Any

import trio

from protocol.openai import parse_model_list
from protocol.upstream_url import UpstreamAddress
from proxy.upstream.connection import UpstreamFailure
from proxy.upstream.pool import ConnectionPool, fetch


class ModelProbe:
    """What one probe found: the HTTP status (None when there was no answer), the model
    entries (on 200), an error text (None when all went well) and the latency."""

    __slots__ = ("error", "failure", "latency_ms", "models", "status")

    def __init__(self, status: int | None, models: list[dict[str, Any]], error: str | None,
                 latency_ms: float | None, failure: UpstreamFailure | None = None) -> None:
        self.status = status
        self.models = models
        self.error = error
        self.latency_ms = latency_ms
        self.failure = failure  # why no answer came, when the connection failed

    def __repr__(self) -> str:
        return f"ModelProbe(status={self.status}, models={len(self.models)}, error={self.error!r})"


async def probe_models(connections: ConnectionPool, address: UpstreamAddress, *,
                       api_key: str | None, timeout: float) -> ModelProbe:
    started = trio.current_time()
    status: int | None = None
    models: list[dict[str, Any]] = []
    error: str | None = None
    failure: UpstreamFailure | None = None
    with trio.move_on_after(timeout) as scope:
        try:
            status, body = await fetch(connections, address, b"/v1/models", api_key=api_key)
            if status == 200:
                models = parse_model_list(body)
            else:
                error = f"GET /v1/models answered {status}"
        except UpstreamFailure as exc:
            error, failure = str(exc), exc
        except ValueError as exc:
            error = f"GET /v1/models gave no model list: {exc}"
    if scope.cancelled_caught:
        status, models = None, []
        error = f"GET /v1/models did not answer within {timeout:g}s"
    latency = (trio.current_time() - started) * 1000 if error is None else None
    return ModelProbe(status, models, error, latency, failure)
