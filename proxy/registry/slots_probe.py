"""A local backend's slots (SPEC §15 "Load"), asked with each of its health checks.

After ``GET /v1/models`` answered, :func:`poll_slots` asks ``GET /slots`` (llama.cpp: one
object per slot, ``is_processing`` when busy) through the same connection pool, in what is
left of the check's timeout. When the server refuses it (another status, not JSON, not a
list of slots, too large), ``GET /props``' ``total_slots`` gives the count with none known
busy; when both are refused, the slots are unknown. After a refusal the server is not asked
again for :data:`~proxy.registry.backends.SLOTS_RETRY_CHECKS` checks (the value found
stays), nor after it was asked at an address it no longer has. A server that did not answer
in time, or whose connection failed, has unknown slots until the next check, with no
back-off. None of this is an error: the backend's state is its model list's alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import trio

from protocol.served_context import Served, props_context
from protocol.slots import Slots, parse_slots, parse_total_slots
from protocol.upstream_url import UpstreamAddress
from proxy.upstream.connection import UpstreamFailure
from proxy.upstream.pool import ConnectionPool, fetch

SLOTS_CAP = 1024 * 1024  # /slots: a few hundred bytes to a few KB per slot
PROPS_CAP = 4 * 1024 * 1024  # /props carries the chat template


class _NoAnswer(Exception):
    """The server did not answer (the connection failed before any byte of an answer)."""


async def _document(connections: ConnectionPool, address: UpstreamAddress, path: bytes, *,
                    api_key: str | None, cap: int) -> Any:
    """The JSON of a 200 answer to ``GET path``; None when the server answered anything
    else (another status, no JSON, over ``cap``). Raises :class:`_NoAnswer` when it did not
    answer."""
    try:
        status, body = await fetch(connections, address, path, api_key=api_key, cap=cap)
    except UpstreamFailure as exc:
        if exc.responded:
            return None
        raise _NoAnswer(str(exc)) from exc
    if status != 200:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


async def poll_slots(connections: ConnectionPool, address: UpstreamAddress, *,
                     api_key: str | None, deadline: float,
                     context: Callable[[Served | None], None] | None = None
                     ) -> tuple[Slots | None, bool]:
    """Ask the backend at ``address`` for its slots by ``deadline``: ``(slots, refused)``,
    for :meth:`~proxy.registry.backends.BackendRegistry.found_slots` (the busy count as
    reported: routing sets it against its own in-flight count); ``context(served)``, when
    ``/props`` was asked, what it says of the served context (SPEC §17.2)."""
    found: Slots | None = None
    refused = False
    with trio.move_on_at(deadline):
        try:
            counted = parse_slots(await _document(connections, address, b"/slots",
                                                  api_key=api_key, cap=SLOTS_CAP))
            if counted is not None:
                busy, total = counted
                found = Slots(total, busy)
            else:
                props = await _document(connections, address, b"/props", api_key=api_key,
                                        cap=PROPS_CAP)
                if context is not None:
                    context(props_context(props))
                total_slots = parse_total_slots(props)
                found = None if total_slots is None else Slots(total_slots, 0)
                refused = True
        except _NoAnswer:
            found, refused = None, False
    return found, refused


async def poll_context(connections: ConnectionPool, address: UpstreamAddress, *,
                       api_key: str | None, deadline: float) -> tuple[Served | None, bool]:
    """The context llama.cpp at ``address`` serves (``/props``, SPEC §17.2), by
    ``deadline``: ``(served, answered)``; ``answered`` is False when the server did not
    answer (asked again at the next check), True with None when it has no such answer."""
    with trio.move_on_at(deadline):
        try:
            doc = await _document(connections, address, b"/props", api_key=api_key,
                                  cap=PROPS_CAP)
        except _NoAnswer:
            return None, False
        return props_context(doc), True
    return None, False
