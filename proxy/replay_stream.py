"""The client's byte stream handed over to another protocol (a WebSocket, SPEC §9.3).

When a request switches protocols, the connection's own reader has already consumed the
request head (and maybe bytes after it). A :class:`ReplayStream` gives the new protocol's
code a plain :class:`trio.abc.Stream` that first delivers those bytes again, then reads from
the socket; writes go straight to the socket. (Of a WebSocket client's bytes sent before our
101, wsproto keeps none: RFC 6455 §4.1 has clients wait for it.) The head is rebuilt by
:func:`protocol.http1.build_request_head`, as a request sent upstream is.
"""

from __future__ import annotations

import trio


class ReplayStream(trio.abc.Stream):
    """``replay`` first, then the socket's bytes (or the end of the stream, when the client
    had already closed its side: ``eof``)."""

    def __init__(self, stream: trio.abc.Stream, replay: bytes, *, eof: bool = False) -> None:
        self._stream = stream
        self._replay = memoryview(replay)
        self._eof = eof

    def __repr__(self) -> str:
        return f"ReplayStream({len(self._replay)} bytes to replay, eof={self._eof})"

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._replay:
            await trio.lowlevel.checkpoint()
            size = len(self._replay) if max_bytes is None else max_bytes
            data, self._replay = bytes(self._replay[:size]), self._replay[size:]
            return data
        if self._eof:
            await trio.lowlevel.checkpoint()
            return b""
        return bytes(await self._stream.receive_some(max_bytes))

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self._stream.aclose()
