"""The five strategies (SPEC §7.3) over candidate lists, loaded candidates first with
``prefer_loaded`` (SPEC §11), and the latency average."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.config import STRATEGIES, Strategy
from protocol.strategies import (
    Candidate,
    LatencyAverage,
    RoundRobinCursor,
    order_candidates,
)

A = Candidate("a", priority=3)
B = Candidate("b", priority=2)
C = Candidate("c", priority=1)


def names(candidates: list[Candidate]) -> str:
    return "".join(c.fingerprint for c in candidates)


def test_strategy_names_are_the_configs() -> None:
    assert tuple(s.value for s in Strategy) == STRATEGIES == (
        "priority", "round-robin", "least-loaded", "fastest", "weighted", "cache-aware")


def test_unknown_strategy() -> None:
    with pytest.raises(ValueError, match="random"):
        order_candidates("random", [A], RoundRobinCursor())


@pytest.mark.parametrize("strategy", list(Strategy))
def test_no_candidates(strategy: Strategy) -> None:
    cursor = RoundRobinCursor()
    assert order_candidates(strategy, [], cursor) == []
    assert cursor.last is None


def test_priority_is_the_users_order() -> None:
    assert names(order_candidates("priority", [C, A, B], RoundRobinCursor())) == "abc"
    tie = Candidate("a2", priority=3)
    assert names(order_candidates("priority", [tie, C, A], RoundRobinCursor())) == "aa2c"


def test_round_robin_cycles() -> None:
    cursor = RoundRobinCursor()
    firsts = [order_candidates("round-robin", [C, B, A], cursor)[0].fingerprint
              for _ in range(7)]
    assert firsts == list("abcabca")
    assert names(order_candidates("round-robin", [A, B, C], cursor)) == "bca"
    assert repr(cursor) == "RoundRobinCursor(last='b', priority=2)"


def test_round_robin_is_stable_when_the_set_changes() -> None:
    cursor = RoundRobinCursor()
    assert order_candidates("round-robin", [A, B, C], cursor)[0] == A
    assert order_candidates("round-robin", [A, B, C], cursor)[0] == B
    # b disappears (offline, open circuit): c is next, nobody is skipped or repeated
    assert order_candidates("round-robin", [A, C], cursor)[0] == C
    assert order_candidates("round-robin", [A, C], cursor)[0] == A
    # a new node d between a and b gets its turn in order
    d = Candidate("d", priority=2)  # same priority as b: fingerprint breaks the tie
    assert names(order_candidates("round-robin", [A, B, C, d], cursor)) == "bdca"
    assert order_candidates("round-robin", [A, B, C, d], cursor)[0] == d
    # the last served node itself disappears: the one after its position follows
    assert order_candidates("round-robin", [A, B], cursor)[0] == A


def test_least_loaded_uses_live_counts_ties_by_priority() -> None:
    cursor = RoundRobinCursor()
    loads = {"a": 2, "b": 0, "c": 0}

    def snapshot() -> list[Candidate]:
        return [Candidate(c.fingerprint, c.priority, in_flight=loads[c.fingerprint])
                for c in (A, B, C)]

    assert names(order_candidates("least-loaded", snapshot(), cursor)) == "bca"
    loads["b"] += 1  # a request went to b
    assert names(order_candidates("least-loaded", snapshot(), cursor)) == "cba"
    loads["a"] = 0  # a's requests finished
    assert names(order_candidates("least-loaded", snapshot(), cursor)) == "acb"
    assert cursor.last is None


def test_fastest_uses_the_moving_average_unmeasured_last() -> None:
    averages = {"a": LatencyAverage(), "b": LatencyAverage(), "c": LatencyAverage()}

    def snapshot() -> list[Candidate]:
        return [Candidate(c.fingerprint, c.priority, latency_ms=averages[c.fingerprint].value)
                for c in (A, B, C)]

    cursor = RoundRobinCursor()
    assert names(order_candidates("fastest", snapshot(), cursor)) == "abc"  # none measured
    averages["c"].add(50.0)  # health check
    assert names(order_candidates("fastest", snapshot(), cursor)) == "cab"
    averages["b"].add(20.0)
    assert names(order_candidates("fastest", snapshot(), cursor)) == "bca"
    for _ in range(3):
        averages["b"].add(200.0)  # b slows down: 20 -> 74 -> 111.8 -> 138.26
    assert averages["b"].value == pytest.approx(138.26)
    assert names(order_candidates("fastest", snapshot(), cursor)) == "cba"
    averages["a"].add(50.0)  # equal to c: priority breaks the tie
    assert names(order_candidates("fastest", snapshot(), cursor)) == "acb"


def test_latency_average() -> None:
    avg = LatencyAverage()
    assert avg.value is None
    assert repr(avg) == "LatencyAverage(unmeasured, samples=0, alpha=0.3)"
    assert avg.add(100.0) == 100.0  # the first sample is taken as is
    assert avg.add(0.0) == pytest.approx(70.0)  # 100 + 0.3 * (0 - 100)
    assert avg.samples == 2
    assert repr(avg) == "LatencyAverage(70.0ms, samples=2, alpha=0.3)"
    assert LatencyAverage(alpha=1.0).add(5.0) == 5.0
    with pytest.raises(ValueError, match="alpha"):
        LatencyAverage(alpha=0.0)
    with pytest.raises(ValueError, match="negative"):
        avg.add(-1.0)


# ------------------------------------------------- loaded first (prefer_loaded, SPEC §11)

def cold(candidate: Candidate) -> Candidate:
    """The same candidate without the model loaded."""
    return attrs.evolve(candidate, loaded=False)


def test_priority_loaded_first() -> None:
    mixed = [cold(A), B, C]
    assert names(order_candidates("priority", mixed, RoundRobinCursor())) == "bca"
    assert names(order_candidates("priority", [cold(A), cold(B), C],
                                  RoundRobinCursor())) == "cab"
    off = order_candidates("priority", mixed, RoundRobinCursor(), prefer_loaded=False)
    assert names(off) == "abc"


def test_round_robin_turns_among_the_loaded() -> None:
    cursor = RoundRobinCursor()
    mixed = [A, cold(B), C]
    orders = [names(order_candidates("round-robin", mixed, cursor)) for _ in range(4)]
    assert orders == ["acb", "cab", "acb", "cab"]  # b never first, a and c in turn
    # Only c loaded: c always first, the others rotated from c's position, a not skipped.
    assert [names(order_candidates("round-robin", [cold(A), cold(B), C], cursor))
            for _ in range(2)] == ["cab", "cab"]
    # Off: the plain rotation, the cursor going on from where it is (c).
    assert [names(order_candidates("round-robin", mixed, cursor, prefer_loaded=False))
            for _ in range(3)] == ["abc", "bca", "cab"]


def test_least_loaded_within_each_group() -> None:
    mixed = [Candidate("a", 3, in_flight=0, loaded=False),
             Candidate("b", 2, in_flight=2), Candidate("c", 1, in_flight=1),
             Candidate("d", 0, in_flight=1, loaded=False)]
    assert names(order_candidates("least-loaded", mixed, RoundRobinCursor())) == "cbad"
    off = order_candidates("least-loaded", mixed, RoundRobinCursor(), prefer_loaded=False)
    assert names(off) == "acdb"


def test_fastest_within_each_group() -> None:
    mixed = [Candidate("a", 3, latency_ms=10.0, loaded=False),
             Candidate("b", 2, latency_ms=None), Candidate("c", 1, latency_ms=30.0),
             Candidate("d", 0, latency_ms=5.0, loaded=False)]
    assert names(order_candidates("fastest", mixed, RoundRobinCursor())) == "cbda"
    off = order_candidates("fastest", mixed, RoundRobinCursor(), prefer_loaded=False)
    assert names(off) == "dacb"


def plain(candidates: list[Candidate]) -> list[Candidate]:
    return [attrs.evolve(c, loaded=True) for c in candidates]


CANDIDATES = st.lists(
    st.builds(Candidate, fingerprint=st.sampled_from("abcdefgh"),
              priority=st.integers(0, 3), in_flight=st.integers(0, 3),
              latency_ms=st.one_of(st.none(), st.sampled_from([5.0, 20.0, 50.0])),
              loaded=st.booleans()),
    max_size=6, unique_by=lambda c: c.fingerprint)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(Strategy))
@settings(max_examples=100, deadline=None)
@given(calls=st.lists(CANDIDATES, min_size=1, max_size=5), prefer=st.booleans())
def test_every_strategy_loaded_first_and_otherwise_unchanged(
        strategy: Strategy, calls: list[list[Candidate]], prefer: bool) -> None:
    """For every strategy and any run of calls (the round-robin cursor carried along): the
    loaded candidates come first, each group in the strategy's own order of that group (the
    cursor moved by the first group only); with prefer_loaded off, or every candidate
    equally loaded, the order and the cursor are exactly those of the strategy alone."""
    cursor = RoundRobinCursor()
    for candidates in calls:
        before = cursor.last
        got = order_candidates(strategy, candidates, cursor, prefer_loaded=prefer)
        assert sorted(names(got)) == sorted(names(candidates))
        loaded = [c for c in candidates if c.loaded]
        if not prefer or len(loaded) in (0, len(candidates)):
            alone = cursor_at(before)
            assert names(got) == names(order_candidates(strategy, plain(candidates), alone))
            assert cursor.last == alone.last
            continue
        count = len(loaded)
        assert [c.loaded for c in got] == [True] * count + [False] * (len(got) - count)
        first = cursor_at(before)
        assert got[:count] == order_candidates(strategy, loaded, first)
        assert cursor.last == first.last
        rest = [c for c in candidates if not c.loaded]
        assert got[count:] == order_candidates(strategy, rest, cursor_at(first.last))


def cursor_at(last: tuple[int, str] | None) -> RoundRobinCursor:
    cursor = RoundRobinCursor()
    cursor.last = last
    return cursor
