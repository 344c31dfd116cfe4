"""protocol/affinity_choice.py: the cache-aware order of candidates and its affinity result
(SPEC §15): longest match, the load bound, the session, ties, failover order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from protocol.affinity_choice import HIT, MISS, SESSION, SPILL, Contender, choose


def names(order: list[Contender]) -> list[str]:
    return [c.name for c in order]


def test_result_words() -> None:
    assert (HIT, SESSION, MISS, SPILL) == ("hit", "session", "miss", "spill")


def test_one_or_no_contender() -> None:
    only = Contender("a", 0, match=5, session=True)
    assert choose([only], 1) == ([only], None)
    assert choose([], 1) == ([], None)


def test_no_match_goes_by_load() -> None:
    cs = [Contender("a", 0, in_flight=3, waiting=1), Contender("b", 0, in_flight=5),
          Contender("c", 0, in_flight=2)]
    order, result = choose(cs, 1)
    assert names(order) == ["c", "b", "a"]  # fewest waiting, then fewest in flight
    assert result == MISS


def test_load_ties_go_by_priority_then_name() -> None:
    cs = [Contender("b", 1), Contender("a", 1), Contender("z", 5)]
    assert names(choose(cs, 1)[0]) == ["z", "a", "b"]


def test_longest_match_goes_first() -> None:
    cs = [Contender("a", 9, match=2, in_flight=2), Contender("b", 0, match=7, in_flight=1),
          Contender("c", 0)]
    order, result = choose(cs, 1)
    assert names(order) == ["b", "c", "a"]  # the rest by load, for failover
    assert result == HIT


def test_equal_matches_go_by_load() -> None:
    # A shared system prompt matches everyone alike: conversations spread by load.
    cs = [Contender("a", 0, match=3, in_flight=2), Contender("b", 0, match=3, in_flight=1),
          Contender("c", 0, match=3, in_flight=1, waiting=1)]
    order, result = choose(cs, 1)
    assert names(order) == ["b", "a", "c"]
    assert result == HIT
    tied = [Contender("b", 1, match=3), Contender("a", 1, match=3), Contender("p", 2, match=3)]
    assert names(choose(tied, 1)[0]) == ["p", "a", "b"]


def test_a_cached_candidate_beyond_the_bound_is_passed_over() -> None:
    cs = [Contender("hot", 0, match=10, in_flight=6, waiting=3),
          Contender("cold", 0, in_flight=1, waiting=1)]
    order, result = choose(cs, 1)  # 3 > 1 + 1: passed over
    assert names(order) == ["cold", "hot"]
    assert result == MISS
    order, result = choose(cs, 2)  # 3 <= 1 + 2: within
    assert names(order) == ["hot", "cold"]
    assert result == HIT


def test_passed_over_for_a_shorter_match_is_a_miss() -> None:
    cs = [Contender("deep", 0, match=10, waiting=4), Contender("some", 0, match=3, waiting=1),
          Contender("none", 0, waiting=0)]
    order, result = choose(cs, 1)
    assert names(order) == ["some", "none", "deep"]
    assert result == MISS


def test_a_shorter_match_when_the_longest_is_within_is_not_taken() -> None:
    cs = [Contender("deep", 0, match=10, waiting=1), Contender("some", 0, match=3)]
    assert choose(cs, 1) == ([cs[0], cs[1]], HIT)


def test_load_bound_zero_and_negative() -> None:
    cs = [Contender("cached", 0, match=4, waiting=1), Contender("idle", 0)]
    assert names(choose(cs, 0)[0]) == ["idle", "cached"]
    assert names(choose(cs, -3)[0]) == ["idle", "cached"]
    even = [Contender("cached", 0, match=4, in_flight=9), Contender("idle", 0)]
    assert choose(even, 0) == ([even[0], even[1]], HIT)  # the bound counts waiting only


def test_session_goes_first_within_the_bound() -> None:
    cs = [Contender("cached", 0, match=8), Contender("mine", 0, match=2, session=True,
                                                      waiting=1, in_flight=3)]
    order, result = choose(cs, 1)
    assert names(order) == ["mine", "cached"]
    assert result == SESSION


def test_session_beyond_the_bound_falls_back_to_the_match() -> None:
    cs = [Contender("cached", 0, match=8), Contender("mine", 0, session=True, waiting=2),
          Contender("idle", 0)]
    order, result = choose(cs, 1)
    assert names(order) == ["cached", "idle", "mine"]
    assert result == HIT


def test_deterministic_whatever_the_input_order() -> None:
    cs = [Contender("a", 0, match=2), Contender("b", 0, match=2), Contender("c", 1),
          Contender("d", 0, waiting=1)]
    first = choose(cs, 1)
    assert choose(list(reversed(cs)), 1) == first
    assert names(first[0]) == ["a", "c", "b", "d"]


contenders = st.lists(st.builds(
    Contender, name=st.sampled_from("abcdef"), priority=st.integers(-2, 2),
    in_flight=st.integers(0, 6), waiting=st.integers(0, 4), match=st.integers(0, 5),
    session=st.booleans()), max_size=6)


@given(contenders, st.integers(-1, 3))
def test_always_a_permutation(cs: list[Contender], bound: int) -> None:
    order, result = choose(cs, bound)
    assert sorted(order, key=id) == sorted(cs, key=id)
    if len(cs) < 2:
        assert result is None
        return
    assert result in (HIT, SESSION, MISS)
    least = min(c.waiting for c in cs)
    head = order[0]
    if result in (HIT, SESSION):
        assert head.waiting <= least + max(0, bound)
    if result == HIT:
        assert head.match == max(c.match for c in cs) >= 1
    if result == SESSION:
        assert head.session
    if result == MISS and not any(c.match for c in cs):
        assert head.waiting == least
    assert order[1:] == sorted(order[1:], key=lambda c: (
        c.waiting, c.in_flight, -c.priority, c.name))
