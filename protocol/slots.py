"""A server's slots (SPEC §15 "Load"): how many requests it runs at once and how many of
them are busy, as llama.cpp reports them (``GET /slots``, ``GET /props``) and as a sluice
node reports them per model in its ``/v1/models`` (``"sluice": {"slots": {"busy": B,
"total": T}}``); and the load figures routing reads from them.

Pure values: the polls that fetch the documents are :mod:`proxy.registry.slots_probe`
(local backends) and :mod:`proxy.registry.node_checks` (nodes).

*In flight* is always sluice's own count of requests it sent to the server and that are not
finished; :attr:`Slots.busy` is the busy count the server reported at the last look. SPEC
§18: the busy slots now are the larger of the two (ours are among the busy ones it reports),
so free = total - max(in flight, busy); the registries keep what was reported and routing
reads it with its own live count (nothing is computed at poll time).
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class Slots:
    """A server's slot count and how many of them it reported busy at the last look."""

    total: int
    busy: int


def _count(value: Any) -> int | None:
    """A non-negative int (not a bool), else None."""
    if type(value) is int and value >= 0:
        return value
    return None


def parse_slots(doc: Any) -> tuple[int, int] | None:
    """(busy, total) from llama.cpp's ``GET /slots`` body: one object per slot, busy = those
    whose ``is_processing`` is truthy. An empty list, a list with anything but objects, or
    anything else → None (unknown)."""
    if not isinstance(doc, list) or not doc:
        return None
    busy = 0
    for slot in doc:
        if not isinstance(slot, dict):
            return None
        if slot.get("is_processing"):
            busy += 1
    return busy, len(doc)


def parse_total_slots(doc: Any) -> int | None:
    """llama.cpp's ``GET /props`` ``total_slots`` (a positive int), else None."""
    if not isinstance(doc, dict):
        return None
    total = _count(doc.get("total_slots"))
    return total if total else None


def node_slots(entry: dict[str, Any]) -> tuple[int, int] | None:
    """(busy, total) from a sluice node's ``/v1/models`` entry ``"sluice": {"slots": {"busy":
    B, "total": T}}``: ints, busy ≥ 0 (clamped to total), total ≥ 1; anything malformed or
    absent → None."""
    extra = entry.get("sluice")
    if not isinstance(extra, dict):
        return None
    slots = extra.get("slots")
    if not isinstance(slots, dict):
        return None
    busy, total = _count(slots.get("busy")), _count(slots.get("total"))
    if busy is None or not total:
        return None
    return min(busy, total), total


def slots_entry(busy: int, total: int) -> dict[str, int]:
    """The ``slots`` object of a ``/v1/models`` entry's ``sluice`` facts."""
    return {"busy": busy, "total": total}


def capacity(reported: Slots | None, max_concurrent: int | None) -> Slots | None:
    """A candidate's slots (SPEC §18 "Capacity"): the reported ones capped by
    ``max_concurrent`` when that is set; ``max_concurrent`` alone when none are reported;
    None (unknown: unlimited) with neither."""
    if max_concurrent is None:
        return reported
    if reported is None:
        return Slots(max_concurrent, 0)
    return Slots(min(reported.total, max_concurrent), reported.busy)


def free_slots(in_flight: int, slots: Slots | None) -> int | None:
    """Free slots now: total - max(in flight, busy), at least 0; None when unknown."""
    if slots is None:
        return None
    return max(0, slots.total - max(in_flight, slots.busy))


def waiting(in_flight: int, slots: Slots | None) -> int:
    """Requests in flight beyond the slots (the busy ones taken as ours when they are more):
    unknown slots count as one."""
    if slots is None:
        return max(0, in_flight - 1)
    return max(0, max(in_flight, slots.busy) - slots.total)


def has_free_slot(in_flight: int, slots: Slots | None) -> bool | None:
    """Whether one more request would find a free slot; None when the slots are unknown."""
    free = free_slots(in_flight, slots)
    return None if free is None else free > 0


def busy_now(in_flight: int, slots: Slots) -> int:
    """The busy slots now as a node reports them: max(busy, in flight), at most total."""
    return min(slots.total, max(slots.busy, in_flight))
