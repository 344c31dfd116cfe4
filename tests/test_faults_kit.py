"""The fault-injection upstream itself (tools/faults), hit directly: once as a real process
started by scripts/faulty-upstream, then in-process for what the gateway tests cannot see."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from tests.client import CHAT, Client, request
from tests.faultkit import body, fault, start_kit, stream_chunks
from tests.rawhttp import until_close
from tools.faults import wire
from tools.faults.behaviours import FaultSpec
from tools.faults.specs import parse_spec, spec_from_model


def test_specs() -> None:
    assert parse_spec("reset-after;after=3") == FaultSpec("reset-after", {"after": 3})
    assert spec_from_model("fault:reset-after-3") == FaultSpec("reset-after", {"after": 3})
    assert spec_from_model("fault:status-502") == FaultSpec("status", {"code": 502})
    assert spec_from_model("llama") is None
    assert parse_spec("stall-after;after=2;seconds=1.5").get("seconds") == 1.5
    assert parse_spec("ok").get("tokens") == 4
    for bad, why in [("nope", "unknown fault 'nope'"), ("reset-3", "takes no number"),
                     ("status;colour=1", "no parameter 'colour'"),
                     ("status;code=x", "code must be a number")]:
        with pytest.raises(ValueError, match=why):
            parse_spec(bad)


async def test_unknown_fault_is_400(nursery: trio.Nursery) -> None:
    kit = await start_kit(nursery, "127.0.0.1:0")
    reply = await request(kit.url, "POST", CHAT, body(), fault("nope"))
    assert reply.status == 400
    assert "unknown fault 'nope'" in reply.json()["error"]["message"]


async def test_loading_for_the_first_requests(nursery: trio.Nursery, short_tmp: Path) -> None:
    kit = await start_kit(nursery, f"unix:{short_tmp / 'k.sock'}", loading_requests=3)
    for path in ("/health", "/v1/models"):
        reply = await request(kit.url, "GET", path)
        assert (reply.status, reply.json()) == (503, wire.LOADING)
    reply = await request(kit.url, "POST", CHAT, body())
    assert reply.status == 503
    reply = await request(kit.url, "GET", "/health")
    assert (reply.status, reply.json()) == (200, {"status": "ok"})


async def test_loading_for_a_while(autojump_clock: trio.testing.MockClock,
                                   nursery: trio.Nursery, short_tmp: Path) -> None:
    kit = await start_kit(nursery, f"unix:{short_tmp / 'k.sock'}", loading_seconds=10)
    assert (await request(kit.url, "GET", "/health")).status == 503
    await trio.sleep(10)
    assert (await request(kit.url, "GET", "/health")).status == 200


async def test_keep_alive_for_whole_answers_close_after_a_stream(
        nursery: trio.Nursery, short_tmp: Path) -> None:
    kit = await start_kit(nursery, f"unix:{short_tmp / 'k.sock'}")
    client = await Client.open(kit.url)
    try:
        for _ in range(2):
            reply = await client.request("POST", CHAT, body())
            assert reply.json()["choices"][0]["message"]["content"] == "tok1 tok2 tok3 tok4 "
        reply = await client.request("POST", CHAT, body(stream=True))
        assert reply.body == b"".join(stream_chunks())
        assert await client.stream.receive_some(10) == b""  # closed, as llama.cpp does
    finally:
        await client.aclose()
    assert kit.connections == 1


async def test_refuse_count_resets_the_next_connections(nursery: trio.Nursery) -> None:
    kit = await start_kit(nursery, "127.0.0.1:0")
    for spec in ("refuse;count=1", None):
        with pytest.raises(trio.BrokenResourceError):
            await request(kit.url, "POST", CHAT, body(), fault(spec) if spec else None)
    assert (await request(kit.url, "POST", CHAT, body())).status == 200
    assert len(kit.requests) == 2  # the refused connection was never read


async def test_framing_faults_on_the_wire(nursery: trio.Nursery, short_tmp: Path) -> None:
    kit = await start_kit(nursery, f"unix:{short_tmp / 'k.sock'}")
    raw = await until_close(kit.url, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"x-fault: cl-and-te\r\nContent-Length: 2\r\n\r\n{}")
    head = raw.split(b"\r\n\r\n", 1)[0].lower()
    assert b"transfer-encoding: chunked" in head
    assert b"content-length: " in head
    raw = await until_close(kit.url, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"x-fault: chunk-overrun\r\nContent-Length: 2\r\n\r\n{}")
    assert raw.endswith(b"\r\n\r\n" + b"%x\r\n" % (len(b'data: {"overrun":true}\n\n') - 8)
                        + b'data: {"overrun":true}\n\n\r\n')


async def test_slow_reader_reads_slowly(autojump_clock: trio.testing.MockClock,
                                        nursery: trio.Nursery, short_tmp: Path) -> None:
    kit = await start_kit(nursery, f"unix:{short_tmp / 'k.sock'}")
    sent = body(size=1000)
    start = trio.current_time()
    reply = await request(kit.url, "POST", CHAT, sent, fault("slow-reader;bytes=100;delay=1"))
    assert reply.status == 200
    assert trio.current_time() - start >= len(sent) // 100 - 1  # one read a second
    assert kit.requests[-1].body == sent
