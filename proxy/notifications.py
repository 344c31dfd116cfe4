"""Notifications: things the user should know about the running gateway (SPEC §4, §8),
shown by ``GET /api/v1/notifications`` and ``sluice status`` and logged once at WARNING."""

from __future__ import annotations

import logging
from typing import Any

from proxy.timestamps import now_iso

log = logging.getLogger("sluice.notifications")


class Notifications:
    """The current notifications, one per ``code`` (raising a code again replaces it)."""

    def __init__(self) -> None:
        self._items: dict[str, dict[str, Any]] = {}

    def __repr__(self) -> str:
        return f"Notifications({sorted(self._items)})"

    def raise_(self, code: str, message: str, *, level: str = "warning") -> None:
        if self._items.get(code, {}).get("message") != message:
            log.warning("%s", message)
        self._items[code] = {"code": code, "level": level, "message": message,
                             "createdAt": now_iso()}

    def clear(self, code: str) -> None:
        self._items.pop(code, None)

    def all(self) -> list[dict[str, Any]]:
        return list(self._items.values())
