"""Reliability figures measured with the real clock (issue 11, part 8), recorded through the
``figures`` fixture. The bounds asserted are loose on purpose (deterministic on a loaded
machine); the figures say how close the gateway actually is:

- ``abort_to_upstream_close_ms``: a client closes mid-stream; how long until the fake
  upstream sees its connection closed (SPEC §6: within 100 ms; asserted: under 1 s);
- ``timeout_accuracy_ms``: how late the gateway's ``first_byte`` timeout (0.5 s) and
  ``chunk_interval`` timeout (1 s: the smallest the config accepts) fire: from the request
  sent, or from the fake's last event written, to the answer the client sees (asserted:
  never early, under 1 s late);
- ``attempts_per_request_max``: how many upstreams one request reached when they fail
  (asserted: two, one failover, never a third).
"""

from __future__ import annotations

import pytest
import trio

from tests.client import CHAT, Client, chat_body, read_events
from tests.conftest import StartGateway
from tests.fakeupstream import (
    LLAMA_SSE_HEADERS,
    FakeUpstream,
    Handler,
    ReceivedRequest,
    ResponseWriter,
    sse_events,
    stall_before_head,
    stall_between_chunks,
)
from tests.figures import Figures
from tests.soakload import close_client
from tests.waits import settled

ABORTS = 10  # per transport and kind of close
LIMITS = {"first_byte": 0.5, "chunk_interval": 1.0}  # seconds, as configured
TIMEOUT_RUNS = 3


async def wait_requests(up: FakeUpstream, count: int) -> None:
    await settled(lambda: len(up.requests_to(CHAT)) >= count, f"{count} requests")


@pytest.mark.parametrize("abrupt", [False, True], ids=["close", "reset"])
async def test_abort_to_upstream_close(abrupt: bool, upstream: FakeUpstream,
                                       start_gateway: StartGateway, transport: str,
                                       figures: Figures) -> None:
    upstream.on("POST", CHAT, stall_between_chunks(2))
    gw = await start_gateway([("fake", upstream.url)])
    for n in range(1, ABORTS + 1):
        client = await Client.open(gw.address(transport))
        await client.send_request("POST", CHAT, chat_body(stream=True))
        with trio.fail_after(5):
            await client.read_head()
            await read_events(client, 2)
        await wait_requests(upstream, n)
        conn_id = upstream.requests_to(CHAT)[-1].conn_id
        closed = trio.current_time()
        await close_client(client, abrupt)
        with trio.fail_after(2):
            seen = await upstream.wait_connection_closed(conn_id)
        figures.sample("abort_to_upstream_close_ms", (seen - closed) * 1000)
        assert seen - closed < 1.0


def stall_after_chunks(count: int, sent: list[float]) -> Handler:
    """The fake's SSE head and ``count`` events, then a stall; ``sent`` gets the time its
    last event was written (this process's trio clock): the gateway's ``chunk_interval``
    runs from a moment after it, never before, whatever the machine's load."""
    events = sse_events(count + 1)[:count]

    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.head(200, LLAMA_SSE_HEADERS)
        for data in events:
            await w.chunk(data)
        sent.append(trio.current_time())
        await w.stall()

    return handler


async def _late_error(gw_address: str, *, events: int, sent: list[float]) -> float:
    """Seconds from the start of the gateway's timer as this test can bound it (the request
    sent; the fake's last event written, ``sent``) to the timeout answer the client gets
    (a 504, or the SSE error event)."""
    client = await Client.open(gw_address)
    try:
        start = trio.current_time()
        await client.send_request("POST", CHAT, chat_body(stream=True))
        with trio.fail_after(10):
            if not events:
                reply = await client.read_reply()
                end = trio.current_time()
                assert reply.status == 504, reply
                assert b"first_byte" in reply.body
                return end - start
            head = await client.read_head()
            await read_events(client, events)
            reply = await client.read_reply(head)
            end = trio.current_time()
            assert not reply.complete
            assert b"chunk_interval" in reply.body
            return end - sent[-1]
    finally:
        await client.aclose()


@pytest.mark.parametrize("which", ["first_byte", "chunk_interval"])
async def test_timeout_accuracy(which: str, upstream: FakeUpstream,
                                start_gateway: StartGateway, figures: Figures) -> None:
    limit = LIMITS[which]
    sent: list[float] = []
    if which == "first_byte":
        upstream.on("POST", CHAT, stall_before_head())
        events = 0
    else:
        upstream.on("POST", CHAT, stall_after_chunks(2, sent))
        events = 2
    gw = await start_gateway([("fake", upstream.url)], **{which: limit})
    for _ in range(TIMEOUT_RUNS):
        waited = await _late_error(gw.tcp, events=events, sent=sent)
        figures.sample("timeout_accuracy_ms", (waited - limit) * 1000)
        figures.sample(f"timeout_accuracy_{which}_ms", (waited - limit) * 1000)
        assert limit - 0.01 <= waited < limit + 1.0


