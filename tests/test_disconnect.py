"""A client that goes away cancels its upstream request at once, in every phase (SPEC §6):
the fake upstream must see its connection closed within 100 ms of the client closing."""

from __future__ import annotations

import socket
import struct

import pytest
import trio
import trio.testing

from tests.client import CHAT, Client, chat_body, read_events, request
from tests.conftest import StartGateway, inject_backend
from tests.fakeupstream import (
    FakeUpstream,
    Handler,
    sse_events,
    sse_stream,
    stall_before_first_chunk,
    stall_before_head,
    stall_between_chunks,
)
from tests.waits import settled

LIMIT = 0.1  # seconds, SPEC §6


async def wait_for_request(up: FakeUpstream, path: str) -> int:
    """The connection id of the first request the upstream got on ``path``."""
    await settled(lambda: bool(up.requests_to(path)), f"a request to {path}")
    return up.requests_to(path)[0].conn_id


async def close_abruptly(client: Client) -> None:
    """Close like a killed client: RST on TCP, plain close on a Unix socket."""
    sock = client.stream.socket
    if sock.family == socket.AF_INET:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await client.aclose()


PHASES: dict[str, tuple[Handler, bool, int]] = {
    # phase: (upstream behaviour, stream?, events the client reads before closing)
    "waiting-for-head": (stall_before_head(), True, 0),
    "waiting-for-first-chunk": (stall_before_first_chunk(), True, 0),
    "mid-stream": (stall_between_chunks(2), True, 2),
    "non-streaming": (stall_before_head(), False, 0),
}


@pytest.mark.parametrize("phase", list(PHASES))
@pytest.mark.parametrize("abrupt", [False, True], ids=["close", "reset"])
async def test_disconnect_cancels_upstream(phase: str, abrupt: bool, upstream: FakeUpstream,
                                           start_gateway: StartGateway, transport: str) -> None:
    handler, stream, events_before_close = PHASES[phase]
    upstream.on("POST", CHAT, handler)
    gw = await start_gateway([("fake", upstream.url)])
    client = await Client.open(gw.address(transport))
    await client.send_request("POST", CHAT, chat_body(stream=stream))
    conn_id = await wait_for_request(upstream, CHAT)
    if events_before_close:
        with trio.fail_after(5):
            await client.read_head()
            await read_events(client, events_before_close)
    await trio.testing.wait_all_tasks_blocked()  # the gateway settled into waiting
    closed = trio.current_time()
    if abrupt:
        await close_abruptly(client)
    else:
        await client.aclose()
    with trio.fail_after(2):
        seen = await upstream.wait_connection_closed(conn_id)
    assert seen - closed < LIMIT
    # and the gateway has let go of the client connection
    await settled(lambda: not gw.gateway.ctx.connection_count, "the connection closed", 2)


async def test_disconnect_while_connecting(blackhole: str, upstream: FakeUpstream,
                                           start_gateway: StartGateway) -> None:
    gw = await start_gateway([("fake", upstream.url)])
    inject_backend(gw, "hole", blackhole, ["hole-model"])
    client = await Client.open(gw.tcp)
    await client.send_request("POST", CHAT, chat_body("hole-model"))
    await trio.testing.wait_all_tasks_blocked()
    assert gw.gateway.ctx.connection_count == 1  # still connecting upstream
    closed = trio.current_time()
    await client.aclose()
    await settled(lambda: not gw.gateway.ctx.connection_count, "the connection closed", 2)
    assert trio.current_time() - closed < LIMIT


async def test_slot_is_reused_after_disconnect(upstream: FakeUpstream,
                                               start_gateway: StartGateway) -> None:
    """After a cancelled request the next one is served normally (no stuck state)."""
    upstream.on("POST", CHAT, stall_between_chunks(1))
    gw = await start_gateway([("fake", upstream.url)])
    client = await Client.open(gw.tcp)
    await client.send_request("POST", CHAT, chat_body(stream=True))
    with trio.fail_after(5):
        await client.read_head()
    await client.aclose()
    upstream.on("POST", CHAT, sse_stream(sse_events(3)))
    with trio.fail_after(5):
        reply = await request(gw.tcp, "POST", CHAT, chat_body(stream=True))
    assert reply.body == b"".join(sse_events(3))
