"""The graceful stop (SPEC §4): a stop signal (SIGTERM/SIGINT) or :meth:`Drain.begin` ends
accepting; then listening stops, idle connections close, and running answers get until the
drain deadline to finish before they are cancelled. A second signal cancels them at once."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Awaitable, Callable

import trio

from proxy.context import Clients
from proxy.observe.feed import EventFeed

log = logging.getLogger("sluice.server")

DRAIN_TIMEOUT = 30.0  # seconds running answers get to finish after a stop signal


class Drain:
    """The stop of one gateway: :attr:`stopping` once asked to stop, :attr:`drained` once
    the last connection of a drain has closed (:meth:`connection_closed`)."""

    def __init__(self, clients: Clients, timeout: float) -> None:
        self.clients = clients
        self.timeout = timeout
        self.stopping = trio.Event()
        self.drained = trio.Event()
        # What a second signal cancels: the gateway's every task (Gateway.run runs them
        # inside it).
        self.everything = trio.CancelScope()

    def __repr__(self) -> str:
        return f"Drain(stopping={self.stopping.is_set()}, {self.clients!r})"

    def begin(self) -> None:
        """Begin the graceful stop (what SIGTERM does)."""
        self.stopping.set()

    async def watch_signals(self) -> None:
        """SIGTERM/SIGINT begin the stop; a second one cancels :attr:`everything` (the
        gateway's every task) at once."""
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                if self.stopping.is_set():
                    log.warning("second %s: cancelling running answers",
                                signal.Signals(signum).name)
                    self.everything.cancel()
                    self.clients.begin_drain()
                    self.drained.set()
                    return
                log.info("%s received: draining (send again to stop at once)",
                         signal.Signals(signum).name)
                self.begin()

    async def end_accepting(self, accepting: trio.CancelScope) -> None:
        """Cancel ``accepting`` (the accept loops) once the stop begins."""
        await self.stopping.wait()
        accepting.cancel()

    def connection_closed(self) -> None:
        """A client connection has closed: the last one of a drain ends the wait."""
        if self.clients.draining and not self.clients.count:
            self.drained.set()

    async def run(self, stop_listening: Callable[[], Awaitable[None]], events: EventFeed,
                  connections: trio.CancelScope) -> None:
        """After accepting has ended: stop listening, close idle connections and the live
        events subscribers, wait for the running answers until the deadline, then cancel
        what is left (``connections``)."""
        await stop_listening()
        log.info("stopping: %d connection(s) to drain", self.clients.count)
        self.clients.begin_drain()
        events.close_all()  # live events subscribers: close code 1001
        if self.clients.count:
            with trio.move_on_after(self.timeout):
                await self.drained.wait()
        connections.cancel()


def drain_timeout() -> float:
    """DRAIN_TIMEOUT, or the seconds in ``$SLUICE_DRAIN_TIMEOUT`` (a hidden knob for tests)."""
    try:
        value = float(os.environ.get("SLUICE_DRAIN_TIMEOUT", DRAIN_TIMEOUT))
    except ValueError:
        return DRAIN_TIMEOUT
    return value if value > 0 else DRAIN_TIMEOUT
