"""The four load-balancing strategies (SPEC §7.3), pure: candidates in, an order out.

A :class:`Candidate` is a frozen snapshot of one eligible node taken at resolution time.
Every order breaks ties the same way: higher ``priority`` first (the user's order; the
registry gives N..1, top first), then ``fingerprint`` so the result is deterministic.

- ``priority``: by priority.
- ``round-robin``: the priority order rotated so that it starts just after the node that
  was first last time (kept in a :class:`RoundRobinCursor` the caller owns, advanced once
  per call). The cursor remembers a *position* (priority, fingerprint), not an index, so
  adding or removing nodes never skips or repeats the others.
- ``least-loaded``: fewest requests in flight now (``in_flight``, counted live by the caller).
- ``fastest``: lowest ``latency_ms`` (a :class:`LatencyAverage`); unmeasured nodes last.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from protocol.config import Strategy


@attrs.frozen
class Candidate:
    """One eligible node as the strategies see it."""

    fingerprint: str
    priority: int  # higher goes first
    in_flight: int = 0  # requests sent to it and not finished, right now
    latency_ms: float | None = None  # LatencyAverage.value; None = never measured


def priority_key(candidate: Candidate) -> tuple[int, str]:
    """The canonical order: highest priority first, then by fingerprint."""
    return (-candidate.priority, candidate.fingerprint)


class RoundRobinCursor:
    """Where round-robin stands: the position of the node that went first last time."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: tuple[int, str] | None = None

    def __repr__(self) -> str:
        if self.last is None:
            return "RoundRobinCursor(start)"
        return f"RoundRobinCursor(last={self.last[1]!r}, priority={-self.last[0]})"


class LatencyAverage:
    """An exponentially weighted moving average of one node's latency, in milliseconds.

    Fed with both health-check round trips and request time-to-first-byte. Each new sample
    weighs ``alpha`` (default 0.3: a sample's weight halves in about two further samples,
    so a node that slows down is noticed within a few checks without one outlier
    dominating). The first sample is taken as is.
    """

    ALPHA = 0.3

    __slots__ = ("alpha", "samples", "value")

    def __init__(self, alpha: float = ALPHA) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], not {alpha}")
        self.alpha = alpha
        self.value: float | None = None
        self.samples = 0

    def __repr__(self) -> str:
        shown = "unmeasured" if self.value is None else f"{self.value:.1f}ms"
        return f"LatencyAverage({shown}, samples={self.samples}, alpha={self.alpha})"

    def add(self, sample_ms: float) -> float:
        """Fold one measurement in and return the new average."""
        if sample_ms < 0:
            raise ValueError(f"a latency cannot be negative: {sample_ms}")
        if self.value is None:
            self.value = float(sample_ms)
        else:
            self.value += self.alpha * (sample_ms - self.value)
        self.samples += 1
        return self.value


def order_candidates(
    strategy: Strategy | str, candidates: Sequence[Candidate], cursor: RoundRobinCursor
) -> list[Candidate]:
    """The candidates in the order to try them. Only round-robin touches ``cursor``.

    Raises ValueError for an unknown strategy (config validation rejects those earlier).
    """
    strategy = Strategy(strategy)
    by_priority = sorted(candidates, key=priority_key)
    if strategy is Strategy.PRIORITY:
        return by_priority
    if strategy is Strategy.ROUND_ROBIN:
        return _rotate(by_priority, cursor)
    if strategy is Strategy.LEAST_LOADED:
        return sorted(by_priority, key=lambda c: c.in_flight)  # stable: ties keep priority
    return sorted(by_priority, key=_latency_key)


def _latency_key(candidate: Candidate) -> tuple[bool, float]:
    if candidate.latency_ms is None:
        return (True, 0.0)
    return (False, candidate.latency_ms)


def _rotate(by_priority: list[Candidate], cursor: RoundRobinCursor) -> list[Candidate]:
    if not by_priority:
        return []
    start = 0
    if cursor.last is not None:
        last = cursor.last
        start = next(
            (i for i, c in enumerate(by_priority) if priority_key(c) > last), 0
        )
    ordered = by_priority[start:] + by_priority[:start]
    cursor.last = priority_key(ordered[0])
    return ordered
