"""A server's slots as values (SPEC §15 "Load"): llama.cpp's /slots and /props documents, a
sluice node's ``sluice.slots``, and the waiting / free-slot figures routing reads."""

from __future__ import annotations

from typing import Any

import pytest

from protocol.slots import (
    Slots,
    busy_now,
    capacity,
    free_slots,
    has_free_slot,
    node_slots,
    parse_slots,
    parse_total_slots,
    slots_entry,
    waiting,
)


def slot(i: int, busy: Any) -> dict[str, Any]:
    return {"id": i, "n_ctx": 1024, "speculative": False, "is_processing": busy}


def test_parse_slots_counts_the_busy_ones() -> None:
    assert parse_slots([slot(0, False), slot(1, False)]) == (0, 2)
    assert parse_slots([slot(0, True), slot(1, False), slot(2, True)]) == (2, 3)
    assert parse_slots([{"id": 0}]) == (0, 1)  # no is_processing: idle
    assert parse_slots([{"is_processing": 1}, {"is_processing": 0}]) == (1, 2)  # truthy


@pytest.mark.parametrize("doc", [
    [], None, {}, {"slots": []}, "[]", 2, [1, 2], [slot(0, True), None], [[slot(0, True)]],
])
def test_parse_slots_refuses_anything_else(doc: Any) -> None:
    assert parse_slots(doc) is None


def test_parse_total_slots() -> None:
    assert parse_total_slots({"total_slots": 2, "chat_template": "{{ x }}"}) == 2
    assert parse_total_slots({"total_slots": 1}) == 1


@pytest.mark.parametrize("doc", [
    {}, {"total_slots": 0}, {"total_slots": -1}, {"total_slots": "2"}, {"total_slots": 2.0},
    {"total_slots": True}, {"total_slots": None}, [{"total_slots": 2}], None, "x",
])
def test_parse_total_slots_refuses_anything_else(doc: Any) -> None:
    assert parse_total_slots(doc) is None


def entry(extra: Any) -> dict[str, Any]:
    return {"id": "m", "object": "model", "sluice": extra}


def test_node_slots() -> None:
    assert node_slots(entry({"state": "loaded", "slots": {"busy": 1, "total": 4}})) == (1, 4)
    assert node_slots(entry({"slots": {"busy": 0, "total": 1}})) == (0, 1)
    assert node_slots(entry({"slots": {"busy": 9, "total": 4}})) == (4, 4)  # clamped


@pytest.mark.parametrize("extra", [
    None, "x", {}, {"state": "loaded"}, {"slots": None}, {"slots": [1, 2]},
    {"slots": {"busy": 1}}, {"slots": {"total": 2}}, {"slots": {"busy": 0, "total": 0}},
    {"slots": {"busy": -1, "total": 2}}, {"slots": {"busy": 1, "total": -2}},
    {"slots": {"busy": "1", "total": 2}}, {"slots": {"busy": 1.0, "total": 2}},
    {"slots": {"busy": True, "total": 2}}, {"slots": {"busy": 0, "total": True}},
])
def test_node_slots_refuses_malformed(extra: Any) -> None:
    assert node_slots(entry(extra)) is None


def test_node_slots_without_sluice() -> None:
    assert node_slots({"id": "m"}) is None


def test_slots_entry() -> None:
    assert slots_entry(1, 2) == {"busy": 1, "total": 2}


def test_waiting_with_slots() -> None:
    two = Slots(total=2, busy=0)
    assert [waiting(n, two) for n in range(5)] == [0, 0, 0, 1, 2]
    taken = Slots(total=2, busy=2)  # both reported busy: ours are among them
    assert [waiting(n, taken) for n in range(4)] == [0, 0, 0, 1]
    full = Slots(total=2, busy=5)  # more busy than slots (a stale look): nothing free
    assert [waiting(n, full) for n in range(3)] == [3, 3, 3]


def test_waiting_unknown_counts_one_free_slot() -> None:
    assert [waiting(n, None) for n in range(4)] == [0, 0, 1, 2]


def test_free_slots_take_the_larger_of_ours_and_reported_busy() -> None:
    """SPEC §18: free = slots - max(in flight by sluice, reported busy)."""
    assert free_slots(3, None) is None
    four = Slots(total=4, busy=1)
    assert [free_slots(n, four) for n in range(6)] == [3, 3, 2, 1, 0, 0]
    assert free_slots(0, Slots(total=2, busy=9)) == 0


def test_capacity_reported_capped_by_max_concurrent() -> None:
    assert capacity(None, None) is None  # unknown: unlimited
    assert capacity(None, 3) == Slots(3, 0)
    assert capacity(Slots(4, 2), None) == Slots(4, 2)
    assert capacity(Slots(4, 2), 1) == Slots(1, 2)  # capped: still busy as reported
    assert capacity(Slots(2, 0), 8) == Slots(2, 0)  # a cap above the slots changes nothing


def test_has_free_slot() -> None:
    assert has_free_slot(0, None) is None
    assert has_free_slot(5, None) is None
    two = Slots(total=2, busy=0)
    assert [has_free_slot(n, two) for n in range(3)] == [True, True, False]
    taken = Slots(total=2, busy=1)
    assert [has_free_slot(n, taken) for n in range(3)] == [True, True, False]
    assert has_free_slot(0, Slots(total=2, busy=2)) is False
    assert has_free_slot(0, Slots(total=2, busy=3)) is False


def test_busy_now() -> None:
    assert busy_now(0, Slots(total=4, busy=1)) == 1
    assert busy_now(2, Slots(total=4, busy=1)) == 2  # ours are among the busy ones
    assert busy_now(9, Slots(total=4, busy=1)) == 4  # never more than total


def test_slots_is_a_frozen_value() -> None:
    a = Slots(total=2, busy=1)
    assert a == Slots(2, 1)
    assert hash(a) == hash(Slots(2, 1))
    with pytest.raises(AttributeError):
        a.total = 3  # type: ignore[misc]
