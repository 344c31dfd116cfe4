"""The four strategies (SPEC §7.3) over candidate lists, and the latency average."""

from __future__ import annotations

import pytest

from protocol.config import STRATEGIES, Strategy
from proxy.routing.strategies import (
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
        "priority", "round-robin", "least-loaded", "fastest")


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
