"""``GET|PUT /api/v1/settings/aliases`` (SPEC §12): ``{"aliases": {name: target, ...}}``
in file order (the order decides which pattern wins).

A PUT gives the whole table: it replaces ``aliases:`` and keeps the order it was sent in.
It is read as config.yaml is at start (one converter, one validation), so a name or target
that is not a model id answers 422 with ``error.param`` = ``aliases.<name>`` and changes
nothing; a saved table applies to the next request (the exchange reads the live config).
"""

from __future__ import annotations

from typing import Any

import attrs

from protocol.config import Config, structure_config
from protocol.errors import ConfigError
from proxy.api.call import Call, saving

FIELD = "aliases"


def aliases_view(cfg: Config) -> dict[str, Any]:
    """The GET body (also the ``settings`` event of section ``aliases``)."""
    return {FIELD: cfg.aliases.as_dict()}


def get_aliases(call: Call) -> tuple[int, Any]:
    return 200, aliases_view(call.ctx.config)


async def put_aliases(call: Call) -> tuple[int, Any]:
    doc = call.json_object()
    for field in doc:
        if field != FIELD:
            raise ConfigError(field, f"unknown field; expected {FIELD}")
    if FIELD not in doc:
        raise ConfigError(FIELD, "is required: the whole table, {name: target, ...}")
    table = structure_config({FIELD: doc[FIELD]}).aliases  # 422 naming aliases.<name>

    def change(cfg: Config) -> Config:
        return attrs.evolve(cfg, aliases=table)

    with saving("the aliases"):
        stored = await call.ctx.settings.edit(change)  # validated: 422 changes nothing
    return 200, aliases_view(stored)
