"""``/api/v1/settings/history`` (SPEC §13): the versions of config.yaml that changes
replaced, and restoring one.

``GET`` lists ``[{id, at, source, sections}]``, newest first; ``POST
.../history/{id}/restore`` (admin) applies that version as it was written — validated as at
start (422 naming the field when it is not valid today), written atomically, live — and the
file it replaces is kept in turn (``source: "restore"``), so a restore can be undone the
same way. An unknown id answers 404.
"""

from __future__ import annotations

from typing import Any

import trio

from protocol.config.changes import changed_sections, restart_changes
from protocol.errors import no_such_item, not_found
from proxy.api.call import Call, saving
from proxy.notifications import notify_restart

PATH = "/api/v1/settings/history"
PREFIX = PATH + "/"
_RESTORE = "/restore"


async def list_history(call: Call) -> tuple[int, Any]:
    entries = await trio.to_thread.run_sync(call.ctx.settings.file.history.entries)
    return 200, [e.to_json() for e in entries]


async def restore(call: Call) -> tuple[int, Any]:
    rest = call.path[len(PREFIX):]
    if not rest.endswith(_RESTORE) or "/" in rest[:-len(_RESTORE)]:
        raise not_found(f"no such endpoint: {call.path}")
    version = rest[:-len(_RESTORE)]
    ctx = call.ctx
    before = ctx.config
    with saving("the restored config.yaml"):
        restored = await ctx.settings.restore(version)  # ConfigError (422) changes nothing
    if restored is None:
        raise no_such_item("config.yaml version", "id", version)
    restart = restart_changes(before, restored)
    notify_restart(ctx.notifications, restart)
    return 200, {"id": version, "restored": True,
                 "sections": list(changed_sections(before, restored)),
                 "restartRequired": bool(restart)}
