"""How busy a server's slots are now (SPEC §15 "Load", §18 "Capacity"), from its last
report and our own live count.

A report (llama.cpp's ``/slots``, a node's ``sluice.slots``) counts our requests among its
busy slots. :class:`SlotReports` remembers, per report, how many of its busy slots were
*not* ours when it came (our in-flight count then), and gives the slots as busy as they are
now: those, plus ours now. So a slot our request held at the report is free again as soon
as that request ends, not at the next report; with no change since the report it is SPEC
§18's "the larger of the requests sluice has in flight there and the server's reported busy
slots". The router tells it of each report as the registries publish it, and asks it for
every candidate."""

from __future__ import annotations

from protocol.slots import Slots


class SlotReports:
    """The last report seen per server (by name) and its busy slots that were not ours."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[str, tuple[Slots, int]] = {}

    def __repr__(self) -> str:
        return f"SlotReports({len(self._seen)} servers)"

    def now(self, key: str, slots: Slots, in_flight: int) -> Slots:
        """``slots`` (server ``key``'s last report) as busy as they are now. A report not
        seen before is read with ``in_flight`` as our count at its arrival."""
        seen = self._seen.get(key)
        if seen is None or seen[0] is not slots:
            seen = self._seen[key] = (slots, max(0, slots.busy - in_flight))
        return Slots(slots.total, seen[1] + in_flight)

    def forget(self, keep: set[str]) -> None:
        for key in [k for k in self._seen if k not in keep]:
            del self._seen[key]
