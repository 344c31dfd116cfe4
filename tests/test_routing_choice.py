"""The one routing choice (protocol/routing_choice.py), with plain values: local first,
spill-over and the strategies as rows and rules of one function, and the queue's rule
(only a candidate with a free slot)."""

from __future__ import annotations

from protocol.routing_choice import Choice, Rules, choose, needs_nodes
from protocol.strategies import Candidate, RoundRobinCursor, WeightedCursor


def local(name: str, priority: int, free: int | None = None, in_flight: int = 0,
          waiting: int = 0, match: int = 0) -> Candidate:
    return Candidate(f"local:{name}", priority, in_flight, waiting=waiting, local=True,
                     free=free, match=match)


def node(name: str, priority: int, free: int | None = None, in_flight: int = 0,
         loaded: bool = True, weight: int = 1, match: int = 0) -> Candidate:
    return Candidate(name, priority, in_flight, loaded=loaded, weight=weight, free=free,
                     match=match)


def names(choice: Choice) -> list[str]:
    return [c.fingerprint for c in choice.order]


def test_local_first_in_config_order_whatever_the_strategy() -> None:
    cands = [local("a", 2), local("b", 1), node("n", 9)]
    for strategy in ("priority", "round-robin", "least-loaded", "fastest", "weighted"):
        choice = choose(cands, Rules(strategy), RoundRobinCursor())
        assert names(choice) == ["local:a", "local:b"]
        assert choice.affinity is None


def test_cache_aware_among_several_locals_and_not_for_one() -> None:
    cands = [local("a", 2), local("b", 1, match=3)]
    choice = choose(cands, Rules("cache-aware"), RoundRobinCursor())
    assert names(choice) == ["local:b", "local:a"]
    assert choice.affinity == "hit"
    one = choose([local("a", 1, match=3)], Rules("cache-aware"), RoundRobinCursor())
    assert names(one) == ["local:a"]
    assert one.affinity is None


def test_nodes_by_strategy_when_no_local_holder() -> None:
    cands = [node("a", 3, in_flight=5), node("b", 2, in_flight=1), node("c", 1, in_flight=0)]
    assert names(choose(cands, Rules("priority"), RoundRobinCursor())) == ["a", "b", "c"]
    assert names(choose(cands, Rules("least-loaded"), RoundRobinCursor())) == ["c", "b", "a"]
    cursor = RoundRobinCursor()
    firsts = [choose(cands, Rules("round-robin"), cursor).order[0].fingerprint
              for _ in range(4)]
    assert firsts == ["a", "b", "c", "a"]
    weighted = WeightedCursor()
    heavy = [node("a", 2, weight=3), node("b", 1, weight=1)]
    picks = [choose(heavy, Rules("weighted"), RoundRobinCursor(), weighted).order[0].fingerprint
             for _ in range(4)]
    assert sorted(picks) == ["a", "a", "a", "b"]


def test_prefer_loaded_is_a_rule() -> None:
    cands = [node("a", 2, loaded=False), node("b", 1)]
    assert names(choose(cands, Rules("priority"), RoundRobinCursor())) == ["b", "a"]
    off = Rules("priority", prefer_loaded=False)
    assert names(choose(cands, off, RoundRobinCursor())) == ["a", "b"]


def test_spill_over_row() -> None:
    full = [local("a", 1, free=0)]
    nodes = [node("x", 2, free=0), node("y", 1, free=1), node("z", 3)]  # z: slots unknown
    rules = Rules("priority", spill_over=True)
    assert needs_nodes(full, rules)
    choice = choose(full + nodes, rules, RoundRobinCursor())
    assert names(choice) == ["y"]
    assert choice.affinity == "spill"
    # no node with a known free slot: the local order stands
    stay = choose([*full, node("x", 2, free=0)], rules, RoundRobinCursor())
    assert names(stay) == ["local:a"]
    assert stay.affinity is None
    # spill-over off, or a local with room (or unknown slots): local, nodes not asked
    assert not needs_nodes(full, Rules("priority"))
    assert not needs_nodes([local("a", 1, free=1)], rules)
    assert not needs_nodes([local("a", 1)], rules)
    assert names(choose(full + nodes, Rules("priority"), RoundRobinCursor())) == ["local:a"]


def test_queue_only_free_candidates_else_wait() -> None:
    queue = Rules("priority", queue=True)
    assert names(choose([local("a", 2, free=0), local("b", 1, free=1)], queue,
                        RoundRobinCursor())) == ["local:b"]
    assert choose([local("a", 1, free=0)], queue, RoundRobinCursor()) == Choice()
    assert names(choose([local("a", 1)], queue, RoundRobinCursor())) == ["local:a"]  # unlimited
    nodes = [node("a", 2, free=0), node("b", 1, free=2)]
    assert names(choose(nodes, queue, RoundRobinCursor())) == ["b"]
    assert choose([node("a", 1, free=0)], queue, RoundRobinCursor()).first is None
    # without the queue a full candidate is still chosen (sent on, as before SPEC §18)
    assert names(choose([node("a", 1, free=0)], Rules("priority"), RoundRobinCursor())) == ["a"]


def test_queue_cache_aware_among_the_free_reports_a_passed_over_match() -> None:
    cands = [node("a", 2, free=0, match=4), node("b", 1, free=1)]
    choice = choose(cands, Rules("cache-aware", queue=True), RoundRobinCursor())
    assert names(choice) == ["b"]
    assert choice.affinity == "miss"  # the matched one was full


def test_queue_with_spill_over_local_full_node_free() -> None:
    rules = Rules("priority", spill_over=True, queue=True)
    choice = choose([local("a", 1, free=0), node("n", 1, free=1)], rules, RoundRobinCursor())
    assert names(choice) == ["n"]
    assert choice.affinity == "spill"
    assert choose([local("a", 1, free=0), node("n", 1, free=0)], rules,
                  RoundRobinCursor()).first is None
