"""The shape of a gateway's start order (:data:`proxy.server.START_ORDER`): each part it
starts is a :class:`Step` of a :class:`Kind`, which says how :meth:`Gateway.run` starts it."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import attrs


class Kind(enum.Enum):
    """How :meth:`proxy.server.Gateway.run` starts a step."""

    SETUP = "awaited in turn before any task; a failure is the start's (exit 2)"
    READY = "a task in the background nursery; the next step begins once it is ready"
    SOON = "a task in the background nursery, begun at once"
    SERVE = "awaited last, in the background nursery: accepting until the stop, the drain"


@attrs.frozen
class Step:
    """One part the gateway starts. ``begin(gateway)``: for SETUP, the awaitable; for
    READY and SOON, the task to start (None: not in this gateway); for SERVE, the
    function that serves (given run's task status)."""

    name: str
    kind: Kind
    begin: Callable[[Any], Any]
