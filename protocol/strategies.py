"""The five load-balancing strategies (SPEC §7.3, §13), pure: candidates in, an order out.

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
- ``cache-aware`` (SPEC §15): the candidate holding the longest match of the request's
  prefix chain, unless it is busier than the least busy one by more than the load bound;
  else the least busy (:func:`protocol.affinity_choice.choose`).
- ``weighted``: smooth weighted round-robin (nginx's) by ``weight``, kept in a
  :class:`WeightedCursor` the caller owns: the one picked goes first, then the others by
  weight (largest first), then priority. Exact per cycle: weights 3:1:1 give 3, 1 and 1 of
  every 5 picks, spread out (a b a c a), never a a a b c.

With ``prefer_loaded`` (``load_balancing.prefer_loaded``, SPEC §11) the candidates that have
the model loaded go first, and the strategy orders each group on its own: round-robin and
weighted turn among the loaded ones (the cursors follow the first group), least-loaded and
fastest compare within a group. When every candidate is loaded, or none is, the order is
the strategy's alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from protocol.affinity_choice import HIT, MISS, SESSION, Contender, choose
from protocol.config import Strategy


@attrs.frozen
class Candidate:
    """One eligible candidate (a node, or a local backend) as the strategies see it."""

    fingerprint: str
    priority: int  # higher goes first
    in_flight: int = 0  # requests sent to it and not finished, right now
    latency_ms: float | None = None  # LatencyAverage.value; None = never measured
    loaded: bool = True  # it has the requested model loaded (or does not say: SPEC §11)
    weight: int = 1  # nodes[].weight: its share under the weighted strategy (SPEC §13)
    waiting: int = 0  # requests in flight beyond its free slots (SPEC §15 "Load")
    match: int = 0  # leading blocks of the request's prefix chain it holds (SPEC §15)
    session: bool = False  # it last served the request's session key
    local: bool = False  # a local backend (SPEC §7.1: local first), else a node
    free: int | None = None  # its free slots now (SPEC §18); None: unknown, unlimited


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


def weight_key(candidate: Candidate) -> tuple[int, int, str]:
    """The weighted strategy's tie order: the largest weight first, then by priority."""
    return (-candidate.weight, -candidate.priority, candidate.fingerprint)


class WeightedCursor:
    """Where smooth weighted round-robin stands: each node's current value, by fingerprint.

    A pick adds each candidate's weight to its value, takes the largest (ties: the weighted
    tie order) and subtracts the candidates' total weight from it. So over any run of picks
    among the same candidates each one is picked in proportion to its weight, exactly per
    cycle of ``sum(weights)`` picks from a balanced start, and a heavy node's picks are spread
    between the others'. A node that is not a candidate for a pick (offline, circuit open,
    another model) keeps its value untouched, so the others rotate on among themselves and
    it comes back where it left off; the sum over every node ever picked stays 0. A weight is
    read at each pick, so a change applies at once.
    """

    __slots__ = ("current",)

    def __init__(self) -> None:
        self.current: dict[str, int] = {}

    def __repr__(self) -> str:
        shown = ", ".join(f"{fp}={value}" for fp, value in sorted(self.current.items()))
        return f"WeightedCursor({shown or 'start'})"

    def pick(self, candidates: Sequence[Candidate]) -> Candidate | None:
        """The next candidate (None for none), the values moved as described above."""
        current = self.current
        best: Candidate | None = None
        best_value = 0
        total = 0
        for candidate in sorted(candidates, key=weight_key):
            value = current.get(candidate.fingerprint, 0) + candidate.weight
            current[candidate.fingerprint] = value
            total += candidate.weight
            if best is None or value > best_value:
                best, best_value = candidate, value
        if best is not None:
            current[best.fingerprint] = best_value - total
        return best

    def forget(self, known: set[str]) -> None:
        """Drop the values of nodes no longer configured."""
        for fp in [fp for fp in self.current if fp not in known]:
            del self.current[fp]


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
    strategy: Strategy | str, candidates: Sequence[Candidate], cursor: RoundRobinCursor,
    *, prefer_loaded: bool = True, weighted: WeightedCursor | None = None, load_bound: int = 1,
) -> list[Candidate]:
    """The candidates in the order to try them; loaded ones first with ``prefer_loaded``
    (see the module docstring). Only round-robin touches ``cursor`` and only weighted
    ``weighted`` (None: a fresh one, for a one-off order), once per call.

    Raises ValueError for an unknown strategy (config validation rejects those earlier).
    """
    strategy = Strategy(strategy)
    if weighted is None:
        weighted = WeightedCursor()
    if prefer_loaded:
        loaded = [c for c in candidates if c.loaded]
        if 0 < len(loaded) < len(candidates):
            rest = [c for c in candidates if not c.loaded]
            return (_strategy_order(strategy, loaded, cursor, weighted, load_bound)
                    + _strategy_order(strategy, rest, cursor, weighted, load_bound,
                                      advance=False))
    return _strategy_order(strategy, candidates, cursor, weighted, load_bound)


def _strategy_order(strategy: Strategy, candidates: Sequence[Candidate],
                    cursor: RoundRobinCursor, weighted: WeightedCursor, load_bound: int,
                    advance: bool = True) -> list[Candidate]:
    if strategy is Strategy.CACHE_AWARE:
        return _by_affinity(candidates, load_bound)
    if strategy is Strategy.WEIGHTED:
        by_weight = sorted(candidates, key=weight_key)
        first = weighted.pick(candidates) if advance else None
        if first is None:
            return by_weight
        return [first, *(c for c in by_weight if c is not first)]
    by_priority = sorted(candidates, key=priority_key)
    if strategy is Strategy.PRIORITY:
        return by_priority
    if strategy is Strategy.ROUND_ROBIN:
        return _rotate(by_priority, cursor, advance)
    if strategy is Strategy.LEAST_LOADED:
        return sorted(by_priority, key=lambda c: c.in_flight)  # stable: ties keep priority
    return sorted(by_priority, key=_latency_key)


def _by_affinity(candidates: Sequence[Candidate], load_bound: int) -> list[Candidate]:
    """``cache-aware``: :func:`protocol.affinity_choice.choose` over the candidates."""
    contenders = [Contender(c.fingerprint, c.priority, c.in_flight, c.waiting, c.match,
                            c.session) for c in candidates]
    order, _ = choose(contenders, load_bound)
    by_name = {c.fingerprint: c for c in candidates}
    return [by_name[c.name] for c in order]


def affinity_result(chosen: Candidate, candidates: Sequence[Candidate]) -> str | None:
    """The request log's ``affinity`` for a cache-aware pick (SPEC §15): null with one
    candidate; ``session`` when the session key chose it; ``hit`` when it holds the
    longest match there is (at least one block); else ``miss`` (no match, or the matched
    candidate passed over for load)."""
    if len(candidates) < 2:
        return None
    if chosen.session:
        return SESSION
    best = max(c.match for c in candidates)
    return HIT if best >= 1 and chosen.match == best else MISS


def _latency_key(candidate: Candidate) -> tuple[bool, float]:
    if candidate.latency_ms is None:
        return (True, 0.0)
    return (False, candidate.latency_ms)


def _rotate(by_priority: list[Candidate], cursor: RoundRobinCursor,
            advance: bool = True) -> list[Candidate]:
    """Start just after the cursor's position; ``advance``: the first becomes it."""
    if not by_priority:
        return []
    start = 0
    if cursor.last is not None:
        last = cursor.last
        start = next(
            (i for i, c in enumerate(by_priority) if priority_key(c) > last), 0
        )
    ordered = by_priority[start:] + by_priority[:start]
    if advance:
        cursor.last = priority_key(ordered[0])
    return ordered
