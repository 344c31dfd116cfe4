"""The CLI's client of the live feed (SPEC §9.3): ``GET /api/v1/events`` as a WebSocket
(trio-websocket) over the gateway's local socket, or its loopback TCP port when state.json
names no socket, and how the feed ended.

:func:`follow` hands each text frame to a callback until the gateway closes the feed, the
connection is lost or the user presses Ctrl-C (SIGINT is taken over while it runs: no
``KeyboardInterrupt``). The client pings every ``PING_INTERVAL`` seconds and takes a
missing pong as a lost connection, so a gateway that hangs is noticed too. Loaded only by
``sluice events`` and ``sluice status --watch``: the other commands never import trio.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import attrs
import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    WebSocketConnection,
    wrap_client_stream,
)

from proxy.cli.admin import CliError
from proxy.cli.render import clean
from proxy.datadir import GatewayState

__all__ = ["EVENTS_PATH", "Ending", "follow"]

EVENTS_PATH = "/api/v1/events"
CONNECT_TIMEOUT = 5.0  # seconds for the connection and the WebSocket handshake
PING_INTERVAL = 30.0  # seconds between the client's pings
PONG_TIMEOUT = 15.0  # seconds a pong may take before the connection counts as lost
CLOSE_TIMEOUT = 1.0  # seconds for the closing handshake when the user stops
MAX_FRAME = 16 << 20  # bytes of one frame (a hello with a large pool is the biggest)
GOING_AWAY = 1001  # the close code of a gateway that stops
ABNORMAL = 1006  # trio-websocket's code for a connection that ended without a close frame


@attrs.frozen
class Ending:
    """How the feed ended: ``stopped`` (the gateway closed it with 1001: it shuts down),
    ``interrupted`` (Ctrl-C), ``closed`` (another close code) or ``lost`` (no close frame,
    or no pong)."""

    how: str
    code: int | None = None
    reason: str | None = None

    def message(self) -> str:
        """What the user is told."""
        if self.how == "stopped":
            return "gateway stopped"
        if self.how == "interrupted":
            return "stopped"
        if self.how == "closed":
            said = f": {clean(self.reason)}" if self.reason else ""
            return f"the gateway closed the events feed (code {self.code}{said})"
        return f"lost the connection to the gateway ({clean(self.reason or 'it ended abruptly')})"

    @property
    def ok(self) -> bool:
        return self.how in ("stopped", "interrupted")


def _rejection(exc: ConnectionRejected) -> CliError:
    message = None
    try:
        doc = json.loads(exc.body or b"")
        message = doc.get("error", {}).get("message") if isinstance(doc, dict) else None
    except (ValueError, AttributeError):
        pass
    if exc.status_code == 404:
        return CliError(f"this gateway has no live events (GET {EVENTS_PATH}: 404); "
                        f"it is older than this sluice")
    return CliError(f"GET {EVENTS_PATH}: {exc.status_code} {clean(message or 'refused')}")


async def _connect(nursery: trio.Nursery, state: GatewayState, where: Path,
                   streams: list[trio.SocketStream]) -> WebSocketConnection:
    """The open WebSocket (after the handshake), its stream added to ``streams`` (for the
    caller to close: trio-websocket leaves it open after a close the server began);
    raises CliError."""
    try:
        with trio.fail_after(CONNECT_TIMEOUT):
            if state.socket_path:
                stream: trio.SocketStream = await trio.open_unix_socket(state.socket_path)
                host = "localhost"
            else:
                port = state.local_tcp_port or state.tcp_port
                if not port:
                    raise CliError(f"state.json in {where} names no socket and no port")
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                host = f"127.0.0.1:{port}"
            streams.append(stream)
            return await wrap_client_stream(nursery, stream, host, EVENTS_PATH,
                                            max_message_size=MAX_FRAME)
    except trio.TooSlowError:
        raise CliError(f"the gateway for {where} did not answer within "
                       f"{CONNECT_TIMEOUT:g}s") from None
    except OSError as exc:
        raise CliError(f"cannot reach the gateway for {where}: "
                       f"{exc.strerror or exc.__class__.__name__}") from None


def _leaf(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one exception of a nursery's group that is not a cancellation, if one."""
    leaves: list[BaseException] = []
    todo: list[BaseException] = [group]
    while todo:
        exc = todo.pop()
        if isinstance(exc, BaseExceptionGroup):
            todo.extend(exc.exceptions)
        elif not isinstance(exc, trio.Cancelled):
            leaves.append(exc)
    return leaves[0] if len(leaves) == 1 else None


async def follow(state: GatewayState, where: Path, on_text: Callable[[str], None], *,
                 helpers: Sequence[Callable[[], Awaitable[None]]] = ()) -> Ending:
    """Read the feed until it ends, calling ``on_text`` with each text frame (binary frames
    are not part of the protocol and are skipped). ``helpers`` run beside it (e.g. the
    redraw loop) and are cancelled when it ends. Raises CliError when the feed cannot be
    opened (``where`` is the data folder, for the message)."""
    streams: list[trio.SocketStream] = []
    try:
        return await _follow(state, where, on_text, helpers, streams)
    except BaseExceptionGroup as group:
        leaf = _leaf(group)
        if isinstance(leaf, ConnectionRejected):
            raise _rejection(leaf) from None
        if leaf is not None:
            raise leaf from None
        raise
    finally:
        for stream in streams:
            await trio.aclose_forcefully(stream)


async def _follow(state: GatewayState, where: Path, on_text: Callable[[str], None],
                  helpers: Sequence[Callable[[], Awaitable[None]]],
                  streams: list[trio.SocketStream]) -> Ending:
    endings: list[Ending] = []  # the first one counts
    ended = trio.Event()

    def end(how: Ending) -> None:
        endings.append(how)
        ended.set()

    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as connecting:

                async def interrupt() -> None:
                    async for _ in signals:
                        end(Ending("interrupted"))
                        connecting.cancel()  # Ctrl-C works while connecting too
                        return

                nursery.start_soon(interrupt)
                ws = await _connect(nursery, state, where, streams)
            if connecting.cancelled_caught:
                nursery.cancel_scope.cancel()
                return endings[0]

            async def heartbeat() -> None:
                while True:
                    await trio.sleep(PING_INTERVAL)
                    with trio.move_on_after(PONG_TIMEOUT) as waited:
                        try:
                            await ws.ping()
                        except ConnectionClosed:
                            return  # the reader below sees why
                    if waited.cancelled_caught:
                        end(Ending("lost", reason=f"no answer to a ping in "
                                                  f"{PONG_TIMEOUT:g}s"))
                        return

            async def read() -> None:
                try:
                    while True:
                        message = await ws.get_message()
                        if isinstance(message, str):
                            on_text(message)
                except ConnectionClosed as exc:
                    code = exc.reason.code if exc.reason is not None else ABNORMAL
                    reason = exc.reason.reason if exc.reason is not None else None
                    if code == GOING_AWAY:
                        end(Ending("stopped", code, reason))
                    elif code == ABNORMAL:
                        end(Ending("lost", code, reason))
                    else:
                        end(Ending("closed", code, reason))

            for task in (heartbeat, read, *helpers):
                nursery.start_soon(task)
            await ended.wait()
            if endings[0].how == "interrupted":  # say goodbye: a close frame, its answer
                with trio.move_on_after(CLOSE_TIMEOUT):
                    await ws.aclose()
            nursery.cancel_scope.cancel()
    return endings[0]
