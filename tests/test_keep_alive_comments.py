"""A long prompt behind keep-alive comments (SPEC §3.2, issue 31): llama.cpp sends its SSE
head at once and a ``:`` comment every ~30 s while it processes a long prompt. The comments
are relayed as they come, but ``first_byte`` bounds the wait for the first event with data,
and ``chunk_interval`` only the gaps after it; ``ttftMs`` is that first event. A stream that
failed after nothing but comments may still fail over, the next node's events following the
comments. Every dialect: Chat Completions, Anthropic Messages, the Responses API and the
Ollama translation.

All under the autojump clock with the default timeouts (first_byte 120 s, chunk_interval
30 s) unless a test says otherwise; every hop is a Unix socket."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing

from tests.client import CHAT, Reply, chat_body, request
from tests.conftest import RunningGateway, StartGateway
from tests.fakenode import start_node
from tests.fakeupstream import (
    KEEP_ALIVE,
    LLAMA_SSE_HEADERS,
    FakeUpstream,
    ReceivedRequest,
    ResponseWriter,
    prefill_stream,
    sse_events,
    sse_stream,
    status,
)
from tests.test_dialects import anthropic_stream, responses_stream
from tests.test_forwarding import MODEL, pool, stats

MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"
DIALECTS = [(CHAT, sse_events(3)), (MESSAGES, anthropic_stream("a b")),
            (RESPONSES, responses_stream())]
FIRST_BYTE = "timeouts.request.streaming.first_byte (120s)"


def last_event(reply: Reply) -> tuple[str | None, dict[str, Any]]:
    """The name and data of the last SSE event of a stream cut with our error event."""
    assert reply.status == 200
    assert not reply.complete, "a cut stream ends without its final chunk"
    block = reply.body.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    name = None
    data = None
    for line in block.split(b"\n"):
        if line.startswith(b"event: "):
            name = line[7:].decode()
        elif line.startswith(b"data: "):
            data = json.loads(line[6:])
    assert isinstance(data, dict), block
    return name, data


def error_message(path: str, reply: Reply) -> tuple[str, str]:
    """The code (or Anthropic's type) and the message of the error event ending ``reply``,
    checked to be in the shape of ``path``'s family."""
    name, data = last_event(reply)
    if path == CHAT:
        assert name is None
        return data["error"]["code"], data["error"]["message"]
    assert name == "error"
    assert data["type"] == "error"
    if path == MESSAGES:
        return data["error"]["type"], data["error"]["message"]
    return data["code"], data["message"]


async def last_request(gw: RunningGateway) -> dict[str, Any]:
    reply = await request(gw.unix, "GET", "/api/v1/requests?limit=1")
    entry: dict[str, Any] = reply.json()["requests"][0]
    return entry


# ---------------------------------------------------------------- first_byte, chunk_interval


@pytest.mark.parametrize(("path", "events"), DIALECTS)
async def test_a_100s_prefill_with_comments_every_30s_passes_with_the_defaults(
        autojump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream,
        start_gateway: StartGateway, path: str, events: list[bytes]) -> None:
    unix_upstream.on("POST", path, prefill_stream(100, events))
    gw = await start_gateway([("fake", unix_upstream.url)])
    reply = await request(gw.unix, "POST", path, chat_body(stream=True))
    assert (reply.status, reply.complete) == (200, True)
    assert reply.body == KEEP_ALIVE * 3 + b"".join(events)  # byte for byte
    assert reply.reads[:3] == [KEEP_ALIVE] * 3  # each comment relayed as it came
    entry = await last_request(gw)
    assert (entry["outcome"], entry["error"]) == ("success", None)
    assert entry["ttfbMs"] == pytest.approx(30_000, abs=1)  # the first byte: a comment
    assert entry["ttftMs"] == pytest.approx(100_000, abs=1)  # the first event with data
    assert entry["events"] == sum(e.count(b"data:") for e in events)


@pytest.mark.parametrize(("path", "events"), DIALECTS)
async def test_a_130s_prefill_gets_the_first_byte_error_event(
        autojump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream,
        start_gateway: StartGateway, path: str, events: list[bytes]) -> None:
    unix_upstream.on("POST", path, prefill_stream(130, events))
    gw = await start_gateway([("fake", unix_upstream.url)])
    start = trio.current_time()
    reply = await request(gw.unix, "POST", path, chat_body(stream=True))
    took = trio.current_time() - start
    assert 120 - 1e-6 <= took < 120.01  # from the request, whatever came before
    code, message = error_message(path, reply)
    assert code == ("api_error" if path == MESSAGES else "upstream_timeout")
    assert f"the upstream sent no event with data within {FIRST_BYTE}" in message
    comments = reply.body.rstrip(b"\n").rsplit(b"\n\n", 1)[0] + b"\n\n"  # before the error
    assert comments in (KEEP_ALIVE * 3, KEEP_ALIVE * 4)  # the 4th, at 120 s, may be in time
    entry = await last_request(gw)
    assert (entry["outcome"], entry["error"], entry["events"]) == (
        "failure", "upstream_timeout", 0)
    assert entry["ttfbMs"] == pytest.approx(30_000, abs=1)
    assert entry["ttftMs"] is None


async def test_a_31s_gap_after_the_first_data_event_still_fails(
        autojump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream,
        start_gateway: StartGateway) -> None:
    events = sse_events(3)
    unix_upstream.on("POST", CHAT, prefill_stream(100, events, gaps=(31,)))
    gw = await start_gateway([("fake", unix_upstream.url)])
    start = trio.current_time()
    reply = await request(gw.unix, "POST", CHAT, chat_body(stream=True))
    assert trio.current_time() - start == pytest.approx(130, abs=0.01)
    assert reply.body.startswith(KEEP_ALIVE * 3 + events[0])
    code, message = error_message(CHAT, reply)
    assert code == "upstream_timeout"
    assert message.endswith("the upstream stalled within "
                            "timeouts.request.streaming.chunk_interval (30s)")
    assert (await last_request(gw))["ttftMs"] == pytest.approx(100_000, abs=1)


async def test_after_the_first_data_event_comments_count_as_chunks(
        autojump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream,
        start_gateway: StartGateway) -> None:
    """A server that pauses generating (a tool call, another slot's prompt) but sends
    comments is alive: 100 s without data after the first event, a comment every 25 s."""
    events = sse_events(3)

    async def pausing(req: ReceivedRequest, w: ResponseWriter) -> None:
        await w.head(200, LLAMA_SSE_HEADERS)
        await w.chunk(events[0])
        for _ in range(4):
            await trio.sleep(25)
            await w.chunk(KEEP_ALIVE)
        for event in events[1:]:
            await w.chunk(event)
        await w.end()

    unix_upstream.on("POST", CHAT, pausing)
    gw = await start_gateway([("fake", unix_upstream.url)])
    reply = await request(gw.unix, "POST", CHAT, chat_body(stream=True))
    assert (reply.status, reply.complete) == (200, True)
    assert reply.body == events[0] + KEEP_ALIVE * 4 + b"".join(events[1:])
    entry = await last_request(gw)
    assert entry["ttfbMs"] == entry["ttftMs"]  # no comment before the first event


async def test_a_smaller_first_byte_is_not_reset_by_comments(
        autojump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream,
        start_gateway: StartGateway) -> None:
    """Comments every 5 s, first_byte 12 s: the error comes at 12 s, not 5 s after the
    last comment; and a comment in the same read as the first event changes nothing."""
    events = sse_events(2)
    unix_upstream.on("POST", CHAT, prefill_stream(20, events, every=5))
    gw = await start_gateway([("fake", unix_upstream.url)], first_byte=12, chunk_interval=3)
    start = trio.current_time()
    reply = await request(gw.unix, "POST", CHAT, chat_body(stream=True))
    assert trio.current_time() - start == pytest.approx(12, abs=0.01)
    assert error_message(CHAT, reply)[1].endswith(
        "within timeouts.request.streaming.first_byte (12s)")
    unix_upstream.on("POST", CHAT, sse_stream([KEEP_ALIVE + events[0], *events[1:]], gap=2))
    reply = await request(gw.unix, "POST", CHAT, chat_body(stream=True))
    assert (reply.status, reply.complete) == (200, True)
    entry = await last_request(gw)
    assert entry["ttfbMs"] == entry["ttftMs"]


async def test_ttft_reaches_the_metrics_and_the_routing_stats(
        autojump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream,
        start_gateway: StartGateway) -> None:
    """``sluice_time_to_first_token_seconds`` beside the first-byte histogram; the local
    backends' avgLatencyMs (what ``fastest`` ranks by) is the first data event of a
    stream, not the head or a comment."""
    unix_upstream.on("POST", CHAT, prefill_stream(70, sse_events(2)))
    gw = await start_gateway([("fake", unix_upstream.url)])
    reply = await request(gw.unix, "POST", CHAT, chat_body(stream=True))
    assert reply.complete
    text = (await request(gw.unix, "GET", "/metrics")).body.decode()
    labels = '{model="fake-model",served_by="local:fake",stream="true"}'
    assert f"sluice_time_to_first_token_seconds_count{labels} 1" in text
    assert f"sluice_time_to_first_token_seconds_sum{labels} 70.0" in text
    assert f"sluice_time_to_first_byte_seconds_sum{labels} 30.0" in text
    local = (await request(gw.unix, "GET", "/api/v1/pool/routing-stats")).json()["local"]
    assert local["avgLatencyMs"] == pytest.approx(70_000, abs=1)


# ------------------------------------------------------------------------------- Ollama


async def test_ollama_streams_wait_for_the_first_line_the_same_way(
        autojump_clock: trio.testing.MockClock, unix_upstream: FakeUpstream,
        start_gateway: StartGateway) -> None:
    """The translation drops comments (NDJSON has none): the head goes out with the
    first comment, the first line waits under first_byte."""
    body = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]})
    unix_upstream.on("POST", CHAT, prefill_stream(100, sse_events(3)))
    gw = await start_gateway([("fake", unix_upstream.url)])
    reply = await request(gw.unix, "POST", "/api/chat", body.encode())
    assert (reply.status, reply.complete) == (200, True)
    lines = [json.loads(line) for line in reply.body.splitlines()]
    assert [line["message"]["content"] for line in lines[:-1]] == ["tok1 "]
    assert lines[-1]["done"] is True
    # No llama.cpp timings in this answer: the prompt is read until the first data event.
    assert lines[-1]["prompt_eval_duration"] == pytest.approx(100e9, abs=1e6)
    entry = await last_request(gw)
    assert entry["ttftMs"] == pytest.approx(100_000, abs=1)

    unix_upstream.on("POST", CHAT, prefill_stream(130, sse_events(3)))
    start = trio.current_time()
    reply = await request(gw.unix, "POST", "/api/chat", body.encode())
    assert trio.current_time() - start == pytest.approx(120, abs=0.01)
    assert (reply.status, reply.complete) == (200, False)
    (line,) = [json.loads(line) for line in reply.body.splitlines()]
    assert line["error"].endswith(f"no event with data within {FIRST_BYTE}")


# ----------------------------------------------------------------------------- failover


async def test_a_node_that_sent_only_comments_fails_over(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    """node-a sends a comment, then its connection closes (a crash during the prefill):
    the client has read nothing but a comment, so node-b answers, its events after it."""
    events = sse_events(3, model=MODEL)
    gw, (a, b) = await pool(nursery, start_gateway, short_tmp,
                            prefill_stream(40, [], then=ResponseWriter.close),
                            sse_stream(events))
    reply = await request(gw.unix, "POST", CHAT, chat_body(MODEL, stream=True))
    assert (reply.status, reply.complete) == (200, True)
    assert reply.body == KEEP_ALIVE + b"".join(events)
    assert reply.header("x-sluice-served-by") == "node:node-a"  # the head was node-a's
    assert (len(a.requests_to(CHAT)), len(b.requests_to(CHAT))) == (1, 1)
    entry = await last_request(gw)
    assert (entry["servedBy"], entry["failover"], entry["outcome"]) == (
        "node:node-b", "node-a", "success")
    assert entry["ttftMs"] == pytest.approx(40_000, abs=1)
    assert (await stats(gw))["failovers"] == 1


async def test_a_failover_node_that_cannot_follow_the_comments_ends_the_stream(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    """node-b answers 503: its head cannot be sent after node-a's, so the stream ends with
    an error event naming it (no second head, no third node)."""
    gw, (_a, b) = await pool(nursery, start_gateway, short_tmp,
                             prefill_stream(40, [], then=ResponseWriter.close), status(503))
    reply = await request(gw.unix, "POST", CHAT, chat_body(MODEL, stream=True))
    assert reply.body.startswith(KEEP_ALIVE + b'data: {"error":')
    code, message = error_message(CHAT, reply)
    assert code == "upstream_protocol_error"
    assert "node:node-b answered 503" in message
    assert len(b.requests_to(CHAT)) == 1
    entry = await last_request(gw)
    assert (entry["servedBy"], entry["failover"], entry["outcome"]) == (
        "node:node-b", "node-a", "failure")


async def test_no_failover_once_a_data_event_was_relayed(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery,
        short_tmp: Any, start_gateway: StartGateway) -> None:
    events = sse_events(3, model=MODEL)

    async def one_event_then_close(w: ResponseWriter) -> None:
        await w.chunk(events[0])
        await w.close()

    gw, (_a, b) = await pool(nursery, start_gateway, short_tmp,
                             prefill_stream(40, [], then=one_event_then_close),
                             sse_stream(events))
    reply = await request(gw.unix, "POST", CHAT, chat_body(MODEL, stream=True))
    assert reply.body.startswith(KEEP_ALIVE + events[0] + b'data: {"error":')
    assert not reply.complete
    assert b.requests_to(CHAT) == []
    assert (await stats(gw))["failovers"] == 0


async def test_a_local_backend_never_fails_over(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        unix_upstream: FakeUpstream, start_gateway: StartGateway) -> None:
    """Only nodes fail over (SPEC §7.4): a local server that dies after a comment ends the
    stream with the error event, as before."""
    unix_upstream.on("POST", CHAT, prefill_stream(40, [], then=ResponseWriter.close))
    gw = await start_gateway([("fake", unix_upstream.url)])
    await start_node(nursery, str(short_tmp / "spare.sock"), ["fake-model"])
    reply = await request(gw.unix, "POST", CHAT, chat_body(stream=True))
    assert reply.body.startswith(KEEP_ALIVE + b'data: {"error":')
    assert (await last_request(gw))["failover"] is None


async def test_the_first_token_is_never_before_the_first_byte(
        unix_upstream: FakeUpstream, start_gateway: StartGateway) -> None:
    """In real time: ttft is taken once the first data event was sent, so a stream whose
    first bytes are its first event has ttftMs >= ttfbMs, never a hair below."""
    unix_upstream.on("POST", CHAT, sse_stream(sse_events(3)))
    gw = await start_gateway([("fake", unix_upstream.url)])
    for _ in range(5):
        reply = await request(gw.unix, "POST", CHAT, chat_body(stream=True))
        assert reply.complete
        entry = await last_request(gw)
        assert entry["ttftMs"] >= entry["ttfbMs"] > 0, entry
