"""Every behaviour of the fault-injection upstream (tools/faults) behind a real gateway, and
what the GATEWAY answers to it. Timing tests run under trio's MockClock with every hop on
a Unix socket; the resets run in real time over TCP (a Unix socket has no RST)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from tests.client import CHAT, Reply, error_of, request
from tests.conftest import StartGateway, inject_backend
from tests.faultkit import MODEL, body, error_events, fault, start_kit, stream_chunks
from tools.faults import wire
from tools.faults.server import FaultServer


@pytest.fixture
async def unix_kit(nursery: trio.Nursery, short_tmp: Path) -> FaultServer:
    return await start_kit(nursery, f"unix:{short_tmp / 'kit.sock'}")


@pytest.fixture
async def tcp_kit(nursery: trio.Nursery) -> FaultServer:
    return await start_kit(nursery, "127.0.0.1:0")


def cut_stream(reply: Reply, chunks: list[bytes]) -> dict[str, object]:
    """A committed stream that relayed exactly ``chunks``, then one SSE error event, and
    ended without its final chunk; returns that event's error."""
    assert reply.status == 200
    assert not reply.complete, "a cut stream must end without its final chunk"
    relayed = b"".join(chunks)
    assert reply.body.startswith(relayed)
    rest = reply.body[len(relayed):]
    errors = error_events(rest)
    assert len(errors) == 1, rest[:200]
    assert rest.startswith(b"data: {\"error\""), rest[:200]
    assert b"[DONE]" not in reply.body
    return errors[0]


async def test_ok_stream_relayed_byte_for_byte(unix_kit: FaultServer,
                                               start_gateway: StartGateway) -> None:
    gw = await start_gateway([("kit", unix_kit.url)])
    reply = await request(gw.unix, "POST", CHAT, body(stream=True))
    assert (reply.status, reply.complete) == (200, True)
    assert reply.body == b"".join(stream_chunks())
    assert reply.header("x-sluice-served-by") == "local:kit"


async def test_model_name_picks_the_fault(unix_kit: FaultServer,
                                          start_gateway: StartGateway) -> None:
    gw = await start_gateway([("kit", unix_kit.url)])
    reply = await request(gw.unix, "POST", CHAT, body(model="fault:status-503"))
    assert reply.status == 503
    assert reply.body == wire.compact(wire.error_body(503, "Service Unavailable"))
    assert unix_kit.requests[-1].fault == "status"


# ------------------------------------------------------------------ connection failures


async def test_refuse_is_502_connection_error(nursery: trio.Nursery,
                                              start_gateway: StartGateway) -> None:
    kit = await start_kit(nursery, "127.0.0.1:0", default="refuse")
    gw = await start_gateway([])
    inject_backend(gw, "kit", kit.url, [MODEL])
    with trio.fail_after(5):
        reply = await request(gw.tcp, "POST", CHAT, body(stream=True))
    assert reply.status == 502
    assert error_of(reply)["code"] == "upstream_connection_error"
    assert kit.requests == []  # reset at accept: no request was ever read


async def test_reset_before_any_byte_is_502(tcp_kit: FaultServer,
                                            start_gateway: StartGateway) -> None:
    gw = await start_gateway([("kit", tcp_kit.url)])
    for stream in (True, False):
        with trio.fail_after(5):
            reply = await request(gw.tcp, "POST", CHAT, body(stream=stream), fault("reset"))
        assert reply.status == 502
        assert error_of(reply)["code"] == "upstream_connection_error"


async def test_reset_after_k_chunks_ends_with_one_error_event(
        tcp_kit: FaultServer, start_gateway: StartGateway) -> None:
    gw = await start_gateway([("kit", tcp_kit.url)])
    with trio.fail_after(5):
        reply = await request(gw.tcp, "POST", CHAT, body(stream=True), fault("reset-after;after=3"))
    err = cut_stream(reply, stream_chunks()[:3])
    assert err["code"] in ("upstream_connection_error", "upstream_protocol_error")


async def test_reset_after_by_model_name(tcp_kit: FaultServer,
                                         start_gateway: StartGateway) -> None:
    gw = await start_gateway([("kit", tcp_kit.url)])
    with trio.fail_after(5):
        reply = await request(gw.tcp, "POST", CHAT, body(stream=True, model="fault:reset-after-2"))
    cut_stream(reply, stream_chunks()[:2])


@pytest.mark.parametrize("stream", [True, False])
async def test_close_after_head_is_502_connection_error(
        unix_kit: FaultServer, start_gateway: StartGateway, stream: bool) -> None:
    gw = await start_gateway([("kit", unix_kit.url)])
    reply = await request(gw.unix, "POST", CHAT, body(stream=stream), fault("close-after-head"))
    # SPEC §7.4: closed before the first body chunk, also after a 200 head, is a
    # connection error.
    assert reply.status == 502
    assert error_of(reply)["code"] == "upstream_connection_error"


async def test_close_after_k_chunks(unix_kit: FaultServer, start_gateway: StartGateway) -> None:
    gw = await start_gateway([("kit", unix_kit.url)])
    reply = await request(gw.unix, "POST", CHAT, body(stream=True), fault("close-after;after=2"))
    cut_stream(reply, stream_chunks()[:2])


# ------------------------------------------------------------------ timeouts (MockClock)


async def test_never_answer_is_504_at_first_byte(autojump_clock: trio.testing.MockClock,
                                                 unix_kit: FaultServer,
                                                 start_gateway: StartGateway) -> None:
    gw = await start_gateway([("kit", unix_kit.url)], first_byte=7, stream_total=100)
    start = trio.current_time()
    reply = await request(gw.unix, "POST", CHAT, body(stream=True), fault("never-answer"))
    assert reply.status == 504
    assert 7 - 1e-6 <= trio.current_time() - start < 7.5
    err = error_of(reply)
    assert err["code"] == "upstream_timeout"
    assert "timeouts.request.streaming.first_byte" in str(err["message"])


async def test_never_answer_as_server_default(autojump_clock: trio.testing.MockClock,
                                              nursery: trio.Nursery, short_tmp: Path,
                                              start_gateway: StartGateway) -> None:
    kit = await start_kit(nursery, f"unix:{short_tmp / 'kit.sock'}", default="never-answer")
    gw = await start_gateway([], standard_total=9)
    inject_backend(gw, "kit", kit.url, [MODEL])
    start = trio.current_time()
    reply = await request(gw.unix, "POST", CHAT, body())
    assert reply.status == 504
    assert 9 - 1e-6 <= trio.current_time() - start < 9.5
    assert "timeouts.request.standard.total" in str(error_of(reply)["message"])


async def test_stall_before_head_whole_answer_is_504_at_total(
        autojump_clock: trio.testing.MockClock, unix_kit: FaultServer,
        start_gateway: StartGateway) -> None:
    gw = await start_gateway([("kit", unix_kit.url)], standard_total=12)
    start = trio.current_time()
    reply = await request(gw.unix, "POST", CHAT, body(), fault("stall-head"))
    assert reply.status == 504
    assert 12 - 1e-6 <= trio.current_time() - start < 12.5


async def test_stall_head_for_a_while_then_answer(autojump_clock: trio.testing.MockClock,
                                                  unix_kit: FaultServer,
                                                  start_gateway: StartGateway) -> None:
    gw = await start_gateway([("kit", unix_kit.url)], first_byte=10)
    reply = await request(gw.unix, "POST", CHAT, body(stream=True), fault("stall-head;seconds=8"))
    assert (reply.status, reply.body) == (200, b"".join(stream_chunks()))


async def test_headers_then_silence_is_504_at_first_byte(
        autojump_clock: trio.testing.MockClock, unix_kit: FaultServer,
        start_gateway: StartGateway) -> None:
    # The answer commits with its first body chunk: a head alone commits nothing.
    gw = await start_gateway([("kit", unix_kit.url)], first_byte=5)
    start = trio.current_time()
    reply = await request(gw.unix, "POST", CHAT, body(stream=True), fault("silent-after-head"))
    assert reply.status == 504
    assert 5 - 1e-6 <= trio.current_time() - start < 5.5
    assert "first_byte" in str(error_of(reply)["message"])


async def test_stall_after_k_chunks_is_an_error_event_at_chunk_interval(
        autojump_clock: trio.testing.MockClock, unix_kit: FaultServer,
        start_gateway: StartGateway) -> None:
    gw = await start_gateway([("kit", unix_kit.url)], chunk_interval=3)
    start = trio.current_time()
    reply = await request(gw.unix, "POST", CHAT, body(stream=True), fault("stall-after;after=2"))
    assert 3 - 1e-6 <= trio.current_time() - start < 3.5
    err = cut_stream(reply, stream_chunks()[:2])
    assert err["code"] == "upstream_timeout"
    assert "timeouts.request.streaming.chunk_interval" in str(err["message"])


async def test_stall_mid_whole_answer_relays_nothing(autojump_clock: trio.testing.MockClock,
                                                     unix_kit: FaultServer,
                                                     start_gateway: StartGateway) -> None:
    gw = await start_gateway([("kit", unix_kit.url)], standard_total=6)
    reply = await request(gw.unix, "POST", CHAT, body(), fault("stall-after;after=2"))
    assert reply.status == 504
    assert error_of(reply)["code"] == "upstream_timeout"


async def test_slow_reader_gets_the_whole_body(autojump_clock: trio.testing.MockClock,
                                               unix_kit: FaultServer,
                                               start_gateway: StartGateway) -> None:
    gw = await start_gateway([("kit", unix_kit.url)])
    sent = body(stream=True, size=300_000)  # more than the socket buffers hold
    reply = await request(gw.unix, "POST", CHAT, sent, fault("slow-reader;bytes=512;delay=0.01"))
    assert (reply.status, reply.body) == (200, b"".join(stream_chunks()))
    assert unix_kit.requests[-1].body == sent


# ------------------------------------------------------------------ statuses


@pytest.mark.parametrize("code", [500, 502, 503])
async def test_5xx_relayed_as_sent(unix_kit: FaultServer, start_gateway: StartGateway,
                                   code: int) -> None:
    gw = await start_gateway([("kit", unix_kit.url)])
    reply = await request(gw.unix, "POST", CHAT, body(stream=True), fault(f"status;code={code}"))
    assert reply.status == code
    phrase = {500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}
    assert reply.body == wire.compact(wire.error_body(code, phrase[code]))
    assert reply.header("content-type") == "application/json; charset=utf-8"


async def test_429_relayed_with_retry_after(unix_kit: FaultServer,
                                            start_gateway: StartGateway) -> None:
    gw = await start_gateway([("kit", unix_kit.url)])
    reply = await request(gw.unix, "POST", CHAT, body(), fault("rate-limit;retry_after=12"))
    assert reply.status == 429
    assert reply.header("retry-after") == "12"
    assert reply.json()["error"]["type"] == "rate_limit_error"


async def test_loading_then_healthy(autojump_clock: trio.testing.MockClock,
                                    nursery: trio.Nursery, short_tmp: Path,
                                    start_gateway: StartGateway) -> None:
    kit = await start_kit(nursery, f"unix:{short_tmp / 'kit.sock'}", loading_seconds=20)
    gw = await start_gateway([("kit", kit.url)], interval=5, hc_timeout=2)
    reply = await request(gw.unix, "POST", CHAT, body(stream=True))
    assert reply.status == 503  # its model list answered 503: the model is not there yet
    await trio.sleep(30)  # loaded at 20 s; the next health check finds the model
    reply = await request(gw.unix, "POST", CHAT, body(stream=True))
    assert (reply.status, reply.body) == (200, b"".join(stream_chunks()))


async def test_loading_503_relayed(unix_kit: FaultServer, start_gateway: StartGateway) -> None:
    gw = await start_gateway([("kit", unix_kit.url)])
    reply = await request(gw.unix, "POST", CHAT, body(), fault("loading"))
    assert reply.status == 503
    assert reply.body == wire.compact(wire.LOADING)


# ------------------------------------------------------------------ framing


@pytest.mark.parametrize("spec", ["cl-and-te", "bad-chunk-size", "chunk-overrun"])
@pytest.mark.parametrize("stream", [True, False])
async def test_bad_framing_is_502_protocol_error(unix_kit: FaultServer,
                                                 start_gateway: StartGateway, spec: str,
                                                 stream: bool) -> None:
    gw = await start_gateway([("kit", unix_kit.url)])
    reply = await request(gw.unix, "POST", CHAT, body(stream=stream), fault(spec))
    assert reply.status == 502, reply.body[:300]
    assert error_of(reply)["code"] == "upstream_protocol_error"


@pytest.mark.parametrize("spec", ["bad-chunk-size;after=2", "chunk-overrun;after=2"])
async def test_bad_framing_mid_stream(unix_kit: FaultServer, start_gateway: StartGateway,
                                      spec: str) -> None:
    gw = await start_gateway([("kit", unix_kit.url)])
    reply = await request(gw.unix, "POST", CHAT, body(stream=True), fault(spec))
    err = cut_stream(reply, stream_chunks()[:2])
    assert err["code"] == "upstream_protocol_error"


async def test_in_band_error_event_relayed_byte_for_byte(unix_kit: FaultServer,
                                                         start_gateway: StartGateway) -> None:
    gw = await start_gateway([("kit", unix_kit.url)])
    reply = await request(gw.unix, "POST", CHAT, body(stream=True), fault("error-event"))
    expected = stream_chunks()[0] + wire.error_event("the model failed mid-stream")
    assert (reply.status, reply.complete, reply.body) == (200, True, expected)


async def test_one_mib_event_relayed_intact(unix_kit: FaultServer,
                                            start_gateway: StartGateway) -> None:
    gw = await start_gateway([("kit", unix_kit.url)])
    reply = await request(gw.unix, "POST", CHAT, body(stream=True), fault("big-event"))
    chunks = stream_chunks()
    big = wire.big_event(True, MODEL, 1024 * 1024)
    assert len(big) == 1024 * 1024
    assert (reply.status, reply.complete) == (200, True)
    assert reply.body == chunks[0] + big + b"".join(chunks[1:])
