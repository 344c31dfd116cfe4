"""A settings write through the one mapping of JSON to config
(:func:`protocol.config.writes.apply_write`), saved by the settings: the body's fields on
the config as it is when the write's turn comes, validated as at start; a refused write
answers 422 naming the field, a failed one 500, and either way nothing changes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from protocol.config import Config
from protocol.config.fields import Section
from protocol.config.writes import apply_write
from proxy.api.call import Call, saving

Seen = Callable[[Config, Config], None]
"""Told (old, new) of the change as it is made (under the settings' one writer)."""


async def save_write(call: Call, section: Section, doc: Mapping[str, Any], *,
                     what: str = "the settings", seen: Seen | None = None) -> Config:
    """Write ``doc`` (a subset of ``section``'s fields) and return the config as stored."""
    section.check(doc)  # a field it does not have: refused before anything is looked at
    def change(old: Config) -> Config:
        new = apply_write(section, doc, old)
        if seen is not None:
            seen(old, new)
        return new

    with saving(what):
        return await call.ctx.settings.edit(change)
