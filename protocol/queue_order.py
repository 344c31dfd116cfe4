"""Who goes first among the requests waiting for one model (SPEC §18 "Order"), pure: plain
values in, the next request out. No clock of its own: every time is passed in.

- Two classes: ``interactive`` (the default) before ``batch`` (:func:`request_class`: the
  access key's ``priority``, the ``x-sluice-priority`` header, OpenAI's ``service_tier:
  "flex"``; a header lowers a key's class, never raises it).
- Within a class, turns go round-robin between clients (:func:`client_of`: the access key,
  else the session key, else the peer address; every Unix-socket peer is one client), first
  come first served within one client. Each request gets a *round* when it arrives: the
  class's current round (the round of the last request served from it), or one past the
  client's own latest waiting request, whichever is later. The next request is the one with
  the lowest (round, arrival); so a client's fifty requests take fifty rounds while another
  client's one takes the current round, and goes next.
- A ``batch`` request that has waited ``promote_after`` seconds is served as
  ``interactive`` at its arrival position: it sorts in the interactive class's current round
  by its arrival.

:class:`QueueOrder` is one model's waiting line; :func:`retry_after` is the 429's estimate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

INTERACTIVE, BATCH = "interactive", "batch"
CLASSES = (INTERACTIVE, BATCH)
UNIX_CLIENT = "unix"  # every Unix-socket peer is one client


def request_class(key_priority: str | None, header: bytes | str | None,
                  doc: dict[str, Any] | None) -> str:
    """A request's class: ``batch`` when its key says so, or the ``x-sluice-priority``
    header says ``batch``, or the body asks for ``service_tier: "flex"``; else
    ``interactive`` (a header of ``interactive`` never raises a batch key)."""
    if key_priority == BATCH:
        return BATCH
    if header is not None:
        text = header.decode("latin-1") if isinstance(header, bytes) else header
        if text.strip(" \t").lower() == BATCH:
            return BATCH
    if isinstance(doc, dict) and doc.get("service_tier") == "flex":
        return BATCH
    return INTERACTIVE


def client_of(key_id: str | None, session: str | None, peer: str | None) -> str:
    """Who a request counts as for the round-robin: ``key:<id>`` for a valid access key,
    else ``session:<key>``, else ``peer:<address>`` (``unix`` for a Unix-socket peer,
    ``peer`` None)."""
    if key_id is not None:
        return f"key:{key_id}"
    if session is not None:
        return f"session:{session}"
    return f"peer:{UNIX_CLIENT if peer is None else peer}"


@attrs.define(eq=False)
class Entry:
    """One waiting request as the order sees it."""

    seq: int  # arrival order, unique within a QueueOrder
    client: str
    priority: str  # its class when it arrived
    arrived: float  # the caller's clock, seconds
    round: int = 0


class QueueOrder:
    """The requests waiting for one model, and whose turn is next (module docstring)."""

    __slots__ = ("_count", "_current", "_latest", "_seq", "entries", "promote_after")

    def __init__(self, promote_after: float) -> None:
        self.promote_after = promote_after
        self.entries: dict[int, Entry] = {}  # by seq, in arrival order
        self._seq = 0
        self._current = dict.fromkeys(CLASSES, 0)  # per class, the round served last
        self._latest: dict[tuple[str, str], int] = {}  # (class, client) -> its latest round
        self._count: dict[tuple[str, str], int] = {}  # (class, client) -> waiting

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        return f"QueueOrder({len(self.entries)} waiting, rounds={self._current})"

    def add(self, client: str, priority: str, now: float) -> Entry:
        """A request arrives: its entry, with its round (at the end of its client's line)."""
        if priority not in CLASSES:
            raise ValueError(f"unknown class {priority!r}")
        self._seq += 1
        who = (priority, client)
        latest = self._latest.get(who)
        current = self._current[priority]
        entry = Entry(self._seq, client, priority, now,
                      current if latest is None else max(current, latest + 1))
        self.entries[entry.seq] = entry
        self._latest[who] = entry.round
        self._count[who] = self._count.get(who, 0) + 1
        return entry

    def class_at(self, entry: Entry, now: float) -> str:
        """The class it is served in at ``now`` (a batch request promoted after
        ``promote_after`` seconds)."""
        if entry.priority == BATCH and now - entry.arrived >= self.promote_after:
            return INTERACTIVE
        return entry.priority

    def _key(self, entry: Entry, now: float) -> tuple[int, int, int]:
        if entry.priority == INTERACTIVE:
            return (0, entry.round, entry.seq)
        if self.class_at(entry, now) == INTERACTIVE:  # promoted: the current round
            return (0, self._current[INTERACTIVE], entry.seq)
        return (1, entry.round, entry.seq)

    def next(self, now: float) -> Entry | None:
        """The request whose turn it is (it stays until :meth:`served` or :meth:`remove`)."""
        entries = self.entries
        if len(entries) < 2:  # nobody else waits: no order to find
            return next(iter(entries.values()), None)
        return min(entries.values(), key=lambda e: self._key(e, now))

    def ordered(self, now: float) -> list[Entry]:
        """Every waiting request in the order they would be served (for reports)."""
        return sorted(self.entries.values(), key=lambda e: self._key(e, now))

    def served(self, entry: Entry, now: float) -> None:
        """``entry`` was sent: its class's current round moves to its own."""
        served_in = self.class_at(entry, now)
        if entry.priority == served_in:
            self._current[served_in] = max(self._current[served_in], entry.round)
        self.remove(entry)

    def remove(self, entry: Entry) -> None:
        """``entry`` leaves the line (served, timed out, or its client left)."""
        if self.entries.pop(entry.seq, None) is None:
            return
        who = (entry.priority, entry.client)
        left = self._count[who] - 1
        if left:
            self._count[who] = left
        else:  # nothing of this client waits in this class: forget it
            del self._count[who]
            del self._latest[who]

    def waiting(self, now: float) -> dict[str, int]:
        """How many wait in each class now (promoted ones count as interactive)."""
        out = dict.fromkeys(CLASSES, 0)
        for entry in self.entries.values():
            out[self.class_at(entry, now)] += 1
        return out

    def oldest(self) -> float | None:
        """The arrival time of the longest-waiting request."""
        return min((e.arrived for e in self.entries.values()), default=None)


def retry_after(service_seconds: Sequence[float], waiting: int, slots: int | None) -> int:
    """The 429's ``Retry-After`` (whole seconds, at least 1): the time the requests ahead
    take to be served — ``waiting`` of them over ``slots`` at once (1 when unknown), each
    as long as the mean of the recent service times (1 s when none is known yet)."""
    mean = sum(service_seconds) / len(service_seconds) if service_seconds else 1.0
    return max(1, math.ceil(mean * waiting / max(1, slots or 1)))
