"""The gateway's wall clock, and the one timestamp format of every file and answer
(secrets.yaml, notifications, access keys): UTC, to the second, ``2025-01-31T12:00:00Z``.

Durations and deadlines come from trio's clock (``trio.current_time()``); what is said to a
person or written to a file (a request's ``startedAt``, an event's ``at``, a history file's
name) comes from :func:`wall`, the one wall clock: a test swaps it with
:func:`use_wall_clock` instead of patching ``time``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["iso_second", "now_iso", "use_wall_clock", "wall"]

_clock: list[Callable[[], float]] = [time.time]


def wall() -> float:
    """Now, in seconds since the epoch (UTC), from the gateway's wall clock."""
    return _clock[0]()


def use_wall_clock(clock: Callable[[], float]) -> Callable[[], float]:
    """Make ``clock`` the wall clock; returns the one it replaces (to put it back)."""
    previous, _clock[0] = _clock[0], clock
    return previous


def iso_second(epoch: float) -> str:
    """``epoch`` in the timestamp format of every file and answer: UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def now_iso() -> str:
    """Now, in the timestamp format of every file and answer: UTC, to the second (``...Z``)."""
    return iso_second(wall())
