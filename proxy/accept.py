"""Taking connections in: one accept loop per listener, which keeps accepting through a
shortage of file descriptors, hands each connection to the gateway, and turns one away
with a fast 503 when ``api.max_connections`` are open already. The 503 is written like
every answer to a client, by a :class:`~proxy.downstream.Downstream`."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Awaitable, Callable

import trio

from protocol.errors import overloaded
from proxy.context import Clients
from proxy.downstream import Downstream
from proxy.errors import ClientGone

log = logging.getLogger("sluice.server")

ACCEPT_RETRY = 0.1  # pause after EMFILE and friends before accepting again
TURNED_AWAY_DRAIN = 64 * 1024  # request bytes read (and dropped) from a turned-away connection
TURN_AWAY_TIME = 1.0  # seconds a turned-away connection gets for its 503, then it is closed
_FD_ERRORS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}

Handle = Callable[[trio.SocketStream, str], Awaitable[None]]


async def accept_loop(listener: trio.SocketListener, transport: str, nursery: trio.Nursery,
                      clients: Clients, max_connections: Callable[[], int],
                      handle: Handle) -> None:
    """Accept on ``listener`` until cancelled: each connection is counted in ``clients``
    and served by ``handle(stream, transport)`` in ``nursery``, or turned away when
    ``max_connections()`` are open."""
    starved = False  # accept is failing for want of descriptors (logged once)
    while True:
        try:
            stream = await listener.accept()
        except OSError as exc:
            if exc.errno in _FD_ERRORS:
                if not starved:  # once per episode: a flood must not flood the log
                    log.error("accept failed (%s); retrying every %gs",
                              os.strerror(exc.errno or 0), ACCEPT_RETRY)
                    starved = True
                await trio.sleep(ACCEPT_RETRY)
                continue
            raise
        if starved:
            log.warning("accepting connections again")
            starved = False
        if clients.count >= max_connections():
            nursery.start_soon(turn_away, stream, transport)
        else:
            clients.count += 1
            nursery.start_soon(handle, stream, transport)


async def turn_away(stream: trio.SocketStream, transport: str = "tcp") -> None:
    """Over api.max_connections: a fast 503 without reading the request, then close. The
    node listener's clients speak TLS first: closed at once."""
    if transport == "node":
        stream.socket.close()
        await trio.lowlevel.checkpoint()
        return
    out = Downstream(stream.socket.fileno(), lambda: True)  # the answer ends the connection
    with trio.move_on_after(TURN_AWAY_TIME):
        try:
            await out.send_error(overloaded(
                "too many connections (api.max_connections); try again shortly"))
            # Closing with unread request bytes would send a reset that can destroy the
            # 503 in flight: finish our side, then drain briefly before closing.
            await stream.send_eof()
            drained = 0
            while drained < TURNED_AWAY_DRAIN and (data := await stream.receive_some(65536)):
                drained += len(data)
        except (ClientGone, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
    stream.socket.close()
