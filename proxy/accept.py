"""Taking connections in: one accept loop per listener, which keeps accepting through a
shortage of file descriptors, hands each connection to the gateway, and turns one away
(as its :class:`~proxy.link.listener.Listener` does: a fast 503, or a close) when
``api.max_connections`` are open already."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Awaitable, Callable

import trio

from proxy.context import Clients
from proxy.link.listener import Listener

log = logging.getLogger("sluice.server")

ACCEPT_RETRY = 0.1  # pause after EMFILE and friends before accepting again
_FD_ERRORS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}

Handle = Callable[[trio.SocketStream, Listener], Awaitable[None]]


async def accept_loop(listener: trio.SocketListener, kind: Listener, nursery: trio.Nursery,
                      clients: Clients, max_connections: Callable[[], int],
                      handle: Handle) -> None:
    """Accept on ``listener`` (of ``kind``) until cancelled: each connection is counted in
    ``clients`` and served by ``handle(stream, kind)`` in ``nursery``, or turned away when
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
            nursery.start_soon(kind.turn_away, stream)
        else:
            clients.count += 1
            nursery.start_soon(handle, stream, kind)

