"""A nursery held open for tasks started later: the connection pool's probes, the llama.cpp
servers' log pumps, the mDNS announcer's announcements and answers.

Such an owner starts its :meth:`TaskHolder.run` in the gateway's nursery (``await
nursery.start(owner.run)``); from then until it is cancelled, :attr:`TaskHolder.nursery` is
where the owner starts its tasks, and None before and after (the owner then refuses or
skips the work). Cancelling ``run`` cancels every task started there.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

__all__ = ["TaskHolder"]


class TaskHolder:
    """A nursery for tasks started later, while :meth:`run` runs (see the module docstring)."""

    __slots__ = ("_nursery",)

    def __init__(self) -> None:
        self._nursery: trio.Nursery | None = None

    def __repr__(self) -> str:
        if self._nursery is None:
            return "TaskHolder(not running)"
        return f"TaskHolder({len(self._nursery.child_tasks)} tasks)"

    @property
    def nursery(self) -> trio.Nursery | None:
        """Where to start a task now; None when :meth:`run` is not running."""
        return self._nursery

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                  first: Callable[[trio.Nursery], None] | None = None) -> None:
        """Hold the nursery until cancelled. ``first``, when given, starts the tasks that
        begin at once, before the caller of ``nursery.start`` goes on."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                if first is not None:
                    first(nursery)
                task_status.started()
                await trio.sleep_forever()
            finally:
                self._nursery = None
