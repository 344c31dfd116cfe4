"""Slow and greedy peers (SPEC §6.1): a head trickled a byte at a time, a chunked body that
stalls, a client that stops reading an SSE stream, a flood beyond ``api.max_connections``,
and an accept loop that runs out of file descriptors. The plain deadline cases (a half head,
a Content-Length body gap, idle keep-alive, one connection over the cap) are in
tests/test_http_hygiene.py.

Deadline tests use the autojump MockClock over Unix sockets only (see the note on
``jump_clock`` in tests/test_http_hygiene.py: a Unix socket's bytes are in the peer's buffer
when send returns, so the clock never jumps past bytes in flight)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from proxy.connection import BODY_GAP_TIMEOUT, HEAD_TIMEOUT
from proxy.downstream import WRITE_TIMEOUT
from tests.client import chat_body, request
from tests.conftest import StartGateway
from tests.fakeupstream import (
    LLAMA_SSE_HEADERS,
    FakeUpstream,
    Handler,
    ReceivedRequest,
    ResponseWriter,
    json_completion,
)
from tests.figures import Figures
from tests.hostile import tally
from tests.rawhttp import Raw, T, assert_openai_error, chat_head
from tests.waits import settled

CHAT = chat_body()


@pytest.fixture
def jump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def test_slowloris_head_never_extends_the_head_deadline(
    jump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream,
    start_gateway: StartGateway, caplog: pytest.LogCaptureFixture, figures: Figures
) -> None:
    """A byte a second keeps the connection busy but the head has HEAD_TIMEOUT in all: 408
    and close at 10 s, while another client is served meanwhile."""
    gw = await start_gateway([("fake", unix_upstream.url)])
    head = (b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"s" * 60
            + b"\r\n\r\n")
    raw = await Raw.open(gw.unix)
    sent = 0

    async def trickle() -> None:
        nonlocal sent
        for byte in head:  # bounded: the whole head would take 80 s
            try:
                await raw.send(bytes([byte]))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            sent += 1
            await trio.sleep(1)

    try:
        with trio.fail_after(HEAD_TIMEOUT + 20):
            async with trio.open_nursery() as nursery:
                t0 = trio.current_time()
                nursery.start_soon(trickle)
                await trio.sleep(HEAD_TIMEOUT / 2)
                assert (await request(gw.unix, "GET", "/health")).status == 200
                resp = await raw.response()
                elapsed = trio.current_time() - t0
                rest = await raw.rest()
                nursery.cancel_scope.cancel()
    finally:
        await raw.aclose()
    problems = tally(figures, caplog)
    assert resp.status == 408, resp
    assert_openai_error(resp.body, "request_timeout")
    assert resp.header("connection") == "close"
    assert rest == b""
    assert HEAD_TIMEOUT <= elapsed < HEAD_TIMEOUT + 1
    assert sent < len(head)
    assert not problems, problems


async def test_stalled_chunked_body_gets_408(
    jump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream,
    start_gateway: StartGateway, caplog: pytest.LogCaptureFixture, figures: Figures
) -> None:
    """A chunked body that stops mid-chunk for more than 30 s: 408, close, nothing
    forwarded."""
    unix_upstream.on("POST", "/v1/chat/completions", json_completion())
    gw = await start_gateway([("fake", unix_upstream.url)])
    raw = await Raw.open(gw.unix)
    try:
        with trio.fail_after(2 * BODY_GAP_TIMEOUT + 20):
            await raw.send(chat_head(b"Transfer-Encoding: chunked\r\n\r\n")
                           + b"%x\r\n" % len(CHAT) + CHAT[:10])
            t0 = trio.current_time()
            await trio.sleep(BODY_GAP_TIMEOUT - 1)
            await raw.send(CHAT[10:20])  # a gap just under the limit is fine
            resp = await raw.response()
            elapsed = trio.current_time() - t0
            rest = await raw.rest()
    finally:
        await raw.aclose()
    problems = tally(figures, caplog)
    assert resp.status == 408, resp
    assert_openai_error(resp.body, "request_timeout")
    assert rest == b""
    assert 2 * BODY_GAP_TIMEOUT - 1 <= elapsed < 2 * BODY_GAP_TIMEOUT
    assert unix_upstream.requests_to("/v1/chat/completions") == []
    assert not problems, problems


EVENT = b"data: " + b"x" * 4090 + b"\n\n"  # 4 KiB
FLOOD_EVENTS = 16 * 1024  # 64 MiB if nothing pushed back
STREAM_TOTAL = 20.0


def _sse_burst(count: int, writers: list[ResponseWriter]) -> Handler:
    """An SSE answer of ``count`` EVENTs written as fast as the gateway takes them; each
    answer's writer goes to ``writers``."""

    async def burst(req: ReceivedRequest, w: ResponseWriter) -> None:
        writers.append(w)
        await w.head(200, LLAMA_SSE_HEADERS)
        for _ in range(count):
            await w.chunk(EVENT)
        await w.end()

    return burst


async def _ask_for_a_stream(raw: Raw) -> None:
    """Send a streamed chat request and read until its answer's head has arrived."""
    body = chat_body(stream=True)
    await raw.send(chat_head(b"Content-Length: %d\r\n\r\n" % len(body) + body))
    while b"\r\n\r\n" not in raw.buf:
        assert await raw._fill()


async def test_client_that_stops_reading_an_sse_stream(
    jump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream,
    start_gateway: StartGateway, caplog: pytest.LogCaptureFixture, figures: Figures
) -> None:
    """The client reads the head and then nothing: backpressure pauses the upstream (what
    it managed to write stays a small bounded amount), the streaming total cuts the stream,
    and the upstream connection is closed."""
    writers: list[ResponseWriter] = []
    unix_upstream.on("POST", "/v1/chat/completions", _sse_burst(FLOOD_EVENTS, writers))
    gw = await start_gateway([("fake", unix_upstream.url)], chunk_interval=60,
                             stream_total=STREAM_TOTAL)
    raw = await Raw.open(gw.unix)
    try:
        with trio.fail_after(STREAM_TOTAL + 30):
            t0 = trio.current_time()
            await _ask_for_a_stream(raw)  # the head, then the client stops reading
            (req,) = unix_upstream.requests_to("/v1/chat/completions")
            closed_at = await unix_upstream.wait_connection_closed(req.conn_id)
            written = writers[0].bytes_sent
            data = await raw.rest()  # now read what was buffered, until the close
    finally:
        await raw.aclose()
    problems = tally(figures, caplog)
    assert STREAM_TOTAL <= closed_at - t0 < STREAM_TOTAL + 1
    assert written < 8 * 1024 * 1024, written  # paused: far from the 64 MiB flood
    assert len(data) <= written
    assert not data.endswith(b"0\r\n\r\n")  # cut: never a clean end
    assert not problems, problems


async def test_a_client_that_pauses_past_chunk_interval_still_gets_the_whole_stream(
    jump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream,
    start_gateway: StartGateway
) -> None:
    """While a write to a slow client blocks, the chunk gap is not counted (it is the
    upstream's limit): a client that stops reading for 10 s with chunk_interval 3 s, while
    the upstream sends 4 MiB at once, then reads on, gets the whole stream and its end."""
    count = 1024  # 4 MiB: far more than the sockets between hold
    unix_upstream.on("POST", "/v1/chat/completions", _sse_burst(count, []))
    gw = await start_gateway([("fake", unix_upstream.url)], chunk_interval=3,
                             stream_total=STREAM_TOTAL)
    raw = await Raw.open(gw.unix)
    try:
        with trio.fail_after(STREAM_TOTAL):
            await _ask_for_a_stream(raw)
            await trio.sleep(10)
            while not raw.buf.endswith(b"0\r\n\r\n"):
                assert await raw._fill()
    finally:
        await raw.aclose()
    body = bytes(raw.buf)
    assert body.count(EVENT) == count
    assert b"upstream_timeout" not in body


@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_connection_flood_beyond_the_cap_gets_fast_503s(
    transport: str, upstream: FakeUpstream, start_gateway: StartGateway,
    caplog: pytest.LogCaptureFixture, figures: Figures
) -> None:
    """Twenty connections at once over a cap of 3: the extra ones get 503 and close without
    sending anything; the held ones and later clients are served."""
    gw = await start_gateway([("fake", upstream.url)], max_connections=3)
    addr = gw.address(transport)
    held = [await Raw.open(addr) for _ in range(3)]
    statuses: list[int] = []

    async def knock() -> None:
        raw = await Raw.open(addr)
        try:
            resp = await raw.response()
            statuses.append(resp.status)
            assert await raw.rest() == b""
        finally:
            await raw.aclose()

    try:
        await settled(lambda: gw.gateway.ctx.connection_count >= 3, "3 connections", T)
        with trio.fail_after(T):
            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(knock)
            for raw in held:
                await raw.send(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
                assert (await raw.response()).status == 200
    finally:
        for raw in held:
            await raw.aclose()
    await settled(lambda: not gw.gateway.ctx.connection_count, "the connections closed", T)
    with trio.fail_after(T):
        assert (await request(addr, "GET", "/health")).status == 200
    problems = tally(figures, caplog, 20)
    assert statuses == [503] * 20
    assert not problems, problems


async def test_pipelining_client_that_never_reads_is_dropped(
    jump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream,
    start_gateway: StartGateway, caplog: pytest.LogCaptureFixture, figures: Figures
) -> None:
    """Requests pipelined without ever reading an answer: the gateway's read-ahead is capped
    and its blocked answer is given up after WRITE_TIMEOUT, so the connection cannot be held
    forever; other clients are served meanwhile."""
    gw = await start_gateway([("fake", unix_upstream.url)])
    raw = await Raw.open(gw.unix)
    batch = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n" * 100
    sent = 0
    try:
        with trio.move_on_after(5):  # until the gateway stops taking requests
            while sent < 100_000:  # bounded
                await raw.send(batch)
                sent += 100
        t0 = trio.current_time()
        assert (await request(gw.unix, "GET", "/health")).status == 200
        with trio.fail_after(WRITE_TIMEOUT + 30):
            while gw.gateway.ctx.connection_count:
                await trio.sleep(0.5)
        elapsed = trio.current_time() - t0
    finally:
        await raw.aclose()
    problems = tally(figures, caplog)
    assert sent < 100_000  # the gateway pushed back
    assert elapsed <= WRITE_TIMEOUT + 1
    assert not problems, problems
