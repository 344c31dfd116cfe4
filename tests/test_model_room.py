"""Which loaded models to unload so another fits (protocol/model_room.py, SPEC §11)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.config import parse_config_text
from protocol.model_room import (
    Loaded,
    NoRoom,
    Room,
    format_bytes,
    is_pinned,
    make_room,
    memory_budget_bytes,
    no_room_message,
)

GIB = 1 << 30


def idle(name: str, memory: int, last_used: float) -> Loaded:
    return Loaded(name, memory, in_flight=0, last_used=last_used)


# Examples, one per rule.

def test_nothing_is_unloaded_when_it_already_fits() -> None:
    loaded = [idle("a", 3, 1.0), idle("b", 3, 2.0)]
    assert make_room("x", 4, loaded, budget=10, max_loaded=0) == Room(())
    assert make_room("x", 4, [], budget=4, max_loaded=1) == Room(())


def test_least_recently_used_go_first_and_only_as_many_as_needed() -> None:
    loaded = [idle("new", 4, 30.0), idle("old", 4, 10.0), idle("mid", 4, 20.0)]
    assert make_room("x", 4, loaded, budget=12, max_loaded=0) == Room(("old",))
    assert make_room("x", 8, loaded, budget=12, max_loaded=0) == Room(("old", "mid"))


def test_lru_order_not_knapsack() -> None:
    # Unloading "big" alone would do, but the older "small" goes first, then "big".
    loaded = [idle("small", 1, 1.0), idle("big", 5, 2.0)]
    assert make_room("x", 5, loaded, budget=6, max_loaded=0) == Room(("small", "big"))


def test_ties_are_broken_by_name() -> None:
    loaded = [idle("c", 4, 5.0), idle("a", 4, 5.0), idle("b", 4, 5.0)]
    assert make_room("x", 4, loaded, budget=8, max_loaded=0) == Room(("a", "b"))


def test_a_model_with_a_request_in_flight_is_pinned() -> None:
    loaded = [Loaded("old", 4, in_flight=1, last_used=1.0), idle("newer", 4, 2.0)]
    assert is_pinned(loaded[0])
    assert make_room("x", 4, loaded, budget=8, max_loaded=0) == Room(("newer",))


def test_loading_and_unloading_models_are_never_chosen() -> None:
    loaded = [Loaded("loading", 4, in_flight=0, last_used=1.0, busy=True),
              Loaded("unloading", 4, in_flight=0, last_used=0.0, busy=True),
              idle("idle", 4, 9.0)]
    assert make_room("x", 4, loaded, budget=12, max_loaded=0) == Room(("idle",))
    # The unloading model's memory still counts: not enough even with "idle" gone.
    answer = make_room("x", 5, loaded, budget=12, max_loaded=0)
    assert isinstance(answer, NoRoom)
    assert (answer.pinned_bytes, answer.pinned_count, answer.reason) == (8, 2, "memory")


def test_the_count_limit_alone() -> None:
    loaded = [idle("a", 1, 1.0), idle("b", 1, 2.0), idle("c", 1, 3.0)]
    assert make_room("x", 1, loaded, budget=100, max_loaded=3) == Room(("a",))
    assert make_room("x", 1, loaded, budget=100, max_loaded=2) == Room(("a", "b"))
    assert make_room("x", 1, loaded, budget=100, max_loaded=0) == Room(())


def test_memory_and_count_together() -> None:
    loaded = [idle("a", 1, 1.0), idle("b", 1, 2.0), idle("c", 8, 3.0), idle("d", 1, 4.0)]
    # The count needs one out, the memory three.
    assert make_room("x", 4, loaded, budget=7, max_loaded=4) == Room(("a", "b", "c"))
    # The memory needs one out, the count two.
    assert make_room("x", 1, loaded, budget=11, max_loaded=3) == Room(("a", "b"))


def test_a_model_larger_than_the_budget_never_fits() -> None:
    loaded = [idle("a", 1, 1.0)]
    answer = make_room("x", 11, loaded, budget=10, max_loaded=0)
    assert answer == NoRoom(model="x", estimate=11, budget=10, max_loaded=0, pinned_bytes=0,
                            pinned_count=0, reason="memory")
    assert no_room_message(answer) == \
        "model 'x' needs an estimated 11 B, more than the memory budget of 10 B"


def test_cannot_fit_because_models_in_use_hold_the_memory() -> None:
    loaded = [Loaded("busy", 3 * GIB + GIB // 2, in_flight=2, last_used=1.0),
              idle("idle", GIB, 2.0)]
    answer = make_room("x", GIB + GIB // 5, loaded, budget=4 * GIB, max_loaded=0)
    assert isinstance(answer, NoRoom)
    assert (answer.pinned_bytes, answer.pinned_count, answer.reason) == \
        (3 * GIB + GIB // 2, 1, "memory")
    assert no_room_message(answer) == ("model 'x' needs an estimated 1.2 GiB; the memory "
                                       "budget is 4.0 GiB and 3.5 GiB is held by models in use")


def test_cannot_fit_because_of_the_count() -> None:
    loaded = [Loaded("a", 1, in_flight=1, last_used=1.0), Loaded("b", 1, 1, 2.0)]
    answer = make_room("x", 1, loaded, budget=100, max_loaded=2)
    assert isinstance(answer, NoRoom)
    assert answer.reason == "count"
    assert no_room_message(answer) == \
        "model 'x' cannot be loaded: max_loaded is 2 and 2 loaded models are in use"
    # Short of both: the memory is named.
    short = make_room("x", 99, loaded, budget=100, max_loaded=2)
    assert isinstance(short, NoRoom)
    assert short.reason == "memory"


def test_the_model_itself_among_the_loaded_is_nothing_to_do() -> None:
    loaded = [idle("x", 50, 1.0), idle("a", 50, 0.0)]
    assert make_room("x", 50, loaded, budget=60, max_loaded=1) == Room(())


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (0, 512, 1023, 1024, 1536, 3 << 20, (1 << 20) - 1,
                                      GIB + GIB // 5, 2048 * GIB)] == \
        ["0 B", "512 B", "1.0 KiB", "1.0 KiB", "1.5 KiB", "3.0 MiB", "1.0 MiB", "1.2 GiB",
         "2048.0 GiB"]


def test_memory_budget_bytes() -> None:
    auto = parse_config_text("").model_loading.memory_budget  # memory_budget: auto
    assert memory_budget_bytes(auto, 16 * GIB) == 12 * GIB
    assert memory_budget_bytes(auto, 7) == 5  # floor of 5.25
    assert memory_budget_bytes(12 * GIB, 16 * GIB) == 12 * GIB
    assert memory_budget_bytes(32 * GIB, 16 * GIB) == 32 * GIB  # as given


# Properties, against a brute-force reference over small inputs.

models_st = st.lists(
    st.builds(Loaded, name=st.sampled_from("abcdefghij"), memory=st.integers(0, 8),
              in_flight=st.integers(0, 2), last_used=st.integers(0, 4).map(float),
              busy=st.booleans()),
    max_size=7, unique_by=lambda m: m.name)
estimate_st = st.integers(0, 16)
budget_st = st.integers(0, 40)
max_loaded_st = st.integers(0, 6)


def reference_fits(kept: list[Loaded], estimate: int, budget: int, max_loaded: int) -> bool:
    memory_ok = sum(m.memory for m in kept) + estimate <= budget
    return memory_ok and (max_loaded == 0 or len(kept) + 1 <= max_loaded)


def reference(models: list[Loaded], estimate: int, budget: int,
              max_loaded: int) -> tuple[str, ...] | None:
    """The shortest prefix of the idle models in LRU order after which the model fits, by
    trying every prefix; None if none does."""
    free = sorted((m for m in models if m.in_flight == 0 and not m.busy),
                  key=lambda m: (m.last_used, m.name))
    for k in range(len(free) + 1):
        gone = {m.name for m in free[:k]}
        if reference_fits([m for m in models if m.name not in gone], estimate, budget,
                          max_loaded):
            return tuple(m.name for m in free[:k])
    return None


@settings(max_examples=250, deadline=None)
@given(models_st, estimate_st, budget_st, max_loaded_st)
def test_matches_the_reference(models: list[Loaded], estimate: int, budget: int,
                               max_loaded: int) -> None:
    answer = make_room("new", estimate, models, budget=budget, max_loaded=max_loaded)
    expected = reference(models, estimate, budget, max_loaded)
    everything_idle_gone = [m for m in models if m.in_flight > 0 or m.busy]
    # (a) fits iff unloading every idle model fits.
    assert isinstance(answer, Room) == reference_fits(everything_idle_gone, estimate, budget,
                                                      max_loaded)
    if isinstance(answer, Room):
        # (b) exactly the shortest fitting LRU prefix; nothing pinned; the limits hold.
        assert answer.unload == expected
        pinned = {m.name for m in models if is_pinned(m)}
        assert not pinned & set(answer.unload)
        assert len(set(answer.unload)) == len(answer.unload)
        kept = [m for m in models if m.name not in answer.unload]
        assert sum(m.memory for m in kept) + estimate <= budget
        assert max_loaded == 0 or len(kept) + 1 <= max_loaded
        # (c) nothing unloaded when it already fits.
        if reference_fits(models, estimate, budget, max_loaded):
            assert answer.unload == ()
    else:
        assert expected is None
        assert answer.pinned_bytes == sum(m.memory for m in everything_idle_gone)
        assert answer.pinned_count == len(everything_idle_gone)
        assert answer.reason == ("memory" if answer.pinned_bytes + estimate > budget
                                 else "count")
        assert no_room_message(answer).startswith("model 'new' ")


@settings(max_examples=120, deadline=None)
@given(models_st, estimate_st, budget_st, max_loaded_st, st.data())
def test_the_input_order_does_not_matter(models: list[Loaded], estimate: int, budget: int,
                                         max_loaded: int, data: st.DataObject) -> None:
    # (d) determinism: any order of the loaded models gives the same answer.
    shuffled = data.draw(st.permutations(models))
    assert make_room("new", estimate, shuffled, budget=budget, max_loaded=max_loaded) == \
        make_room("new", estimate, models, budget=budget, max_loaded=max_loaded)
