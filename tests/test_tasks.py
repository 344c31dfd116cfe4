"""proxy/tasks.py: a nursery held for tasks started later, until cancelled."""

from __future__ import annotations

import trio
import trio.testing

from proxy.tasks import TaskHolder


async def test_the_nursery_is_there_only_while_it_runs() -> None:
    holder = TaskHolder()
    assert holder.nursery is None
    ran: list[str] = []
    ended = trio.Event()

    async def work(name: str) -> None:
        ran.append(name)
        try:
            await trio.sleep_forever()
        finally:
            ended.set()

    async with trio.open_nursery() as outer:
        await outer.start(lambda task_status: holder.run(
            task_status=task_status, first=lambda n: n.start_soon(work, "first")))
        nursery = holder.nursery
        assert nursery is not None
        nursery.start_soon(work, "later")
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(ran) == ["first", "later"]
        assert "2 tasks" in repr(holder)
        outer.cancel_scope.cancel()
    assert ended.is_set()
    assert holder.nursery is None
    assert repr(holder) == "TaskHolder(not running)"
