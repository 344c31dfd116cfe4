"""Notifications: things the user should know about the running gateway (SPEC §4, §8),
shown by ``GET /api/v1/notifications`` and ``sluice status`` and logged once (at WARNING;
at INFO for those of level ``info``).

Each change is also a ``notification`` event on the hub (SPEC §9.3): a raised (or replaced)
notification is its entry ``{code, level, message, createdAt}``; a cleared one is
``{code, cleared: true}``.
"""

from __future__ import annotations

import logging
from typing import Any

from proxy.observe.hub import Hub
from proxy.timestamps import now_iso

log = logging.getLogger("sluice.notifications")


class Notifications:
    """The current notifications, one per ``code`` (raising a code again replaces it)."""

    def __init__(self, hub: Hub | None = None) -> None:
        self._items: dict[str, dict[str, Any]] = {}
        self._hub = hub

    def __repr__(self) -> str:
        return f"Notifications({sorted(self._items)})"

    def raise_(self, code: str, message: str, *, level: str = "warning") -> None:
        if self._items.get(code, {}).get("message") != message:
            log.log(logging.INFO if level == "info" else logging.WARNING, "%s", message)
        item = self._items[code] = {"code": code, "level": level, "message": message,
                                    "createdAt": now_iso()}
        if self._hub is not None and self._hub.wants("notification"):
            self._hub.publish("notification", dict(item))

    def clear(self, code: str) -> None:
        if self._items.pop(code, None) is not None and self._hub is not None:
            self._hub.publish("notification", {"code": code, "cleared": True})

    def all(self) -> list[dict[str, Any]]:
        return list(self._items.values())


RESTART_CODE = "restart_required"


def restart_pending(notifications: Notifications) -> bool:
    """A change that needs a restart was saved since this gateway started."""
    return any(n["code"] == RESTART_CODE for n in notifications.all())


def notify_restart(notifications: Notifications, fields: list[str] | tuple[str, ...]) -> None:
    """Saved changes of fields that apply at the next start (none: nothing to say): a
    settings write, a restore or a hand edit of config.yaml."""
    if fields:
        notifications.raise_(
            RESTART_CODE, f"settings changed that apply at the next start ({', '.join(fields)})"
                          ": restart sluice to apply them", level="info")
