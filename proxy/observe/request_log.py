"""The request log (SPEC §9.1): the last ``observability.request_log_size`` finished
requests, newest first, read by ``GET /api/v1/requests``. Fed by the hub's ``request``
events only; follows the setting live (a smaller size drops the oldest at once, 0 turns the
log off)."""

from __future__ import annotations

import itertools
import os
from collections import deque
from typing import TYPE_CHECKING, Any

from protocol.request_record import RequestRecord
from proxy.observe.hub import RequestReader

if TYPE_CHECKING:
    from protocol.config import Config

MAX_LIMIT = 10_000  # entries one GET may ask for


class RequestLog(RequestReader):
    """The ring of finished requests, and the maker of request ids: ``<6 hex>-<n>``, the
    prefix random per gateway run so that ids in logs of different runs do not collide."""

    __slots__ = ("_count", "_entries", "_prefix")

    def __init__(self, size: int) -> None:
        super().__init__()
        self._entries: deque[RequestRecord] = deque(maxlen=size)
        self._prefix = os.urandom(3).hex() + "-"
        self._count = itertools.count(1)

    def next_id(self) -> bytes:
        """A new request id (sent as ``x-sluice-request-id``)."""
        return f"{self._prefix}{next(self._count)}".encode()

    def __repr__(self) -> str:
        return f"RequestLog({len(self._entries)}/{self._entries.maxlen})"

    def __len__(self) -> int:
        return len(self._entries)

    def _on_request(self, kind: str, at: float, record: RequestRecord) -> None:
        if self._entries.maxlen:
            record.find_usage()  # kept for long: not with the answer's bytes
            self._entries.append(record)

    def resize(self, size: int) -> None:
        """Keep at most ``size`` entries (the newest)."""
        if size != self._entries.maxlen:
            self._entries = deque(self._entries, maxlen=size)

    def follow(self, config: Config) -> None:
        """A settings subscriber: apply ``observability.request_log_size``."""
        self.resize(config.observability.request_log_size)

    def query(self, *, limit: int | None = None, model: str | None = None,
              served_by: str | None = None) -> list[dict[str, Any]]:
        """Newest first; ``model`` and ``served_by`` match exactly."""
        self.catch_up()
        out: list[dict[str, Any]] = []
        cap = MAX_LIMIT if limit is None else min(limit, MAX_LIMIT)
        if cap <= 0:
            return out
        for record in reversed(self._entries):
            if model is not None and record.model != model:
                continue
            if served_by is not None and record.served_by != served_by:
                continue
            out.append(record.to_json())
            if len(out) >= cap:
                break
        return out
