"""The answer side of one connection of the fault-injection upstream."""

from __future__ import annotations

import socket
import struct
from contextlib import suppress

import trio

READ_SIZE = 64 * 1024


class Writer:
    """The answer side of one connection: raw bytes, an abortive or a clean close."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.closed = False
        self.keep_alive = True  # False once the answer leaves the connection unusable

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def reset(self) -> None:
        """SO_LINGER 0 then close: a TCP peer sees ECONNRESET (a Unix peer sees EOF)."""
        self.closed = True
        if self.stream.socket.family in (socket.AF_INET, socket.AF_INET6):
            self.stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await trio.aclose_forcefully(self.stream)

    async def close(self) -> None:
        self.closed = True
        await trio.aclose_forcefully(self.stream)

    async def silence(self) -> None:
        """Say nothing more; read (and drop) what comes until the peer leaves."""
        self.keep_alive = False
        with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while await self.stream.receive_some(READ_SIZE):
                pass
