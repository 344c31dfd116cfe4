"""The request log (SPEC §9.1): one entry per OpenAI-API request, fed by the hub, read by
``GET /api/v1/requests``; the request id on every answer; one access-log line per request.

The in-process tests run under the autojump clock (every hop a Unix socket), so times such
as the time to first byte are exact virtual seconds."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing

from protocol.request_record import RequestRecord, token_counts, usage_from_event, usage_in_body
from protocol.sse import SseObserver
from proxy.observe.hub import Hub
from proxy.observe.request_log import RequestLog
from tests.client import CHAT, Client, chat_body, read_events, request
from tests.conftest import RunningGateway, StartGateway, inject_backend
from tests.fakeupstream import (
    LLAMA_SSE_HEADERS,
    FakeUpstream,
    ReceivedRequest,
    ResponseWriter,
    close_mid_stream,
    json_completion,
    sse_events,
    sse_stream,
    stall_before_head,
    status,
)
from tests.test_forwarding import MODEL, pool

USAGE_EVENT = (b'data: {"choices":[],"id":"chatcmpl-fake","object":"chat.completion.chunk",'
               b'"usage":{"completion_tokens":3,"prompt_tokens":7,"total_tokens":10}}\n\n')


# ------------------------------------------------------------------ the pure parts

def test_the_observer_counts_data_lines_however_the_reads_fall() -> None:
    stream = b"".join([*sse_events(4)[:-1], USAGE_EVENT, b"data: [DONE]\n\n"])
    expected = stream.count(b"data:")
    for size in (1, 2, 3, 5, 7, 64, len(stream)):
        observer = SseObserver()
        for i in range(0, len(stream), size):
            observer.see(stream[i:i + size])
        assert observer.events == expected, size
        assert usage_from_event(observer.usage_line) == {
            "completion_tokens": 3, "prompt_tokens": 7, "total_tokens": 10}, size


def test_the_observer_at_random_read_boundaries() -> None:
    import random

    stream = b"".join([b": comment\n\n", *sse_events(6)[:-1], USAGE_EVENT,
                       b"data: [DONE]\n\n"])
    rng = random.Random(12)
    for _ in range(300):
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(1, 40)))
        observer = SseObserver()
        for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
            observer.see(stream[a:b])
        assert observer.events == 8, cuts
        assert token_counts(usage_from_event(observer.usage_line)) == (7, 3), cuts
        assert observer.ended


TIMINGS_EVENT = (b'data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],'
                 b'"object":"chat.completion.chunk","timings":{"cache_n":222,"prompt_n":1}}\n\n')


def test_the_observer_keeps_llamas_timings_line_however_the_reads_fall() -> None:
    """SPEC §15: a stream without include_usage says what it reused only in llama.cpp's
    timings (its finish chunk); the observer keeps that line, split or not."""
    from protocol.request_record import cached_tokens

    stream = b"".join([*sse_events(3)[:-1], TIMINGS_EVENT, b"data: [DONE]\n\n"])
    for size in (1, 3, 7, 64, len(stream)):
        observer = SseObserver()
        for i in range(0, len(stream), size):
            observer.see(stream[i:i + size])
        assert observer.usage_line is None, size
        assert observer.timings_line == TIMINGS_EVENT.rstrip(b"\n"), size
        assert cached_tokens(None, observer.timings_line) == 222, size


def test_the_observer_sees_through_chunk_framing() -> None:
    # A chunked body forwarded verbatim: each chunk's size line ends in LF.
    observer = SseObserver()
    for event in [*sse_events(3)[:-1], USAGE_EVENT]:
        observer.see(b"%x\r\n" % len(event) + event + b"\r\n")
    assert observer.events == 4
    assert token_counts(usage_from_event(observer.usage_line)) == (7, 3)


def test_usage_null_chunks_and_a_data_word_in_content_are_not_counted() -> None:
    observer = SseObserver()
    observer.see(b'data: {"choices":[{"delta":{"content":"data: x\\ndata:"}}],"usage":null}\n\n')
    observer.see(b": keep-alive comment\n\n")
    assert observer.events == 1
    assert usage_from_event(observer.usage_line) is None


def test_usage_of_a_whole_answer_is_found_by_key() -> None:
    body = (b'{"choices":[{"message":{"content":"the \\"usage\\": {\\"x\\": 1} text"}}],'
            b'"usage": {"prompt_tokens": 5, "completion_tokens": 1},"timings":{"n":1}}')
    assert usage_in_body(body) == {"prompt_tokens": 5, "completion_tokens": 1}
    assert usage_in_body(b'{"usage":null}') is None
    assert usage_in_body(b'{"usage":{"prompt_tokens":') is None  # cut: not parsed
    assert usage_in_body(b"not json at all") is None
    responses_api = (b'data: {"type":"response.completed","response":{"usage":'
                     b'{"input_tokens":4,"output_tokens":9}}}')
    assert token_counts(usage_from_event(responses_api)) == (4, 9)


def _record(n: int, model: str = "m", served_by: str | None = "local:a") -> RequestRecord:
    return RequestRecord(
        id=f"x-{n}", started_at=1_700_000_000.5, method="POST", path=CHAT, model=model,
        stream=False, transport="unix", served_by=served_by, status=200, outcome="success",
        failover=None, ttfb=0.01, duration=0.02, bytes_out=10, events=None, usage=None,
        error=None)


def test_the_ring_keeps_the_newest_and_filters() -> None:
    hub = Hub()
    log = RequestLog(3)
    log.attach(hub)
    for n in range(5):
        hub.publish("request", _record(n, model="a" if n % 2 else "b"))
    assert [e["id"] for e in log.query()] == ["x-4", "x-3", "x-2"]
    assert [e["id"] for e in log.query(model="a")] == ["x-3"]
    assert [e["id"] for e in log.query(limit=1)] == ["x-4"]
    assert log.query(served_by="node:zz") == []
    log.resize(1)
    assert [e["id"] for e in log.query()] == ["x-4"]
    log.resize(0)
    hub.publish("request", _record(9))
    assert log.query() == []
    entry = _record(1).to_json()
    assert entry["startedAt"] == "2023-11-14T22:13:20.500Z"
    assert set(entry) == {"id", "startedAt", "method", "path", "model", "servedModel", "stream",
                          "transport",
                          "servedBy", "status", "outcome", "failover", "ttfbMs", "ttftMs",
                          "durationMs",
                          "bytesOut", "events", "usage", "error", "loadMs", "cachedTokens",
                          "affinity", "queueMs", "priority", "translated", "usageEstimated"}
    assert (entry["translated"], entry["usageEstimated"]) == (None, False)


# ------------------------------------------------------------------ a real gateway

async def entries(gw: RunningGateway, query: str = "") -> list[dict[str, Any]]:
    reply = await request(gw.unix, "GET", "/api/v1/requests" + query)
    assert reply.status == 200, reply.body
    found: list[dict[str, Any]] = reply.json()["requests"]
    return found


def slow_head(delay: float, then: Any) -> Any:
    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        await trio.sleep(delay)
        await then(req, w)

    return handler


async def local_gateway(nursery: trio.Nursery, short_tmp: Any, start_gateway: StartGateway,
                        **options: Any) -> tuple[RunningGateway, FakeUpstream]:
    up = FakeUpstream(models=[MODEL], unix_path=str(short_tmp / "local.sock"))
    await nursery.start(up.serve)
    gw = await start_gateway([("mine", up.url)], **options)
    return gw, up


async def test_local_whole_and_streamed_answers(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway, caplog: pytest.LogCaptureFixture) -> None:
    gw, up = await local_gateway(nursery, short_tmp, start_gateway)
    up.on("POST", CHAT, slow_head(1.5, json_completion("hello")))
    caplog.set_level(logging.INFO, logger="sluice.access")
    whole = await request(gw.unix, "POST", CHAT, chat_body(MODEL),
                          headers=[("authorization", "Bearer client-secret-1")])
    assert whole.status == 200
    rid = whole.header("x-sluice-request-id")
    assert rid
    events = [*sse_events(4)[:-1], USAGE_EVENT, b"data: [DONE]\n\n"]
    up.on("POST", CHAT, slow_head(2.0, sse_stream(events, gap=0.25)))
    streamed = await request(gw.unix, "POST", CHAT, chat_body(MODEL, stream=True))
    assert streamed.status == 200
    assert streamed.header("x-sluice-request-id") not in (None, rid)

    newest, oldest = await entries(gw)
    assert oldest["id"] == rid
    assert (oldest["method"], oldest["path"], oldest["model"], oldest["stream"]) == (
        "POST", CHAT, MODEL, False)
    assert oldest["servedModel"] == MODEL  # no alias: the model asked for
    assert (oldest["transport"], oldest["servedBy"], oldest["status"], oldest["outcome"]) == (
        "unix", "local:mine", 200, "success")
    assert oldest["failover"] is None
    assert oldest["error"] is None
    assert oldest["events"] is None
    assert oldest["usage"] == {"completion_tokens": 1, "prompt_tokens": 5, "total_tokens": 6}
    assert 1500 <= oldest["ttfbMs"] < 1510
    assert oldest["durationMs"] >= oldest["ttfbMs"]
    head_size = oldest["bytesOut"] - len(whole.body)  # the head is counted too
    assert 100 < head_size < 1000

    assert newest["stream"] is True
    assert newest["outcome"] == "success"
    assert newest["events"] == 6  # four chunks, the usage chunk, [DONE]
    assert newest["usage"] == {"completion_tokens": 3, "prompt_tokens": 7, "total_tokens": 10}
    assert 2000 <= newest["ttfbMs"] < 2010  # the head waits for the first chunk
    assert 2000 + 5 * 250 <= newest["durationMs"] < 3260

    lines = [r.getMessage() for r in caplog.records if r.name == "sluice.access"]
    mine = [line for line in lines if line.startswith(rid)]
    assert len(mine) == 1
    assert "POST /v1/chat/completions" in mine[0]
    assert "status=200" in mine[0]
    assert "served_by=local:mine" in mine[0]
    assert not any("client-secret-1" in line for line in lines)


async def test_refusals_errors_and_timeouts(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    gw, up = await local_gateway(nursery, short_tmp, start_gateway, first_byte=5.0)
    up.on("POST", CHAT, status(400))
    assert (await request(gw.unix, "POST", CHAT, chat_body(MODEL))).status == 400
    assert (await request(gw.unix, "POST", CHAT, chat_body("nobody-has-it"))).status == 503
    assert (await request(gw.unix, "POST", CHAT, b'{"messages": []}')).status == 400
    up.on("POST", CHAT, stall_before_head())
    timed_out = await request(gw.unix, "POST", CHAT, chat_body(MODEL, stream=True))
    assert timed_out.status == 504
    up.on("POST", CHAT, status(500))
    assert (await request(gw.unix, "POST", CHAT, chat_body(MODEL))).status == 500

    five_hundred, timeout, no_model, unknown, upstream_4xx = await entries(gw)
    assert (upstream_4xx["status"], upstream_4xx["outcome"], upstream_4xx["servedBy"]) == (
        400, "refused", "local:mine")
    assert (unknown["status"], unknown["outcome"], unknown["servedBy"], unknown["model"],
            unknown["error"]) == (503, "refused", None, "nobody-has-it", "model_not_available")
    assert (no_model["status"], no_model["outcome"], no_model["model"]) == (400, "refused", None)
    assert (unknown["servedModel"], no_model["servedModel"]) == (None, None)  # nothing served
    assert (timeout["status"], timeout["outcome"], timeout["error"]) == (
        504, "failure", "upstream_timeout")
    assert 5000 <= timeout["durationMs"] < 5010
    assert (five_hundred["status"], five_hundred["outcome"]) == (500, "failure")


async def test_an_aborted_stream_and_the_tcp_transport(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    gw, up = await local_gateway(nursery, short_tmp, start_gateway)
    up.on("POST", CHAT, sse_stream(sse_events(50), gap=1.0))
    client = await Client.open(gw.unix)
    await client.send_request("POST", CHAT, chat_body(MODEL, stream=True))
    await client.read_head()
    await read_events(client, 3)
    await client.aclose()
    await trio.sleep(1)
    up.on("POST", CHAT, json_completion())
    assert (await request(gw.tcp, "POST", CHAT, chat_body(MODEL))).status == 200
    over_tcp, aborted = await entries(gw)
    assert (aborted["status"], aborted["outcome"], aborted["stream"]) == (200, "aborted", True)
    assert aborted["events"] >= 3
    assert over_tcp["transport"] == "tcp"


async def test_a_stream_the_upstream_cut_after_commit_is_a_failure(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway, caplog: pytest.LogCaptureFixture) -> None:
    gw, up = await local_gateway(nursery, short_tmp, start_gateway)
    caplog.set_level(logging.INFO, logger="sluice.access")
    up.on("POST", CHAT, close_mid_stream(2))
    client = await Client.open(gw.unix)
    await client.send_request("POST", CHAT, chat_body(MODEL, stream=True))
    assert (await client.read_head()).status_code == 200
    await read_events(client, 2)
    await trio.sleep(1)
    await client.aclose()
    (cut,) = await entries(gw)
    assert (cut["status"], cut["outcome"], cut["stream"]) == (200, "failure", True)
    (line,) = [r.getMessage() for r in caplog.records
               if r.name == "sluice.access" and r.getMessage().startswith(cut["id"])]
    assert " status=200 served_by=local:mine " in line, line
    assert line.endswith(" outcome=failure"), line


async def test_failover_names_the_node_that_failed_first(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    gw, _ = await pool(nursery, start_gateway, short_tmp, status(500), json_completion("b"))
    reply = await request(gw.unix, "POST", CHAT, chat_body(MODEL))
    assert reply.status == 200
    (entry,) = await entries(gw)
    assert (entry["servedBy"], entry["failover"], entry["outcome"]) == (
        "node:node-b", "node-a", "success")


async def test_filters_limits_and_the_live_size(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    gw, up = await local_gateway(nursery, short_tmp, start_gateway)
    up.on("POST", CHAT, json_completion())
    inject_backend(gw, "other", up.url, ["second-model"])
    for model in (MODEL, "second-model", MODEL):
        assert (await request(gw.unix, "POST", CHAT, chat_body(model))).status == 200
    assert len(await entries(gw)) == 3
    assert [e["model"] for e in await entries(gw, f"?model={MODEL}")] == [MODEL, MODEL]
    assert [e["servedBy"] for e in await entries(gw, "?servedBy=local:other")] == [
        "local:other"]
    assert len(await entries(gw, "?limit=2")) == 2
    for bad in ("?limit=0", "?limit=x", "?limit=-1", "?served_by=local:mine"):
        reply = await request(gw.unix, "GET", "/api/v1/requests" + bad)
        assert reply.status == 400, bad
        assert reply.json()["error"]["param"] in ("limit", "served_by")
    # Own endpoints get an id but no entry.
    health = await request(gw.unix, "GET", "/health")
    assert health.header("x-sluice-request-id")
    missing = await request(gw.unix, "GET", "/nowhere")
    assert missing.status == 404
    assert missing.header("x-sluice-request-id")
    first, second = (int(r.header("x-sluice-request-id").rsplit("-", 1)[1])  # type: ignore[union-attr]
                     for r in (health, missing))
    assert second == first + 1  # one id per request, none for an idle wait
    assert len(await entries(gw)) == 3
    settings = gw.gateway.settings
    await settings.edit(lambda cfg: _with_log_size(cfg, 1))
    assert len(await entries(gw)) == 1
    await settings.edit(lambda cfg: _with_log_size(cfg, 0))
    assert (await request(gw.unix, "POST", CHAT, chat_body(MODEL))).status == 200
    assert await entries(gw) == []


def _with_log_size(cfg: Any, size: int) -> Any:
    import attrs

    return attrs.evolve(cfg, observability=attrs.evolve(cfg.observability,
                                                        request_log_size=size))


async def test_a_client_that_leaves_at_done_got_the_whole_answer(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, short_tmp: Any,
        start_gateway: StartGateway) -> None:
    """The OpenAI SDKs close the response at ``data: [DONE]``, before the body's last chunk:
    that is a success (for the log and the routing stats), not an abort."""
    gw, up = await local_gateway(nursery, short_tmp, start_gateway)

    def answer(pause_before: int) -> Any:
        """The SSE events and [DONE], with a 5 s pause before event ``pause_before`` (the
        terminating chunk is the last "event" here)."""
        async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
            await w.head(200, LLAMA_SSE_HEADERS)
            for i, event in enumerate(sse_events(3)):
                if i == pause_before:
                    await trio.sleep(5)
                await w.chunk(event)
            if pause_before >= 4:
                await trio.sleep(5)  # the terminating chunk comes late
            await w.end()

        return handler

    # After [DONE] (the last chunk comes 5 s later), then before it (the client leaves
    # while the upstream pauses before its third event).
    for pause_before, leave_at in ((4, 4), (2, 2)):
        up.on("POST", CHAT, answer(pause_before))
        client = await Client.open(gw.unix)
        await client.send_request("POST", CHAT, chat_body(MODEL, stream=True))
        await client.read_head()
        await read_events(client, leave_at)
        await client.aclose()
        await trio.sleep(10)
    early, at_done = await entries(gw)
    assert (at_done["outcome"], at_done["events"]) == ("success", 4)
    assert early["outcome"] == "aborted"
    local = (await request(gw.unix, "GET", "/api/v1/pool/routing-stats")).json()["local"]
    assert (local["successCount"], local["abortedCount"]) == (1, 1)
