"""Waiting in tests for something to happen, without a fixed sleep.

First choice: the event itself (a ``trio.Event`` or channel the code or the fake has, e.g.
``NodeIndex.first_round``, ``FakeUpstream.wait_connection_closed``), or :func:`published`,
a check looked at after each change the code publishes. Failing that:

- :func:`settled`: a state of this test's own trio run (a gateway and fakes in process),
  checked again each time every task is blocked (``wait_all_tasks_blocked``), so it costs
  no time past the moment the run goes quiet, and a loopback segment or a worker thread
  still on its way only means one more look (a state that waits out a timer in the code
  is looked at every 20 ms at most).
- :func:`until`: a state of another process (a ``sluice serve`` child, a model server),
  which can only be asked: asked every 10 ms, bounded.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio
import trio.testing

from proxy.publish import Subscribers

__all__ = ["published", "settled", "until"]


async def published(changes: Subscribers[Any], check: Callable[[], bool], what: str,
                    timeout: float = 10.0) -> None:
    """Until ``check()`` holds, looked at now and after each change ``changes`` publishes
    (e.g. ``NodeIndex.changes``); fails naming ``what`` after ``timeout`` seconds."""
    heard = [trio.Event()]
    unsubscribe = changes.subscribe(lambda _value: heard[-1].set())
    try:
        with trio.move_on_after(timeout):
            while not check():
                await heard[-1].wait()
                heard.append(trio.Event())
            return
    finally:
        unsubscribe()
    raise AssertionError(f"not within {timeout:g} s: {what}")


async def settled(check: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """Once this trio run's tasks are all blocked and ``check()`` holds (looked at again
    each time they are: at first as soon as they are, then, while the run only waits out
    a timer, at most every 20 ms); fails naming ``what`` after ``timeout`` seconds."""
    # Under an autojump MockClock a waiter for quiet would hold the clock still (trio jumps
    # it only when no task waits for quiet), so there the wait is a sleep the clock skips.
    mock = isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock)
    cushion = 0.0005
    with trio.move_on_after(timeout):
        while True:
            if mock:
                await trio.sleep(cushion)
            else:
                await trio.testing.wait_all_tasks_blocked(cushion=cushion)
            if check():
                return
            cushion = min(cushion * 2, 0.02)
    raise AssertionError(f"not within {timeout:g} s: {what}")


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 10.0,
                every: float = 0.01) -> None:
    """Until ``await check()`` holds, asked every ``every`` seconds (another process's
    state, with no signal to wait on); fails naming ``what`` after ``timeout`` seconds."""
    with trio.move_on_after(timeout):
        while not await check():
            await trio.sleep(every)
        return
    raise AssertionError(f"not within {timeout:g} s: {what}")
