"""The fan-out of the hub's events to the live events subscribers (SPEC §9.3).

One :class:`EventFeed` per gateway (``ctx.events``). It reads the hub only while somebody is
subscribed, so with nobody watching the hub skips it entirely. Each publication is encoded
once, as the text of its frame, and the same string is queued for every subscriber.

Each :class:`Subscriber` has a bounded queue (:data:`QUEUE_FRAMES`): the hub's callback only
appends to it (it never blocks or waits), dropping the oldest frame when it is full; the
subscriber then owes a ``resync`` frame (``data`` empty: every frame has one), sent before
anything else it still has. Draining a queue to a socket is the subscriber's own task
(:mod:`proxy.api.events`), so a client that does not read slows nobody but itself.

Frames are encoded when published, so a publisher may hand over a dict it changes later.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from protocol.json_text import compact_json
from protocol.request_record import RequestRecord, iso_utc
from proxy.timestamps import wall

if TYPE_CHECKING:
    from proxy.observe.hub import Hub

QUEUE_FRAMES = 256  # frames one subscriber may have waiting; beyond, the oldest are dropped
CLOSE_TIMEOUT = 2.0  # seconds a subscriber gets to take its close frame when the gateway stops


def encode_frame(kind: str, at: float, data: Any) -> str:
    """One frame's text: ``{"type", "at", "data"}`` (a request record as its log entry)."""
    if isinstance(data, RequestRecord):
        return f'{{"type":"{kind}","at":"{iso_utc(at)}","data":{data.json_text()}}}'
    return compact_json({"type": kind, "at": iso_utc(at), "data": data})


class Subscriber:
    """One client's queue of frames (see the module docstring). ``scope`` is the cancel
    scope of the task that serves it, given a deadline when the gateway stops."""

    __slots__ = ("_wake", "closing", "frames", "lost", "scope", "sent")

    def __init__(self, scope: trio.CancelScope) -> None:
        self.frames: deque[str] = deque()
        self.lost = False  # frames were dropped: ``resync`` is owed
        self.closing = False  # the gateway stops: the subscriber gets close code 1001
        self.scope = scope
        self.sent = 0  # frames taken by the sender
        self._wake: trio.Event | None = None

    def __repr__(self) -> str:
        return (f"Subscriber({len(self.frames)} queued, sent={self.sent}, lost={self.lost}, "
                f"closing={self.closing})")

    def push(self, text: str) -> None:
        """Queue a frame; never blocks. A full queue loses its oldest frame."""
        frames = self.frames
        if len(frames) >= QUEUE_FRAMES:
            frames.popleft()
            self.lost = True
        frames.append(text)
        self._set()

    def close(self) -> None:
        """The gateway stops: the sender ends with close code 1001, within CLOSE_TIMEOUT."""
        self.closing = True
        self.scope.deadline = min(self.scope.deadline, trio.current_time() + CLOSE_TIMEOUT)
        self._set()

    def _set(self) -> None:
        wake, self._wake = self._wake, None
        if wake is not None:
            wake.set()

    async def next_frames(self) -> list[str] | None:
        """Every frame waiting now, oldest first (``resync`` first when frames were lost),
        once there is at least one; None once the gateway stops."""
        while not self.closing:
            frames = self.frames
            if self.lost or frames:
                taken = [encode_frame("resync", wall(), {})] if self.lost else []
                self.lost = False
                taken += frames
                frames.clear()
                self.sent += len(taken)
                return taken
            self._wake = wake = trio.Event()
            await wake.wait()
        return None


class EventFeed:
    """The subscribers of one gateway and the hub subscription that feeds them."""

    __slots__ = ("_hub", "_subscribers", "_unsubscribe", "closing")

    def __init__(self, hub: Hub) -> None:
        self._hub = hub
        self._subscribers: list[Subscriber] = []
        self._unsubscribe: Callable[[], None] | None = None
        self.closing = False  # the gateway stops: no new subscriber

    def __repr__(self) -> str:
        return f"EventFeed({len(self._subscribers)} subscribers, closing={self.closing})"

    def __len__(self) -> int:
        return len(self._subscribers)

    @property
    def subscribers(self) -> tuple[Subscriber, ...]:
        return tuple(self._subscribers)

    def add(self, subscriber: Subscriber) -> Callable[[], None]:
        """Queue every event for ``subscriber`` from now on; returns the unsubscriber."""
        if not self._subscribers:
            self._unsubscribe = self._hub.subscribe(self._on_event)
        self._subscribers.append(subscriber)
        if self.closing:
            subscriber.close()

        def remove() -> None:
            if subscriber in self._subscribers:
                self._subscribers.remove(subscriber)
                if not self._subscribers and self._unsubscribe is not None:
                    self._unsubscribe()
                    self._unsubscribe = None

        return remove

    def _on_event(self, kind: str, at: float, data: Any) -> None:
        """The hub's callback: encode once, queue for everyone (never blocks)."""
        text = encode_frame(kind, at, data)
        for subscriber in self._subscribers:
            subscriber.push(text)

    def close_all(self) -> None:
        """The gateway stops: every subscriber gets close code 1001 and its connection ends
        (within CLOSE_TIMEOUT, even for a client that does not read)."""
        self.closing = True
        for subscriber in self._subscribers:
            subscriber.close()
