"""``GET|PUT /api/v1/settings/aliases`` (SPEC §12): ``{"aliases": {name: target, ...}}``
in file order (the order decides which pattern wins).

A PUT gives the whole table: it replaces ``aliases:`` and keeps the order it was sent in.
It is read as config.yaml is at start (one converter, one validation), so a name or target
that is not a model id answers 422 with ``error.param`` = ``aliases.<name>`` and changes
nothing; a saved table applies to the next request (the exchange reads the live config).
"""

from __future__ import annotations

from typing import Any

from protocol.config.fields import ALIASES
from protocol.errors import ConfigError
from protocol.views import aliases_view
from proxy.api.call import Call
from proxy.api.settings_write import save_write


def get_aliases(call: Call) -> tuple[int, Any]:
    return 200, aliases_view(call.ctx.config)


async def put_aliases(call: Call) -> tuple[int, Any]:
    doc = call.json_object()
    ALIASES.check(doc)
    (table,) = ALIASES.names
    if table not in doc:
        raise ConfigError(table, "is required: the whole table, {name: target, ...}")
    return 200, aliases_view(await save_write(call, ALIASES, doc, what="the aliases"))
