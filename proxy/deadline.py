"""The time limits of one request and the scope that enforces them.

:class:`RequestScope` belongs to the client connection: its reader calls
:meth:`RequestScope.cancel` when the client goes away, whatever the request is waiting for.
The relay opens each attempt's cancel scope from it (:meth:`RequestScope.open`) and moves that
scope's deadline between the phases of the attempt with a :class:`Deadline`. Between the
chunks of a stream, :class:`GapWatch` bounds each wait for the upstream's next bytes.
"""

from __future__ import annotations

from math import inf

import trio

from protocol.errors import SluiceError, upstream_timeout

CONNECT_LIMIT = "timeouts.connection"
FIRST_BYTE_LIMIT = "timeouts.request.streaming.first_byte"  # to a stream's first data event


class RequestScope:
    """The cancel scope of the request in flight (see the module docstring)."""

    __slots__ = ("_scope", "cancelled")

    def __init__(self) -> None:
        self._scope: trio.CancelScope | None = None
        self.cancelled = False  # the client went away

    def __repr__(self) -> str:
        return f"RequestScope(cancelled={self.cancelled})"

    def open(self) -> trio.CancelScope:
        """A fresh scope for the next attempt; already cancelled if the client has left."""
        scope = self._scope = trio.CancelScope()
        if self.cancelled:
            scope.cancel()
        return scope

    def cancel(self) -> None:
        self.cancelled = True
        if self._scope is not None:
            self._scope.cancel()


class Deadline:
    """The deadline of one attempt's scope, moved between phases; remembers which configured
    limit it stands for, so a timeout can name it. Never later than the request's total."""

    __slots__ = ("_answer", "_connect", "limit", "scope", "seconds", "total_at", "total_limit",
                 "total_seconds")

    def __init__(self, scope: trio.CancelScope, total_at: float, total_limit: str,
                 total_seconds: float, *, connect: float, answer: tuple[float, str]) -> None:
        self.scope = scope
        self.total_at = total_at
        self.total_limit = total_limit
        self.total_seconds = total_seconds
        self.limit = total_limit
        self.seconds = total_seconds
        # The limits of the connect phase and of the wait for the response head. The scope's
        # deadline is first set by connecting() or connected(), before any await: each
        # change costs a couple of microseconds, and a pooled connection skips one.
        self._connect = connect
        self._answer = answer

    def connecting(self) -> None:
        self.within(self._connect, CONNECT_LIMIT)

    def connected(self) -> None:
        self.within(*self._answer)

    @property
    def connect_phase(self) -> bool:
        return self.limit == CONNECT_LIMIT

    def within(self, seconds: float, limit: str) -> None:
        """Bound the next phase by ``seconds`` from now (never past the total)."""
        at = trio.current_time() + seconds
        if at < self.total_at:
            self.scope.deadline = at
            self.limit = limit
            self.seconds = seconds
        else:
            self.scope.deadline = self.total_at
            self.limit = self.total_limit
            self.seconds = self.total_seconds

    def held(self) -> tuple[float, str, float]:
        """The phase in force now, for :meth:`resume` to put back (a write to a slow client
        moves the deadline to the total while it blocks)."""
        return self.scope.deadline, self.limit, self.seconds

    def resume(self, held: tuple[float, str, float]) -> None:
        self.scope.deadline, self.limit, self.seconds = held

    def to_total(self) -> None:
        self.scope.deadline = self.total_at
        self.limit = self.total_limit
        self.seconds = self.total_seconds

    def error(self, what: str) -> SluiceError:
        return upstream_timeout(f"{what} within {self.limit} ({self.seconds:g}s)")


class GapWatch:
    """The cancel scope that bounds the waits for an upstream's next bytes (see
    :meth:`proxy.relay.Relay._relay_body`). ``ready`` is told of every read; while a write
    to a slow client blocks (``on_block``), the gap is not counted, and it starts again after it."""

    __slots__ = ("_armed_at", "_blocked", "_gap", "_ready_at", "scope")

    def __init__(self, gap: float, now: float) -> None:
        self._gap = gap
        self._arm(now)

    def _arm(self, now: float) -> None:
        self._armed_at = self._ready_at = now
        self._blocked = False
        self.scope = trio.CancelScope(deadline=now + self._gap)

    def on_block(self) -> None:
        self._blocked = True
        self.scope.deadline = inf

    def ready(self, now: float) -> None:
        """The relay is ready for more bytes (a read was relayed)."""
        self._ready_at = now
        if self._blocked:
            self._blocked = False
            self._armed_at = now
            self.scope.deadline = now + self._gap

    def rearm(self) -> bool:
        """After the scope ended by its deadline: False when no read came since it was
        armed (the gap has passed), else a fresh scope from the latest read."""
        if self._ready_at == self._armed_at:
            return False
        self._arm(self._ready_at)
        return True
