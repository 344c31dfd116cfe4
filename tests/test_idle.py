"""Clients.close_idle: one task ends every keep-alive wait that reaches the idle timeout,
exactly then, whatever the other connections do (autojump clock)."""

from __future__ import annotations

import trio
import trio.testing

from proxy.context import Clients

TIMEOUT = 60.0


class Conn:
    def __init__(self, name: str) -> None:
        self.name = name
        self.ended_at: float | None = None

    def end_idle(self) -> None:
        assert self.ended_at is None, f"{self.name} ended twice"
        self.ended_at = trio.current_time()


async def test_each_wait_ends_at_its_own_timeout(autojump_clock: trio.testing.MockClock) -> None:
    clients = Clients()
    a, b, c = Conn("a"), Conn("b"), Conn("c")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(clients.close_idle, TIMEOUT)
        await trio.sleep(5)  # nothing idle: the task waits without a timer
        start = trio.current_time()
        clients.wait_idle(a)
        await trio.sleep(10)
        clients.wait_idle(b)
        clients.wait_idle(c)
        await trio.sleep(20)
        clients.busy(b)  # b got a request after 20 s: its wait is over, not timed out
        await trio.sleep(35)
        clients.busy(c)  # and c after 55 s, then waits again
        clients.wait_idle(c)
        await trio.sleep(200)
        nursery.cancel_scope.cancel()
    assert a.ended_at == start + TIMEOUT
    assert b.ended_at is None
    assert c.ended_at == start + 10 + 20 + 35 + TIMEOUT
    assert not clients.idle


async def test_a_drain_ends_every_wait_at_once(autojump_clock: trio.testing.MockClock) -> None:
    clients = Clients()
    conns = [Conn(str(n)) for n in range(5)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(clients.close_idle, TIMEOUT)
        for conn in conns:
            clients.wait_idle(conn)
        clients.busy(conns[0])
        await trio.sleep(1)
        drained_at = trio.current_time()
        clients.begin_drain()
        for conn in conns[1:]:  # each connection leaves its wait as it closes
            clients.busy(conn)
        await trio.sleep(100)
        nursery.cancel_scope.cancel()
    assert conns[0].ended_at is None
    assert [c.ended_at for c in conns[1:]] == [drained_at] * 4
