"""A stand-in for a gateway's live feed (SPEC §9.3), for the CLI's tests: a real
trio-websocket server on a Unix socket, named in a data folder's state.json as a running
gateway's socket is, that the test drives frame by frame (``send``, ``close``, ``drop``).

The same socket answers plain ``GET`` requests from fixed JSON bodies (``http``), as the
gateway's admin API would, since ``sluice status --watch`` fetches the status over it.
``silent`` connections do the handshake and send their frames but never read (so they never
answer a ping).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import trio
import wsproto
import wsproto.events
from trio_websocket import ConnectionClosed, WebSocketConnection, wrap_server_stream

from proxy.datadir import GatewayState, write_state
from proxy.replay_stream import ReplayStream

MAX_HEAD = 16 << 10  # bytes of one request head


class FakeFeed:
    """One feed at a time: ``await connected.wait()``, then ``send``/``close``/``drop``."""

    def __init__(self, folder: Path, *, http: dict[str, Any] | None = None,
                 reject: int | None = None, silent: bool = False) -> None:
        self.data_dir = folder / "data"
        self.socket_path = str(folder / "gw.sock")
        self.http = dict(http or {})
        self.reject, self.silent = reject, silent
        self.gets: list[str] = []  # the paths of plain GETs, in order
        self.got = trio.Event()  # set (and replaced) after each plain GET
        self.connected = trio.Event()
        self.closed_by_client: int | None = None  # the close code the client sent
        self.client_gone = trio.Event()
        self._closing = False  # the server sent its close frame
        self._send, self._receive = trio.open_memory_channel[Any](64)

    def __repr__(self) -> str:
        return f"FakeFeed({self.socket_path})"

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(self.socket_path)
        sock.listen(16)
        write_state(self.data_dir, GatewayState(pid=os.getpid(), socket_path=self.socket_path))
        async with trio.SocketListener(sock) as listener, trio.open_nursery() as nursery:
            task_status.started()
            while True:
                stream = await listener.accept()
                nursery.start_soon(self._connection, stream)

    # --------------------------------------------------------------- what the test does

    async def send(self, frame_type: str, data: Any = None,
                   at: str = "2026-12-01T12:00:01.000Z") -> None:
        frame: dict[str, Any] = {"type": frame_type, "at": at}
        if data is not None:
            frame["data"] = data
        await self._send.send(("frame", json.dumps(frame)))

    async def send_text(self, text: str) -> None:
        await self._send.send(("frame", text))

    async def close(self, code: int = 1001) -> None:
        await self._send.send(("close", code))

    async def drop(self) -> None:
        """End the connection without a close frame (the gateway died)."""
        await self._send.send(("drop", None))

    # ------------------------------------------------------------------------ the server

    async def _connection(self, stream: trio.SocketStream) -> None:
        async with stream:
            await self._answer(stream)

    async def _answer(self, stream: trio.SocketStream) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            data = await stream.receive_some(4096)
            if not data or len(head) > MAX_HEAD:
                await stream.aclose()
                return
            head += data
        if b"upgrade: websocket" not in head.lower():
            await self._plain_get(stream, head)
        elif self.silent:
            await self._silent(stream, head)
        else:
            await self._feed(stream, head)

    async def _plain_get(self, stream: trio.SocketStream, head: bytes) -> None:
        path = head.split(b" ", 2)[1].decode()
        self.gets.append(path)  # before answering: the client may act on the answer first
        body = self.http.get(path)
        status = b"200 OK" if body is not None else b"404 Not Found"
        payload = json.dumps(body if body is not None else
                             {"error": {"message": "no such path"}}).encode()
        await stream.send_all(b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json"
                              b"\r\ncontent-length: " + str(len(payload)).encode() +
                              b"\r\nconnection: close\r\n\r\n" + payload)
        await stream.aclose()
        self.got.set()
        self.got = trio.Event()

    async def _feed(self, stream: trio.SocketStream, head: bytes) -> None:
        async with trio.open_nursery() as nursery:
            request = await wrap_server_stream(nursery, ReplayStream(stream, head))
            if self.reject is not None:
                await request.reject(self.reject, body=json.dumps(
                    {"error": {"message": "no events here"}}).encode())
                return
            ws = await request.accept()
            self.connected.set()
            nursery.start_soon(self._watch_client, ws)
            async for what, value in self._receive:
                try:
                    if what == "frame":
                        await ws.send_message(value)
                    elif what == "close":
                        self._closing = True
                        await ws.aclose(value)
                        return
                    else:
                        await stream.aclose()
                        nursery.cancel_scope.cancel()
                        return
                except ConnectionClosed:
                    return

    async def _watch_client(self, ws: WebSocketConnection) -> None:
        """Notice the client's close frame (it never sends messages)."""
        try:
            await ws.get_message()
        except ConnectionClosed as exc:
            if exc.reason is not None and not self._closing:
                self.closed_by_client = exc.reason.code
        self.client_gone.set()

    async def _silent(self, stream: trio.SocketStream, head: bytes) -> None:
        conn = wsproto.WSConnection(wsproto.ConnectionType.SERVER)
        conn.receive_data(head)
        assert any(isinstance(e, wsproto.events.Request) for e in conn.events())
        await stream.send_all(conn.send(wsproto.events.AcceptConnection()))
        self.connected.set()
        async for what, value in self._receive:  # and never a read: pings go unanswered
            if what == "frame":
                await stream.send_all(conn.send(wsproto.events.TextMessage(data=value)))
