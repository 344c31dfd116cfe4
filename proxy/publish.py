"""How an owner of state tells others that it changed: a list of callbacks, called in
order after each change (synchronously, so a reader sees the change at once). Used by the
settings, the backend registry and the node index."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Subscribers(Generic[T]):
    __slots__ = ("_callbacks",)

    def __init__(self) -> None:
        self._callbacks: list[Callable[[T], None]] = []

    def __repr__(self) -> str:
        return f"Subscribers({len(self._callbacks)})"

    def __len__(self) -> int:
        return len(self._callbacks)

    def subscribe(self, callback: Callable[[T], None]) -> Callable[[], None]:
        """Call ``callback(value)`` after every change; returns the unsubscriber."""
        self._callbacks.append(callback)

        def unsubscribe() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return unsubscribe

    def publish(self, value: T) -> None:
        for callback in list(self._callbacks):
            callback(value)
