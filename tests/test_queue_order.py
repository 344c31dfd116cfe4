"""SPEC §18 "Order" as pure code (protocol/queue_order.py), with plain numbers: the two
classes, round-robin between clients, FIFO within one, promotion of an old batch request,
the class and client of a request, and the 429's Retry-After."""

from __future__ import annotations

import pytest

from protocol.queue_order import (
    BATCH,
    INTERACTIVE,
    QueueOrder,
    client_of,
    request_class,
    retry_after,
)

PROMOTE = 120.0


def drain(order: QueueOrder, now: float) -> list[str]:
    """Serve everything, one at a time: the (client, arrival) labels in serving order."""
    out = []
    while (entry := order.next(now)) is not None:
        out.append(f"{entry.client}{entry.seq}")
        order.served(entry, now)
    return out


def test_fifo_within_one_client() -> None:
    order = QueueOrder(PROMOTE)
    for t in range(4):
        order.add("a", INTERACTIVE, float(t))
    assert drain(order, 5.0) == ["a1", "a2", "a3", "a4"]


def test_round_robin_between_clients() -> None:
    order = QueueOrder(PROMOTE)
    for t in range(8):
        order.add("a", BATCH, float(t))  # one client queues eight
    order.add("b", BATCH, 8.0)  # another, one, later
    served = drain(order, 9.0)
    assert served[:2] == ["a1", "b9"]  # b's one goes right after a's first
    assert served[2:] == ["a2", "a3", "a4", "a5", "a6", "a7", "a8"]


def test_a_client_just_served_waits_for_the_others_turn() -> None:
    order = QueueOrder(PROMOTE)
    a1 = order.add("a", INTERACTIVE, 0.0)
    order.add("a", INTERACTIVE, 0.1)
    order.served(a1, 0.2)  # a's first went at once
    order.add("b", INTERACTIVE, 1.0)
    order.add("c", INTERACTIVE, 2.0)
    assert drain(order, 3.0) == ["b3", "c4", "a2"]  # a2's round is one past a1's


def test_three_clients_take_turns() -> None:
    order = QueueOrder(PROMOTE)
    for t, client in enumerate("aaabbc"):
        order.add(client, INTERACTIVE, float(t))
    assert drain(order, 9.0) == ["a1", "b4", "c6", "a2", "b5", "a3"]


def test_interactive_before_batch() -> None:
    order = QueueOrder(PROMOTE)
    for t in range(6):
        order.add("batcher", BATCH, float(t))
    order.add("user", INTERACTIVE, 10.0)
    assert drain(order, 11.0)[0] == "user7"


def test_a_client_that_left_and_came_back_starts_in_the_current_round() -> None:
    order = QueueOrder(PROMOTE)
    gone = order.add("a", INTERACTIVE, 0.0)
    order.remove(gone)
    order.remove(gone)  # twice: nothing
    assert len(order) == 0
    order.add("b", INTERACTIVE, 1.0)
    order.add("a", INTERACTIVE, 2.0)
    assert drain(order, 3.0) == ["b2", "a3"]


def test_promotion_after_promote_after_at_its_arrival_position() -> None:
    order = QueueOrder(PROMOTE)
    old = order.add("batcher", BATCH, 0.0)
    for t in (10.0, 20.0):
        order.add("user", INTERACTIVE, t)
    assert order.class_at(old, 119.0) == BATCH
    assert order.next(119.0) is not old  # not yet: interactive first
    assert order.waiting(119.0) == {INTERACTIVE: 2, BATCH: 1}
    assert order.class_at(old, 120.0) == INTERACTIVE
    assert order.waiting(120.0) == {INTERACTIVE: 3, BATCH: 0}
    assert order.next(120.0) is old  # it arrived first
    assert [e.seq for e in order.ordered(120.0)] == [1, 2, 3]


def test_a_promoted_request_joins_the_current_round_not_a_later_one() -> None:
    order = QueueOrder(PROMOTE)
    order.add("batcher", BATCH, 0.0)
    order.add("user", INTERACTIVE, 100.0)
    order.add("user", INTERACTIVE, 101.0)  # the user's second: round 1
    order.add("other", INTERACTIVE, 102.0)  # round 0
    assert drain(order, 130.0) == ["batcher1", "user2", "other4", "user3"]


def test_oldest_and_unknown_class() -> None:
    order = QueueOrder(PROMOTE)
    assert order.oldest() is None
    assert order.next(0.0) is None
    order.add("a", BATCH, 5.0)
    order.add("b", INTERACTIVE, 3.0)
    assert order.oldest() == 3.0
    with pytest.raises(ValueError, match="unknown class"):
        order.add("a", "urgent", 0.0)


def test_request_class() -> None:
    assert request_class(None, None, {}) == INTERACTIVE
    assert request_class(BATCH, None, None) == BATCH
    assert request_class(None, b"batch", {}) == BATCH
    assert request_class(None, b" Batch ", {}) == BATCH
    assert request_class(BATCH, b"interactive", {}) == BATCH  # a header never raises
    assert request_class(INTERACTIVE, b"batch", {}) == BATCH  # but lowers
    assert request_class(None, None, {"service_tier": "flex"}) == BATCH
    assert request_class(None, None, {"service_tier": "auto"}) == INTERACTIVE
    assert request_class(None, b"urgent", {}) == INTERACTIVE


def test_client_of() -> None:
    assert client_of("k1", "s", "10.0.0.2") == "key:k1"
    assert client_of(None, "s", "10.0.0.2") == "session:s"
    assert client_of(None, None, "10.0.0.2") == "peer:10.0.0.2"
    assert client_of(None, None, None) == "peer:unix"


def test_retry_after() -> None:
    assert retry_after([], 0, None) == 1
    assert retry_after([], 10, 2) == 5
    assert retry_after([2.0, 4.0], 256, 4) == 192  # 3 s each, 64 rounds of 4
    assert retry_after([0.01], 3, 1) == 1  # at least one second
    assert retry_after([1.5], 3, 1) == 5  # whole seconds, rounded up
