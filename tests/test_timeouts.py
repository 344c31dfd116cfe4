"""Every timeout of SPEC §3.2: with trio's MockClock (autojump) for exact limits, and once
each in real time against a real fake upstream."""

from __future__ import annotations

import json
import socket

import pytest
import trio
import trio.testing

from tests.client import CHAT, Reply, chat_body, error_of, request
from tests.conftest import StartGateway, inject_backend
from tests.fakeupstream import (
    LLAMA_SSE_HEADERS,
    FakeUpstream,
    ReceivedRequest,
    ResponseWriter,
    close_mid_stream,
    json_completion,
    reset_mid_stream,
    sse_events,
    sse_stream,
    stall_before_first_chunk,
    stall_before_head,
    stall_between_chunks,
)


def trailing_error_event(reply: Reply) -> dict[str, object]:
    """The SSE error event a committed stream ends with."""
    assert not reply.complete, "the stream must end without its final chunk"
    last = reply.body.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    assert last.startswith(b"data: ")
    event = json.loads(last[len(b"data: "):])
    return dict(event["error"])


# ------------------------------------------------------------------ MockClock: exact limits
# Under the autojump clock every hop is a Unix socket: its bytes are in the peer's buffer
# when send returns, so the clock can never jump ahead of data still in flight.


async def test_first_byte_before_head(autojump_clock: trio.testing.MockClock,
                                      unix_upstream: FakeUpstream,
                                      start_gateway: StartGateway) -> None:
    unix_upstream.on("POST", CHAT, stall_before_head())
    gw = await start_gateway([("fake", unix_upstream.url)], first_byte=7, stream_total=100)
    start = trio.current_time()
    reply = await request(gw.unix, "POST", CHAT, chat_body(stream=True))
    assert reply.status == 504
    assert 7 - 1e-6 <= trio.current_time() - start < 7.5
    err = error_of(reply)
    assert err["code"] == "upstream_timeout"
    assert "timeouts.request.streaming.first_byte" in str(err["message"])


async def test_first_byte_after_head_before_first_chunk(
        autojump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream,
        start_gateway: StartGateway) -> None:
    unix_upstream.on("POST", CHAT, stall_before_first_chunk())
    gw = await start_gateway([("fake", unix_upstream.url)], first_byte=5)
    start = trio.current_time()
    reply = await request(gw.unix, "POST", CHAT, chat_body(stream=True))
    # Nothing was committed yet (the head waits for the first chunk): a clean 504.
    assert reply.status == 504
    assert 5 - 1e-6 <= trio.current_time() - start < 5.5
    assert "first_byte" in str(error_of(reply)["message"])


async def test_chunk_interval_after_commit(autojump_clock: trio.testing.MockClock,
                                           unix_upstream: FakeUpstream,
                                           start_gateway: StartGateway) -> None:
    events = sse_events(3)
    unix_upstream.on("POST", CHAT, stall_between_chunks(2, events))
    gw = await start_gateway([("fake", unix_upstream.url)], chunk_interval=3)
    start = trio.current_time()
    reply = await request(gw.unix, "POST", CHAT, chat_body(stream=True))
    assert reply.status == 200
    assert 3 - 1e-6 <= trio.current_time() - start < 3.5
    assert reply.body.startswith(events[0] + events[1])
    err = trailing_error_event(reply)
    assert err["code"] == "upstream_timeout"
    assert "timeouts.request.streaming.chunk_interval" in str(err["message"])


async def test_chunk_interval_resets_on_every_chunk(autojump_clock: trio.testing.MockClock,
                                                    unix_upstream: FakeUpstream,
                                                    start_gateway: StartGateway) -> None:
    events = sse_events(6)
    unix_upstream.on("POST", CHAT, sse_stream(events, gap=2.5))  # 5 gaps of 2.5 s: 12.5 s in all
    gw = await start_gateway([("fake", unix_upstream.url)], chunk_interval=3)
    reply = await request(gw.unix, "POST", CHAT, chat_body(stream=True))
    assert reply.complete
    assert reply.body == b"".join(events)


async def test_chunk_interval_counts_from_the_last_chunk(
        autojump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream,
        start_gateway: StartGateway) -> None:
    """Chunks at uneven gaps under the limit, then a stall: the error comes exactly one
    chunk_interval after the last chunk (the gap watch is re-armed from the latest read when
    its deadline comes early, never later than that)."""
    events = sse_events(5)[:5]  # no [DONE]
    pauses = (0.5, 2.9, 0.1, 2.99)  # before events 1..4; 6.49 s in all, then a stall

    async def uneven(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.head(200, LLAMA_SSE_HEADERS)
        await w.chunk(events[0])
        for pause, event in zip(pauses, events[1:], strict=True):
            await trio.sleep(pause)
            await w.chunk(event)
        await w.stall()

    unix_upstream.on("POST", CHAT, uneven)
    gw = await start_gateway([("fake", unix_upstream.url)], chunk_interval=3)
    start = trio.current_time()
    reply = await request(gw.unix, "POST", CHAT, chat_body(stream=True))
    took = trio.current_time() - start
    assert sum(pauses) + 3 - 1e-6 <= took < sum(pauses) + 3 + 0.01
    assert reply.body.startswith(b"".join(events))
    err = trailing_error_event(reply)
    assert err["code"] == "upstream_timeout"
    assert "timeouts.request.streaming.chunk_interval (3s)" in str(err["message"])


async def test_streaming_total(autojump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream,
                               start_gateway: StartGateway) -> None:
    events = sse_events(50)
    unix_upstream.on("POST", CHAT, sse_stream(events, gap=2))
    gw = await start_gateway([("fake", unix_upstream.url)], chunk_interval=5, stream_total=21)
    start = trio.current_time()
    reply = await request(gw.unix, "POST", CHAT, chat_body(stream=True))
    assert 21 - 1e-6 <= trio.current_time() - start < 21.5
    err = trailing_error_event(reply)
    assert "timeouts.request.streaming.total" in str(err["message"])
    assert reply.body.startswith(b"".join(events[:10]))


async def test_non_streaming_total_only(autojump_clock: trio.testing.MockClock,
                                        unix_upstream: FakeUpstream,
                                        start_gateway: StartGateway) -> None:
    async def slow(req: ReceivedRequest, w: ResponseWriter) -> None:
        await trio.sleep(8)  # longer than first_byte, shorter than total
        await json_completion()(req, w)

    unix_upstream.on("POST", CHAT, slow)
    gw = await start_gateway([("fake", unix_upstream.url)], first_byte=2, standard_total=10)
    reply = await request(gw.unix, "POST", CHAT, chat_body())
    assert reply.status == 200  # first_byte does nothing for non-streaming requests
    unix_upstream.on("POST", CHAT, stall_before_head())
    start = trio.current_time()
    reply = await request(gw.unix, "POST", CHAT, chat_body())
    assert reply.status == 504
    assert 10 - 1e-6 <= trio.current_time() - start < 10.5
    assert "timeouts.request.standard.total" in str(error_of(reply)["message"])


async def test_image_generation_total(autojump_clock: trio.testing.MockClock,
                                      unix_upstream: FakeUpstream,
                                      start_gateway: StartGateway) -> None:
    unix_upstream.on("POST", "/v1/images/generations", stall_before_head())
    gw = await start_gateway([("fake", unix_upstream.url)], standard_total=5, image_total=40)
    start = trio.current_time()
    reply = await request(gw.unix, "POST", "/v1/images/generations",
                          b'{"model":"fake-model","prompt":"a cat"}')
    assert reply.status == 504
    assert 40 - 1e-6 <= trio.current_time() - start < 40.5
    assert "timeouts.request.image_generation.total" in str(error_of(reply)["message"])


async def test_connection_timeout(autojump_clock: trio.testing.MockClock, blackhole: str,
                                  unix_upstream: FakeUpstream, start_gateway: StartGateway) -> None:
    gw = await start_gateway([("fake", unix_upstream.url)], connection=4)
    inject_backend(gw, "hole", blackhole, ["hole-model"])
    start = trio.current_time()
    reply = await request(gw.unix, "POST", CHAT, chat_body("hole-model"))
    assert reply.status == 504
    assert 4 - 1e-6 <= trio.current_time() - start < 4.5
    assert "timeouts.connection" in str(error_of(reply)["message"])


# ------------------------------------------------------------------ upstream failures


async def test_connect_refused_is_502(upstream: FakeUpstream,
                                      start_gateway: StartGateway) -> None:
    gw = await start_gateway([("fake", upstream.url)])
    backend = gw.gateway.backends.backends[0]
    # The server goes away after the health check found it.
    probe = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    await probe.bind(("127.0.0.1", 0))
    backend.address = type(backend.address)(
        host="127.0.0.1", port=probe.getsockname()[1], unix_path=None, base_path="")
    probe.close()
    reply = await request(gw.tcp, "POST", CHAT, chat_body())
    assert reply.status == 502
    assert error_of(reply)["code"] == "upstream_connection_error"


@pytest.mark.parametrize("fault", [reset_mid_stream, close_mid_stream])
async def test_stream_cut_after_commit(upstream: FakeUpstream, start_gateway: StartGateway,
                                       transport: str, fault: object) -> None:
    events = sse_events(4)
    upstream.on("POST", CHAT, fault(2, events))  # type: ignore[operator]
    gw = await start_gateway([("fake", upstream.url)])
    with trio.fail_after(5):
        reply = await request(gw.address(transport), "POST", CHAT, chat_body(stream=True))
    assert reply.status == 200
    assert reply.body.startswith(events[0] + events[1])
    assert trailing_error_event(reply)["code"] in ("upstream_protocol_error",
                                                   "upstream_connection_error")


async def test_error_event_starts_on_an_event_boundary(upstream: FakeUpstream,
                                                       start_gateway: StartGateway) -> None:
    half = b'data: {"choices":[{"delta":{"content":"he'
    upstream.on("POST", CHAT, reset_mid_stream(2, [sse_events(1)[0], half]))
    gw = await start_gateway([("fake", upstream.url)])
    reply = await request(gw.tcp, "POST", CHAT, chat_body(stream=True))
    # The cut event is closed off so the error event parses on its own.
    assert half + b"\n\ndata: {\"error\"" in reply.body


async def test_reset_before_head_is_502(upstream: FakeUpstream,
                                        start_gateway: StartGateway) -> None:
    async def reset(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.reset()

    upstream.on("POST", CHAT, reset)
    gw = await start_gateway([("fake", upstream.url)])
    reply = await request(gw.tcp, "POST", CHAT, chat_body(stream=True))
    assert reply.status == 502
    assert error_of(reply)["code"] == "upstream_connection_error"


# ------------------------------------------------------------------ real time, once each


async def test_real_first_byte(upstream: FakeUpstream, start_gateway: StartGateway) -> None:
    upstream.on("POST", CHAT, stall_before_first_chunk())
    gw = await start_gateway([("fake", upstream.url)], first_byte=0.3)
    with trio.fail_after(5):
        reply = await request(gw.tcp, "POST", CHAT, chat_body(stream=True))
    assert reply.status == 504


async def test_real_chunk_interval(upstream: FakeUpstream, start_gateway: StartGateway,
                                   transport: str) -> None:
    upstream.on("POST", CHAT, stall_between_chunks(1))
    gw = await start_gateway([("fake", upstream.url)], chunk_interval=1)
    with trio.fail_after(5):
        reply = await request(gw.address(transport), "POST", CHAT, chat_body(stream=True))
    assert "chunk_interval" in str(trailing_error_event(reply)["message"])


async def test_real_totals(upstream: FakeUpstream, start_gateway: StartGateway) -> None:
    upstream.on("POST", CHAT, sse_stream(sse_events(40), gap=0.05))
    upstream.on("POST", "/v1/completions", stall_before_head())
    gw = await start_gateway([("fake", upstream.url)], stream_total=0.4, standard_total=0.3)
    with trio.fail_after(5):
        streamed = await request(gw.tcp, "POST", CHAT, chat_body(stream=True))
        whole = await request(gw.tcp, "POST", "/v1/completions", chat_body())
    assert "streaming.total" in str(trailing_error_event(streamed)["message"])
    assert whole.status == 504


async def test_real_connection_timeout(blackhole: str, upstream: FakeUpstream,
                                       start_gateway: StartGateway) -> None:
    gw = await start_gateway([("fake", upstream.url)], connection=0.3)
    inject_backend(gw, "hole", blackhole, ["hole-model"])
    with trio.fail_after(5):
        reply = await request(gw.tcp, "POST", CHAT, chat_body("hole-model"))
    assert reply.status == 504
