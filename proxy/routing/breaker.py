"""A circuit breaker per network node (SPEC §7.4), as a pure state machine.

No clock and no I/O: every call that depends on time takes ``now`` (callers pass
``trio.current_time()``), so tests drive it with plain numbers.

Every request to a node first asks :meth:`CircuitBreaker.allow` for a :class:`Permit`
(``None`` means: skip this node) and reports exactly one outcome with that permit:

- ``record_success`` — the node answered well (2xx, 3xx);
- ``record_failure`` — connect error, 5xx, timeout, stream cut;
- ``record_neutral`` — a client-caused outcome (4xx, client disconnect) or a permit the
  caller did not use: neither success nor failure; a probe is released unchanged.

Rules:

- CLOSED: every request gets a permit. ``failure_threshold`` consecutive failures open the
  circuit; a success resets the count.
- OPEN: no permits. Once ``reset_timeout`` has passed since it opened, the circuit is
  HALF_OPEN (the move happens when the breaker is next asked, at that ``now``).
- HALF_OPEN: exactly one permit at a time, the *probe*. Its success closes the circuit; its
  failure reopens it at once for another full ``reset_timeout``. A probe carries an expiry
  (``now + ttl``, ttl being the request's own total timeout): a probe that never reports
  back counts as failed at its expiry time, so half-open can never wedge.
- A permit issued before the circuit last changed state is stale: its report is ignored
  (only the probe can close a circuit; a late failure does not extend an open one).
- Health checks never move the breaker: it has no method for them.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from protocol.config import CircuitBreakerConfig


class BreakerState(enum.Enum):
    CLOSED = "closed"  # requests pass; consecutive failures are counted
    OPEN = "open"  # the node is skipped, also as a failover target
    HALF_OPEN = "half_open"  # one probe request may pass


MOVES: dict[BreakerState, frozenset[BreakerState]] = {
    BreakerState.CLOSED: frozenset({BreakerState.OPEN}),  # threshold reached
    BreakerState.OPEN: frozenset({BreakerState.HALF_OPEN}),  # reset_timeout passed
    BreakerState.HALF_OPEN: frozenset({
        BreakerState.CLOSED,  # the probe succeeded
        BreakerState.OPEN,  # the probe failed or expired
    }),
}

@attrs.frozen(eq=False)
class Permit:
    """Leave to send one request to a node. Compared by identity; report it exactly once."""

    probe: bool  # True: the single half-open probe
    generation: int  # the breaker's generation when issued; a changed one makes it stale
    issued_at: float
    expires_at: float  # a probe still unreported at this time counts as failed


class CircuitBreaker:
    """The breaker of one node. See the module docstring for the rules."""

    __slots__ = (
        "_failures",
        "_generation",
        "_opened_at",
        "_probe",
        "_state",
        "failure_threshold",
        "reset_timeout",
    )

    def __init__(self, failure_threshold: int, reset_timeout: float) -> None:
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be at least 1, not {failure_threshold}")
        if reset_timeout <= 0:
            raise ValueError(f"reset_timeout must be positive, not {reset_timeout}")
        self.failure_threshold = failure_threshold
        self.reset_timeout = reset_timeout
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._generation = 0
        self._opened_at = 0.0
        self._probe: Permit | None = None

    @classmethod
    def from_config(cls, config: CircuitBreakerConfig) -> CircuitBreaker:
        return cls(config.failure_threshold, config.reset_timeout)

    def __repr__(self) -> str:
        probe = ", probe out" if self._probe is not None else ""
        return (
            f"CircuitBreaker({self._state.value}, failures={self._failures}/"
            f"{self.failure_threshold}, reset_timeout={self.reset_timeout}{probe})"
        )

    # -- reading -------------------------------------------------------------------------

    def state(self, now: float) -> BreakerState:
        """The state at ``now``, after applying the time-driven moves."""
        self._advance(now)
        return self._state

    def is_open(self, now: float) -> bool:
        """True while the circuit is OPEN (not yet half-open) at ``now``."""
        return self.state(now) is BreakerState.OPEN

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    @property
    def generation(self) -> int:
        """How many times the state has moved: a reader that remembers it sees a transition
        (its own look at :meth:`state` first applies the time-driven ones)."""
        return self._generation

    @property
    def probe_out(self) -> bool:
        """True while a half-open probe is handed out and unreported."""
        return self._probe is not None

    def opens_until(self, now: float) -> float | None:
        """When an OPEN circuit turns half-open; None when it is not OPEN at ``now``."""
        if self.state(now) is not BreakerState.OPEN:
            return None
        return self._opened_at + self.reset_timeout

    # -- asking and reporting ------------------------------------------------------------

    def allow(self, now: float, ttl: float) -> Permit | None:
        """A permit for one request, or None to skip this node.

        ``ttl`` is the request's own total timeout: a half-open probe not reported within
        it counts as failed. In HALF_OPEN only one probe is out at a time.
        """
        if ttl <= 0:
            raise ValueError(f"ttl must be positive, not {ttl}")
        self._advance(now)
        if self._state is BreakerState.OPEN:
            return None
        if self._state is BreakerState.HALF_OPEN:
            if self._probe is not None:
                return None
            self._probe = Permit(True, self._generation, now, now + ttl)
            return self._probe
        return Permit(False, self._generation, now, now + ttl)

    def record_success(self, permit: Permit, now: float) -> None:
        if not self._current(permit, now):
            return
        self._failures = 0
        if self._state is BreakerState.HALF_OPEN:
            self._probe = None
            self._move(BreakerState.CLOSED)

    def record_failure(self, permit: Permit, now: float) -> None:
        if not self._current(permit, now):
            return
        self._failures += 1
        if self._state is BreakerState.HALF_OPEN:
            self._probe = None
            self._open(now)
        elif self._failures >= self.failure_threshold:
            self._open(now)

    def record_neutral(self, permit: Permit, now: float) -> None:
        """A client-caused outcome or an unused permit: releases a probe, moves nothing."""
        if self._current(permit, now) and permit is self._probe:
            self._probe = None

    # -- internals -----------------------------------------------------------------------

    def _current(self, permit: Permit, now: float) -> bool:
        self._advance(now)
        if permit.generation != self._generation:
            return False  # issued before the last move: stale
        if self._state is BreakerState.HALF_OPEN:
            return permit is self._probe
        return self._state is BreakerState.CLOSED

    def _advance(self, now: float) -> None:
        while True:
            if (self._state is BreakerState.OPEN
                    and now >= self._opened_at + self.reset_timeout):
                self._move(BreakerState.HALF_OPEN)
            elif (self._state is BreakerState.HALF_OPEN and self._probe is not None
                    and now >= self._probe.expires_at):
                expired_at = self._probe.expires_at
                self._probe = None
                self._failures += 1
                self._open(expired_at)
            else:
                return

    def _open(self, at: float) -> None:
        self._move(BreakerState.OPEN)
        self._opened_at = at

    def _move(self, new: BreakerState) -> None:
        if new not in MOVES[self._state]:
            raise AssertionError(f"illegal breaker move {self._state.value} -> {new.value}")
        self._state = new
        self._generation += 1
