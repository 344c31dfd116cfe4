"""Hot-path socket I/O on a trio socket's file descriptor: :class:`PlainWire`, the
:class:`~proxy.link.wire.Wire` of a plain connection (and the record transport of
:class:`~proxy.link.tlsio.TlsChannel`).

trio's SocketStream yields to the scheduler on every call, even when the kernel could take or
give the bytes at once; on the relay path that costs more than the system call. These calls
try first and wait (a cancellable checkpoint) only when it would block. A loop that
never blocks must still yield now and then: see :class:`Fairness`.
"""

from __future__ import annotations

import os
import select
from collections.abc import Callable

import trio

__all__ = ["Fairness", "PlainWire"]

_read = os.read
_write = os.write


class PlainWire:
    """A connected socket as a :class:`~proxy.link.wire.Wire`."""

    __slots__ = ("fd", "sock")

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.sock = sock
        self.fd = sock.fileno()

    def __repr__(self) -> str:
        return f"PlainWire(fd={self.fd})"

    async def recv(self, size: int, wait_first: bool = False) -> bytes:
        """Up to ``size`` bytes; b"" at EOF. Raises OSError (e.g. ECONNRESET) as the kernel
        does, and trio.ClosedResourceError if the socket is closed while waiting.
        ``wait_first``: the caller knows the bytes cannot be there yet (an answer just asked
        for, the next request of a client still reading our answer), so the read that would
        fail is not tried."""
        fd = self.fd
        if wait_first:
            await trio.lowlevel.wait_readable(fd)
        while True:
            try:
                return _read(fd, size)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(fd)

    async def send_all(self, data: bytes, on_block: Callable[[], None] | None = None,
                       stall: float | None = None) -> None:
        """Write all of ``data``. Raises OSError (e.g. EPIPE) as the kernel does.
        ``on_block`` is called once before the first wait, if the kernel cannot take
        everything at once. ``stall``: the longest wait for the peer to take more bytes;
        past it, TimeoutError (an OSError). Only a write that blocks pays for either."""
        fd = self.fd
        try:
            sent = _write(fd, data)
        except BlockingIOError:
            sent = 0
        if sent == len(data):
            return
        if on_block is not None:
            on_block()
        view = memoryview(data)[sent:]
        while view:
            if stall is None:
                await trio.lowlevel.wait_writable(fd)
            else:
                with trio.move_on_after(stall) as waiting:
                    await trio.lowlevel.wait_writable(fd)
                if waiting.cancelled_caught:
                    raise TimeoutError(f"the peer took no byte for {stall:g}s")
            try:
                sent = _write(fd, view)
            except BlockingIOError:
                continue
            view = view[sent:]

    def close(self) -> None:
        self.sock.close()

    def looks_alive(self) -> bool:
        """Anything readable on an idle connection (EOF included) means it is spent."""
        poller = select.poll()
        poller.register(self.fd, select.POLLIN | select.POLLPRI)
        try:
            return not poller.poll(0)
        except OSError:
            return False

    def stream(self) -> trio.abc.Stream:
        return trio.SocketStream(self.sock)


class Fairness:
    """Counts calls that did not yield; every ``every`` of them, yields once, so a stream whose
    bytes are always ready cannot starve the other connections (or dodge cancellation)."""

    __slots__ = ("_count", "every")

    def __init__(self, every: int = 16) -> None:
        self.every = every
        self._count = 0

    async def tick(self) -> None:
        self._count += 1
        if self._count >= self.every:
            self._count = 0
            await trio.lowlevel.checkpoint()
