"""The serve loop of the HTTP/1.1 servers that play a model server: the fault-injection
upstream (:class:`tools.faults.server.FaultServer`) and the tests' fake upstream
(``tests/fakeupstream.py``).

:class:`ServeLoop` listens on ``127.0.0.1:PORT`` (port 0: a free one) or ``unix:/path``,
reports its URL through ``task_status`` and runs one task per accepted connection, numbered
from 1. :func:`serve_requests` reads one connection's requests in turn with h11 (bytes past
the end of one request begin the next) and hands each to a callback.

How bytes come off the socket stays with each server (a :data:`Receive`): the fault upstream
reads no further than a request head and then only as fast as its fault says, the fake
upstream drains the socket in a task of its own so that it sees the peer leave. Only socket
waits here, so both run under trio's MockClock.
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass

import h11
import trio

Connection = Callable[[trio.SocketStream, int], Awaitable[None]]
"""Serves one accepted connection (the stream and its id); the socket is its to close."""


class ServeLoop:
    """A listener and its accept loop: ``connection`` runs once per accepted connection, in
    a task of its own, with the connection's id (1, 2, ...)."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.url = ""  # http://127.0.0.1:PORT or unix:/path, once listening
        self.accepted = 0  # connections accepted so far (the last one's id)

    async def serve(self, listen: str, *,
                    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on ``127.0.0.1:PORT`` or ``unix:/path`` (a stale socket file there is
        replaced); runs until cancelled, then closes the listener and removes the file. An
        error in a connection's task ends it too."""
        sock, unix_path = await _bind(listen)
        name = sock.getsockname()
        self.url = f"unix:{unix_path}" if unix_path is not None else f"http://{name[0]}:{name[1]}"
        listener = trio.SocketListener(sock)
        try:
            async with trio.open_nursery() as nursery:
                task_status.started(self.url)
                while True:
                    stream = await listener.accept()
                    self.accepted += 1
                    nursery.start_soon(self.connection, stream, self.accepted)
        finally:  # no awaits here: this may run while cancelled
            sock.close()
            if unix_path is not None:
                with suppress(FileNotFoundError):
                    os.unlink(unix_path)


def check_listen(listen: str) -> None:
    """ValueError unless ``listen`` is ``127.0.0.1:PORT``, ``localhost:PORT`` or ``unix:/path``
    (the messages are worded for a ``--listen`` option)."""
    if listen.startswith("unix:"):
        if not listen[5:]:
            raise ValueError("--listen unix: needs a path")
        return
    host, _, port = listen.removeprefix("http://").rpartition(":")
    if host not in ("127.0.0.1", "localhost") or not port.isdigit():
        raise ValueError(f"--listen: only 127.0.0.1:PORT or unix:/path, not {listen!r}")


async def _bind(listen: str) -> tuple[trio.socket.SocketType, str | None]:
    """A listening socket on 127.0.0.1 or a Unix socket, and the Unix socket's path."""
    path: str | None
    if listen.startswith("unix:"):
        path = listen[5:]
        with suppress(FileNotFoundError):  # a stale socket file would make bind fail
            if stat.S_ISSOCK(os.stat(path).st_mode):
                os.unlink(path)
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address: object = path
    else:
        check_listen(listen)
        port = listen.rpartition(":")[2]
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        address = ("127.0.0.1", int(port))
        path = None
    try:
        await sock.bind(address)
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock, path


# ----------------------------------------------------------------------------- requests


@dataclass
class Request:
    """One whole request as h11 read it."""

    head: h11.Request
    body: bytes


class BadRequest(Exception):
    """A request that could not be read: bytes that are not HTTP/1.1 (the h11 error is the
    cause), or a body over ``max_body`` (``too_large``)."""

    def __init__(self, too_large: bool = False) -> None:
        super().__init__("request body too large" if too_large else "bad request")
        self.too_large = too_large


Receive = Callable[[h11.Request | None], Awaitable[bytes | None]]
"""More bytes of the connection, given the head of the request being read once it is in
(``b""``: the peer closed); None stops reading (the connection is done)."""

Handle = Callable[[Request], Awaitable[bool]]
"""Answers one request; True to read the next one on the same connection."""


async def serve_requests(receive: Receive, handle: Handle, *,
                         max_head: int = 16 * 1024,
                         max_body: int | None = None) -> None:
    """Read requests one after the other and hand each to ``handle``, until the peer leaves
    (or ``receive`` stops), or ``handle`` says no more. A request that cannot be read raises
    :class:`BadRequest` (the reply is the caller's). ``max_head``: the largest request head
    (h11's ``max_incomplete_event_size``, by default h11's own default)."""
    leftover = b""
    while True:
        h = h11.Connection(h11.SERVER, max_incomplete_event_size=max_head)
        if leftover:
            h.receive_data(leftover)
        request = await _read(h, receive, max_body)
        if request is None or not await handle(request):
            return
        leftover = h.trailing_data[0]


async def _read(h: h11.Connection, receive: Receive, max_body: int | None) -> Request | None:
    """One whole request, or None when the peer left first (or ``receive`` stopped)."""
    head: h11.Request | None = None
    body = bytearray()
    while True:
        try:
            event = h.next_event()
        except h11.RemoteProtocolError as exc:
            raise BadRequest() from exc
        if event is h11.NEED_DATA:
            data = await receive(head)
            if data is None:
                return None
            h.receive_data(data)
        elif isinstance(event, h11.Request):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
            if max_body is not None and len(body) > max_body:
                raise BadRequest(too_large=True)
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None
            return Request(head, bytes(body))
        else:  # ConnectionClosed (PAUSED cannot happen: one h11 object per request)
            return None
