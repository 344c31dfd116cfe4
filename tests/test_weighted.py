"""The weighted strategy (SPEC §7.3, §13): smooth weighted round-robin over candidates, its
order for failover, candidates that come and go, weight changes, loaded first; then the
same through resolve() and the Router's cursor, and ``nodes[].weight`` in config.yaml."""

from __future__ import annotations

from collections import Counter

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.config import (
    MAX_WEIGHT,
    MIN_WEIGHT,
    NodeConfig,
    Strategy,
    default_config,
    dump_config_yaml,
    parse_config_text,
)
from protocol.errors import ConfigError
from protocol.strategies import (
    Candidate,
    RoundRobinCursor,
    WeightedCursor,
    order_candidates,
)
from proxy.routing.breaker import CircuitBreaker
from proxy.routing.resolve import Forward, NodeView, RouteRequest, resolve

A = Candidate("a", priority=1, weight=3)
B = Candidate("b", priority=3, weight=1)
C = Candidate("c", priority=2, weight=1)


def picks(candidates: list[Candidate], count: int, cursor: WeightedCursor | None = None,
          **options: bool) -> str:
    """The first of each of ``count`` orders, as a string of fingerprints."""
    cursor = WeightedCursor() if cursor is None else cursor
    return "".join(order_candidates("weighted", candidates, RoundRobinCursor(),
                                    weighted=cursor, **options)[0].fingerprint
                   for _ in range(count))


def test_weights_3_1_1_give_exactly_30_10_10_over_50_picks() -> None:
    got = picks([A, B, C], 50)
    assert Counter(got) == {"a": 30, "b": 10, "c": 10}
    # Exact in every cycle of 5 (the sum of the weights), not only over the whole run.
    cycles = [got[i:i + 5] for i in range(0, 50, 5)]
    assert all(Counter(cycle) == {"a": 3, "b": 1, "c": 1} for cycle in cycles), cycles
    # Spread out: a heavy node's picks are between the others', never three in a row,
    # and the two light ones tie, so the higher priority (b) goes first.
    assert cycles[0] == "abaca"
    assert "aaa" not in got
    assert len(set(cycles)) == 1


def test_the_order_is_the_pick_then_the_rest_by_weight_then_priority() -> None:
    d = Candidate("d", priority=9, weight=2)
    cursor = WeightedCursor()
    orders = ["".join(c.fingerprint for c in order_candidates(
        "weighted", [B, C, d, A], RoundRobinCursor(), weighted=cursor)) for _ in range(7)]
    # The rest: a (3), d (2), then b and c (1 each) by priority: b (3) before c (2).
    assert orders == ["adbc", "dabc", "badc", "adbc", "cadb", "dabc", "adbc"]
    assert Counter(o[0] for o in orders) == {"a": 3, "d": 2, "b": 1, "c": 1}
    # Without a cursor of its own an order starts afresh: the heaviest first.
    assert order_candidates("weighted", [B, C, A], RoundRobinCursor())[0] == A


def test_a_candidate_leaving_and_coming_back() -> None:
    cursor = WeightedCursor()
    assert picks([A, B, C], 5, cursor) == "abaca"
    # c goes offline: a and b go on 3:1 between themselves, in every cycle of 4.
    alone = picks([A, B], 40, cursor)
    assert [Counter(alone[i:i + 4]) for i in range(0, 40, 4)] == [{"a": 3, "b": 1}] * 10
    assert cursor.current["c"] == 0  # untouched while it was away
    # Back: exact per cycle of 5 again, c included.
    back = picks([A, B, C], 50, cursor)
    assert Counter(back) == {"a": 30, "b": 10, "c": 10}
    assert all(Counter(back[i:i + 5]) == {"a": 3, "b": 1, "c": 1} for i in range(0, 50, 5))


def test_leaving_mid_cycle_never_starves_or_floods_anyone() -> None:
    """c leaves after every possible number of picks and comes back 37 picks later: the
    values stay bounded and, over the next full cycles, each one gets its exact share."""
    for before in range(10):
        cursor = WeightedCursor()
        picks([A, B, C], before, cursor)
        away = picks([A, B], 37, cursor)
        assert abs(away.count("a") - 37 * 3 / 4) <= 2, (before, away)
        back = picks([A, B, C], 105, cursor)
        assert Counter(back[5:]) == {"a": 60, "b": 20, "c": 20}, (before, back)
        assert all(abs(value) <= 5 for value in cursor.current.values()), cursor
        assert sum(cursor.current.values()) == 0


def test_a_weight_change_applies_at_once() -> None:
    cursor = WeightedCursor()
    assert picks([A, B, C], 5, cursor) == "abaca"
    heavy_c = attrs.evolve(C, weight=6)
    got = picks([A, B, heavy_c], 100, cursor)
    assert Counter(got) == {"c": 60, "a": 30, "b": 10}
    assert all(Counter(got[i:i + 10]) == {"c": 6, "a": 3, "b": 1} for i in range(0, 100, 10))
    # And back to equal weights: plain turns.
    equal = [attrs.evolve(x, weight=1) for x in (A, B, C)]
    turns = picks(equal, 30, cursor)
    assert all(Counter(turns[i:i + 3]) == {"a": 1, "b": 1, "c": 1} for i in range(0, 30, 3))


def test_weighted_turns_among_the_loaded() -> None:
    cold_a = attrs.evolve(A, loaded=False)
    cursor = WeightedCursor()
    orders = ["".join(c.fingerprint for c in order_candidates(
        "weighted", [cold_a, B, C], RoundRobinCursor(), weighted=cursor)) for _ in range(4)]
    # a, the heaviest, has the model cold: b and c take turns, a always last.
    assert orders == ["bca", "cba", "bca", "cba"]
    assert "a" not in cursor.current  # the group that was not picked from is not moved
    # Off: a is back in the rotation at its weight.
    off = picks([cold_a, B, C], 50, cursor, prefer_loaded=False)
    assert Counter(off) == {"a": 30, "b": 10, "c": 10}


def test_repr_and_forget() -> None:
    cursor = WeightedCursor()
    assert repr(cursor) == "WeightedCursor(start)"
    picks([A, B, C], 1, cursor)
    assert repr(cursor) == "WeightedCursor(a=-2, b=1, c=1)"
    cursor.forget({"a", "b"})
    assert cursor.current == {"a": -2, "b": 1}
    assert cursor.pick([]) is None


WEIGHTED = st.lists(
    st.builds(Candidate, fingerprint=st.sampled_from("abcdef"), priority=st.integers(1, 9),
              weight=st.integers(MIN_WEIGHT, 12)),
    min_size=1, max_size=6, unique_by=lambda c: c.fingerprint)


@settings(max_examples=150, deadline=None)
@given(candidates=WEIGHTED, cycles=st.integers(1, 3))
def test_exact_per_cycle_for_any_weights(candidates: list[Candidate], cycles: int) -> None:
    """From the start, every cycle of sum(weights) picks gives each its weight exactly."""
    total = sum(c.weight for c in candidates)
    cursor = WeightedCursor()
    for _ in range(cycles):
        got = Counter(picks(candidates, total, cursor))
        assert got == {c.fingerprint: c.weight for c in candidates}
        assert set(cursor.current.values()) == {0}  # a full cycle ends where it began


# ----------------------------------------------------------- through resolve() and config


def view(fp: str, priority: int, weight: int, online: bool = True) -> NodeView:
    return NodeView(fp, priority, frozenset({"m"}), CircuitBreaker(3, 60.0), online=online,
                    weight=weight)


def test_resolve_orders_by_the_weighted_cursor() -> None:
    request = RouteRequest(model="m", load_balancing=True, probe_ttl=30.0,
                           strategy=Strategy.WEIGHTED)
    nodes = [view("a", 1, 3), view("b", 3, 1), view("c", 2, 1)]
    cursor, robin = WeightedCursor(), RoundRobinCursor()
    firsts = []
    for i in range(50):
        route = resolve(request, nodes, robin, 1000.0 + i, weighted=cursor)
        assert isinstance(route, Forward)
        target = route.choose(1000.0 + i)
        target.succeeded(1000.0 + i)
        firsts.append(target.fingerprint)
    assert Counter(firsts) == {"a": 30, "b": 10, "c": 10}
    assert robin.last is None  # the round-robin cursor is not touched
    # An offline node is no candidate: the others keep their ratio.
    nodes[2] = view("c", 2, 1, online=False)
    route = resolve(request, nodes, robin, 2000.0, weighted=cursor)
    assert isinstance(route, Forward)
    assert set(route.fingerprints) == {"a", "b"}


def node(weight: object) -> str:
    return ("nodes:\n  - fingerprint: node-a\n    name: a\n    base_url: http://h:1\n"
            f"    priority: 1\n    weight: {weight}\n")


@pytest.mark.parametrize(("weight", "message"), [
    (0, "must be between 1 and 100, got 0"), (101, "must be between 1 and 100, got 101"),
    (-3, "must be between 1 and 100, got -3"), ('"x"', "expected a whole number"),
    ("2.5", "expected a whole number"), ("true", "expected a whole number")])
def test_weight_out_of_range_or_not_a_number_is_refused(weight: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config_text(node(weight))
    assert caught.value.path == "nodes[0].weight"
    assert message in str(caught.value)


def test_weight_in_the_file() -> None:
    assert parse_config_text(node(MIN_WEIGHT)).nodes[0].weight == 1
    assert parse_config_text(node(MAX_WEIGHT)).nodes[0].weight == 100
    # An old file without weights reads as 1 each.
    old = node(1).replace("    weight: 1\n", "")
    assert parse_config_text(old).nodes[0].weight == 1
    # Written with each node, and read back equal; the strategy too.
    cfg = default_config()
    cfg = attrs.evolve(cfg, nodes=(NodeConfig("node-a", "a", "http://h:1", 1, weight=7),),
                       load_balancing=attrs.evolve(cfg.load_balancing, strategy="weighted"))
    text = dump_config_yaml(cfg)
    assert "    weight: 7\n" in text or "  weight: 7\n" in text
    assert "| fastest | weighted" in text
    assert parse_config_text(text) == cfg
    # Weights need not be unique (unlike priorities).
    two = node(5) + node(5).replace("nodes:\n", "").replace("node-a", "node-b") \
        .replace("priority: 1", "priority: 2")
    assert [n.weight for n in parse_config_text(two).nodes] == [5, 5]
