"""protocol/prefix_index.py: the bounded prefix index (longest match, LRU eviction deep
blocks first, drop, forget) and the session map (SPEC §15)."""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.affinity import chain
from protocol.prefix_index import PrefixIndex, SessionMap

A, B, C = "node:a", "node:b", "local:llama"


def keys(tag: str, n: int, model: str = "m") -> tuple[int, ...]:
    """A chain of ``n`` blocks, distinct per tag."""
    return chain(model, (tag * 8)[:8] * n, 8)


def test_empty_index() -> None:
    index = PrefixIndex(100)
    assert len(index) == 0
    assert index.matches("m", keys("a", 3), [A, B]) == {A: 0, B: 0}
    assert index.matches("m", (), [A]) == {A: 0}
    assert index.matches("m", keys("a", 3), []) == {}


def test_longest_match_per_candidate() -> None:
    index = PrefixIndex(1000)
    system = "S" * 24  # three shared blocks
    one = chain("m", system + "1" * 64, 8)
    two = chain("m", system + "2" * 64, 8)
    index.record("m", one, A)
    index.record("m", two, B)
    assert len(index) == len(one) + len(two)
    assert index.blocks == len(one) + len(two) - 3  # the shared prefix is held by both
    asked = chain("m", system + "1" * 64 + "and then more", 8)
    assert index.matches("m", asked, [A, B, C]) == {A: len(one), B: 3, C: 0}
    assert index.matches("m", two, [A, B]) == {A: 3, B: len(two)}
    assert index.matches("m", two, [B]) == {B: len(two)}


def test_a_match_counts_consecutive_blocks_only() -> None:
    index = PrefixIndex(100)
    ch = keys("a", 6)
    index.record("m", ch, A)
    index.drop("m", ch[2:3], A)  # a hole at block 2
    assert index.matches("m", ch, [A]) == {A: 2}
    index.record("m", ch[:1], B)
    assert index.matches("m", ch, [A, B]) == {A: 2, B: 1}


def test_matches_are_per_model() -> None:
    index = PrefixIndex(100)
    index.record("m", keys("a", 4), A)
    assert index.matches("other", keys("a", 4), [A]) == {A: 0}
    assert index.matches("other", keys("a", 4, "other"), [A]) == {A: 0}
    index.record("other", keys("a", 4, "other"), A)
    assert index.matches("other", keys("a", 4, "other"), [A]) == {A: 4}
    assert len(index) == 8


def test_record_again_adds_no_pairs() -> None:
    index = PrefixIndex(100)
    index.record("m", keys("a", 5), A)
    index.record("m", keys("a", 5), A)
    index.record("m", keys("a", 3), A)
    assert len(index) == 5
    assert index.held(A) == 5
    assert index.held(B) == 0


def test_eviction_takes_the_least_recent_and_deep_blocks_first() -> None:
    index = PrefixIndex(10)
    old = keys("o", 6)
    index.record("m", old, A)
    new = keys("n", 4)
    index.record("m", new, B)
    assert len(index) == 10
    index.record("m", keys("x", 2), C)  # two pairs over: old's two deepest blocks go
    assert len(index) == 10
    assert index.matches("m", old, [A]) == {A: 4}
    assert index.matches("m", new, [B]) == {B: 4}
    index.record("m", old[:1], A)  # touched: old's block 0 is now the most recent
    index.record("m", keys("y", 4), C)  # four more go: old's blocks 1..3 and new's 3
    assert index.matches("m", old, [A]) == {A: 1}
    assert index.matches("m", new, [B]) == {B: 3}
    assert len(index) == 10


def test_matches_do_not_refresh() -> None:
    index = PrefixIndex(4)
    index.record("m", keys("a", 2), A)
    index.record("m", keys("b", 2), B)
    index.matches("m", keys("a", 2), [A])
    index.record("m", keys("c", 2), C)
    assert index.matches("m", keys("a", 2), [A]) == {A: 0}
    assert index.matches("m", keys("b", 2), [B]) == {B: 2}


def test_a_chain_longer_than_the_cap_keeps_its_head() -> None:
    index = PrefixIndex(5)
    ch = keys("a", 12)
    index.record("m", ch, A)
    assert len(index) == 5
    assert index.matches("m", ch, [A]) == {A: 5}


def test_eviction_of_a_shared_block_removes_all_its_pairs() -> None:
    index = PrefixIndex(4)
    ch = keys("a", 2)
    index.record("m", ch, A)
    index.record("m", ch, B)
    assert len(index) == 4
    index.record("m", keys("z", 1), C)  # over by one: the oldest block goes, with two pairs
    assert len(index) == 3
    assert index.matches("m", ch, [A, B]) == {A: 1, B: 1}


def test_max_blocks_zero_records_nothing() -> None:
    index = PrefixIndex(0)
    index.record("m", keys("a", 3), A)
    assert len(index) == 0
    assert index.matches("m", keys("a", 3), [A]) == {A: 0}


def test_max_blocks_changes_apply_at_once() -> None:
    index = PrefixIndex(100)
    index.record("m", keys("a", 5), A)
    index.record("m", keys("b", 5), B)
    index.max_blocks = 6
    assert index.max_blocks == 6
    assert len(index) == 6  # a's four deep blocks went, its block 0 stays
    assert index.matches("m", keys("a", 5), [A]) == {A: 1}
    assert index.matches("m", keys("b", 5), [B]) == {B: 5}
    index.max_blocks = 3
    assert index.matches("m", keys("b", 5), [B]) == {B: 3}
    index.max_blocks = 0
    assert len(index) == 0
    assert index.held(B) == 0
    index.max_blocks = 10
    index.record("m", keys("c", 2), C)
    assert len(index) == 2
    with pytest.raises(ValueError, match="max_blocks"):
        index.max_blocks = -1
    with pytest.raises(ValueError, match="max_blocks"):
        PrefixIndex(-1)


def test_drop_forgets_one_candidate_on_this_chain() -> None:
    index = PrefixIndex(100)
    ch = keys("a", 6)
    index.record("m", ch, A)
    index.record("m", ch[:3], B)
    index.drop("m", ch, A)
    assert index.matches("m", ch, [A, B]) == {A: 0, B: 3}
    assert len(index) == 3
    assert index.blocks == 3
    index.drop("m", ch, A)  # nothing left of it: a no-op
    index.drop("m", ch, "never seen")
    index.drop("other", ch, B)
    assert len(index) == 3


def test_forget_a_candidate() -> None:
    index = PrefixIndex(100)
    index.record("m", keys("a", 4), A)
    index.record("n", keys("a", 2, "n"), A)
    index.record("m", keys("a", 4), B)
    assert index.forget(A) == 6
    assert index.forget(A) == 0
    assert len(index) == 4
    assert index.matches("m", keys("a", 4), [A, B]) == {A: 0, B: 4}
    assert index.forget("unknown") == 0


def test_forget_a_candidate_for_one_model() -> None:
    index = PrefixIndex(100)
    index.record("m", keys("a", 4), A)
    index.record("n", keys("a", 2, "n"), A)
    index.record("n", keys("a", 2, "n"), B)
    assert index.forget(A, "n") == 2
    assert index.forget(A, "nope") == 0
    assert len(index) == 6
    assert index.matches("n", keys("a", 2, "n"), [A, B]) == {A: 0, B: 2}
    assert index.matches("m", keys("a", 4), [A]) == {A: 4}


def test_names_are_reused_after_they_are_freed() -> None:
    index = PrefixIndex(100)
    for round_ in range(100):  # 100 candidates, one at a time: bits stay low
        name = f"node:{round_}"
        index.record(f"model{round_}", keys("a", 3, f"model{round_}"), name)
        assert index.forget(name) == 3
    index.record("m", keys("a", 3), A)
    assert index.matches("m", keys("a", 3), [A, "node:5"]) == {A: 3, "node:5": 0}


def test_a_hundred_thousand_blocks() -> None:
    index = PrefixIndex(100_000)
    rng = random.Random(7)
    names = [A, B, C, "node:d"]
    for n in range(5_000):
        index.record("m", [rng.getrandbits(64) for _ in range(20)], names[n % 4])
    assert len(index) == 100_000
    assert index.blocks == 100_000
    index.record("m", [rng.getrandbits(64) for _ in range(20)], A)
    assert len(index) == 100_000


# -- the index against a plain reference model ----------------------------------------------


class Reference:
    """Obvious and slow: block → (model, set of names), oldest first."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.blocks: OrderedDict[int, tuple[str, set[str]]] = OrderedDict()

    def pairs(self) -> int:
        return sum(len(names) for _, names in self.blocks.values())

    def record(self, model: str, ch: Sequence[int], name: str) -> None:
        if not self.cap:
            return
        for key in reversed(ch):
            self.blocks.setdefault(key, (model, set()))[1].add(name)
            self.blocks.move_to_end(key)
        while self.pairs() > self.cap:
            self.blocks.popitem(last=False)

    def matches(self, model: str, ch: Sequence[int], names: list[str]) -> dict[str, int]:
        out = {}
        for name in names:
            n = 0
            for key in ch:
                entry = self.blocks.get(key)
                if entry is None or entry[0] != model or name not in entry[1]:
                    break
                n += 1
            out[name] = n
        return out

    def remove(self, key: int, name: str) -> None:
        self.blocks[key][1].discard(name)
        if not self.blocks[key][1]:
            del self.blocks[key]

    def drop(self, model: str, ch: Sequence[int], name: str) -> None:
        for key in ch:
            if key in self.blocks and self.blocks[key][0] == model:
                self.remove(key, name)

    def forget(self, name: str, model: str | None) -> int:
        hits = [k for k, (m, names) in self.blocks.items()
                if name in names and model in (None, m)]
        for key in hits:
            self.remove(key, name)
        return len(hits)


NAMES = [A, B, C, "node:d"]
MODELS = ["m", "n"]
op = st.one_of(
    st.tuples(st.just("record"), st.sampled_from(MODELS), st.integers(0, 5),
              st.integers(0, 8), st.sampled_from(NAMES)),
    st.tuples(st.just("drop"), st.sampled_from(MODELS), st.integers(0, 5),
              st.integers(0, 8), st.sampled_from(NAMES)),
    st.tuples(st.just("forget"), st.sampled_from([*MODELS, None]), st.just(0), st.just(0),
              st.sampled_from(NAMES)),
    st.tuples(st.just("cap"), st.just(""), st.integers(0, 30), st.just(0), st.just("")),
)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.integers(0, 30), st.lists(op, max_size=40))
def test_the_index_agrees_with_a_reference(cap: int, ops: list[tuple[
        str, str | None, int, int, str]]) -> None:
    index, ref = PrefixIndex(cap), Reference(cap)
    # Conversations share prefixes: tag t's chain starts with tag t // 2's first blocks.
    texts = ["".join(f"{t // 2:08d}" if i < 2 else f"{t:08d}" for i in range(9))
             for t in range(6)]
    for name, model, tag, depth, candidate in ops:
        if name == "cap":
            index.max_blocks = ref.cap = tag
            while ref.pairs() > ref.cap:
                ref.blocks.popitem(last=False)
            continue
        if name == "forget":
            assert index.forget(candidate, model) == ref.forget(candidate, model)
            continue
        assert model is not None
        ch = chain(model, texts[tag], 8)[:depth]
        if name == "record":
            index.record(model, ch, candidate)
            ref.record(model, ch, candidate)
        else:
            index.drop(model, ch, candidate)
            ref.drop(model, ch, candidate)
        assert len(index) == ref.pairs()
        assert index.blocks == len(ref.blocks)
        for m in MODELS:
            for t in range(6):
                probe = chain(m, texts[t], 8)
                assert index.matches(m, probe, NAMES) == ref.matches(m, probe, NAMES)
    for candidate in NAMES:
        assert index.held(candidate) == sum(
            candidate in names for _, names in ref.blocks.values())


# -- SessionMap -------------------------------------------------------------------------------


def test_session_map() -> None:
    sessions = SessionMap(cap=3)
    assert sessions.get("s1") is None
    sessions.set("s1", A)
    sessions.set("s2", B)
    sessions.set("s3", A)
    sessions.set("s1", C)  # set again: most recent now
    sessions.set("s4", B)  # s2 goes
    assert len(sessions) == 3
    assert sessions.get("s2") is None
    assert sessions.get("s1") == C
    assert sessions.forget(A) == 1
    assert sessions.get("s3") is None
    assert sessions.forget(A) == 0
    assert len(sessions) == 2


def test_session_map_cap_changes() -> None:
    sessions = SessionMap()
    assert sessions.cap == 10000
    for i in range(5):
        sessions.set(f"s{i}", A)
    sessions.cap = 2
    assert len(sessions) == 2
    assert sessions.get("s4") == A
    assert sessions.get("s2") is None
    sessions.cap = 0
    sessions.set("x", A)
    assert len(sessions) == 0
    with pytest.raises(ValueError, match="cap"):
        SessionMap(-1)
