"""``GET|PUT /api/v1/settings/api`` (SPEC §8): the API server and local socket settings.

``requireAuth`` applies at once; ``enabled``, ``port``, ``allowExternalAccess`` and
``socketDir`` take effect at the next start (their fields in
:data:`protocol.config.fields.API` say ``restart``), so an answer that changed one of them
says ``restartRequired: true`` (and a notification says so until the gateway restarts).
"""

from __future__ import annotations

from typing import Any

from protocol.config import Config
from protocol.config.changes import restart_changes
from protocol.config.fields import API
from protocol.views import api_view
from proxy.api.call import Call
from proxy.api.settings_write import save_write
from proxy.notifications import notify_restart, restart_pending


def _pin(call: Call) -> str | None:
    identity = call.ctx.identity
    return None if identity is None else identity.fingerprint


def get_api(call: Call) -> tuple[int, Any]:
    return 200, api_view(call.ctx.config, restart_pending(call.ctx.notifications), _pin(call))


async def put_api(call: Call) -> tuple[int, Any]:
    """Any subset of the fields, saved all at once, or nothing changes (422 naming the
    dotted YAML path; 500 when the file cannot be written)."""
    doc = call.json_object()
    ctx = call.ctx
    changed: list[str] = []

    def seen(old: Config, new: Config) -> None:
        changed[:] = restart_changes(old, new)

    stored = await save_write(call, API, doc, seen=seen)
    notify_restart(ctx.notifications, changed)
    return 200, api_view(stored, bool(changed) or restart_pending(ctx.notifications),
                         _pin(call))
