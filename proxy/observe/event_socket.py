"""One events subscriber's WebSocket (SPEC §9.3), on trio-websocket: the handshake (our
101), the frames from its queue, the client's messages (read and ignored) and the pings.

Imported by the first subscriber (:func:`proxy.api.events.serve`), not at start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
import trio_websocket

from protocol.headers import Header
from protocol.websocket import text_frame
from proxy.observe.feed import EventFeed, Subscriber

log = logging.getLogger("sluice.events")

PING_INTERVAL = 30.0  # seconds between two pings of a subscriber
HANDSHAKE_TIMEOUT = 10.0  # the WebSocket handshake (our 101) must be done within this
MAX_CLIENT_MESSAGE = 64 * 1024  # a longer message from the client closes it (1009)
GOING_AWAY = 1001  # the close code of a stopping gateway


async def serve(feed: EventFeed, hello: Callable[[], str], stream: trio.abc.Stream,
                headers: list[Header]) -> None:
    """One subscriber, from the handshake (replayed by ``stream``; ``headers`` go with our
    101) to the end of its connection."""
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:  # trio-websocket's reader lives here
            ws = await _handshake(nursery, stream, headers)
            if ws is None:
                nursery.cancel_scope.cancel()
                return
            subscriber = Subscriber(scope)
            subscriber.push(hello())  # the snapshot and the subscription in one step
            unsubscribe = feed.add(subscriber)
            log.debug("events subscriber joined (%d now)", len(feed))
            try:
                async with trio.open_nursery() as tasks:
                    tasks.start_soon(_read_client, ws, subscriber, tasks.cancel_scope)
                    tasks.start_soon(_ping, ws, tasks.cancel_scope)
                    await _send_frames(ws, subscriber)
                    tasks.cancel_scope.cancel()
            finally:
                unsubscribe()
                log.debug("events subscriber left (%d now)", len(feed))
            nursery.cancel_scope.cancel()


async def _handshake(nursery: trio.Nursery, stream: trio.abc.Stream,
                     headers: list[Header]) -> trio_websocket.WebSocketConnection | None:
    """Our 101; None when the client went away (or the handshake did not finish in time)."""
    with trio.move_on_after(HANDSHAKE_TIMEOUT):
        try:
            request = await trio_websocket.wrap_server_stream(
                nursery, stream, max_message_size=MAX_CLIENT_MESSAGE)
            return await request.accept(extra_headers=headers)
        except (trio_websocket.ConnectionClosed, trio_websocket.HandshakeError):
            return None
    log.info("an events WebSocket handshake did not finish within %gs", HANDSHAKE_TIMEOUT)
    return None


async def _send_frames(ws: trio_websocket.WebSocketConnection, subscriber: Subscriber) -> None:
    """Drain the subscriber's queue to the socket; on a stopping gateway, close with 1001."""
    try:
        while (texts := await subscriber.next_frames()) is not None:
            await _send_texts(ws, texts)
        await ws.aclose(GOING_AWAY, "the gateway is shutting down")
    except trio_websocket.ConnectionClosed:
        pass


async def _send_texts(ws: trio_websocket.WebSocketConnection, texts: list[str]) -> None:
    """Send text messages, several in one write. trio-websocket frames and writes each
    message on its own (wsproto's framing, a lock and a syscall per event: most of what a
    watched gateway spends on its feed), so a batch is framed here
    (:func:`protocol.websocket.text_frame`: the handshake accepted no extension) and written
    under its write lock, as its own ``send_message`` does for one; without those
    attributes, one message at a time."""
    lock = getattr(ws, "_stream_lock", None)
    stream = getattr(ws, "_stream", None)
    abort = getattr(ws, "_abort_web_socket", None)
    if lock is None or stream is None or abort is None:
        for text in texts:
            await ws.send_message(text)
        return
    if ws.closed:
        raise trio_websocket.ConnectionClosed(ws.closed)
    data = b"".join([text_frame(text) for text in texts])
    async with lock:
        try:
            await stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await abort()  # as trio-websocket's own send does
            raise trio_websocket.ConnectionClosed(ws.closed) from None


async def _read_client(ws: trio_websocket.WebSocketConnection, subscriber: Subscriber,
                       everything: trio.CancelScope) -> None:
    """Read (and ignore) what the client sends, so its pongs and its close are seen; when
    it closes, end the subscriber at once (unless we are closing it ourselves)."""
    try:
        while True:
            await ws.get_message()
    except trio_websocket.ConnectionClosed:
        if not subscriber.closing:
            everything.cancel()


async def _ping(ws: trio_websocket.WebSocketConnection, everything: trio.CancelScope) -> None:
    """A ping every PING_INTERVAL; no pong by the next one ends the subscriber."""
    interval = PING_INTERVAL
    answered = True

    async def ping() -> None:
        nonlocal answered
        try:
            await ws.ping()
        except trio_websocket.ConnectionClosed:
            return
        answered = True

    async with trio.open_nursery() as pings:
        while True:
            await trio.sleep(interval)
            if not answered:
                log.info("an events subscriber answered no ping for %gs: closing it",
                         interval)
                everything.cancel()
                return
            answered = False
            pings.start_soon(ping)
